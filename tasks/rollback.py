"""The rollback: a failed upgrade's way back to the previous release, as one group of operations
(pyinfra's ``@deploy``) that tasks/verify.py adds on every host; each acts only once
``rollback()`` decided it (sparkrig/rollback.py): the previous release's files back on every rank,
then the pair restarted in order (workers, then the head, as tasks/start.py starts it), the
four gates (not the front's locked gate: the previous release may be from before the front,
whose site is then stood aside), and the run failed naming what failed and what serves now."""

from pyinfra.api import deploy
from pyinfra.operations import server

from sparkrig.bringup import api_serving, why_command
from sparkrig.config.model import Settings
from sparkrig.drain import drained, restore_command
from sparkrig.front import ROLLBACK_GATES, aside_for_older_release
from sparkrig.ordering import on_head
from sparkrig.owned import unit_state_set
from sparkrig.paths import paths
from sparkrig.release import ReleaseReport
from sparkrig.rollback import previous_gates_passed, previous_restored, rollback, upgrade_failed
from tasks.pair_start import pair_started_in_order
from tasks.pair_stop import pair_stopped_in_order


@deploy("Roll back to the previous release")
def roll_back(
    s: Settings, release_change: str, record: ReleaseReport, boot: list[str], gates: list[str]
) -> None:
    """The rollback path, present on every host (acting only once ``rollback()`` decided it):
    the previous release's files back on every rank, the helpers paused, every rank stopped,
    the workers started, their containers awaited, the head started, its boot awaited, the four
    gates, the helpers resumed, and the run failed naming what failed and what serves now. The
    same worker-then-head order as the deploy's ordered pair restart (tasks/stop.py,
    tasks/start.py)."""
    is_head = s.me.is_head
    rolls_back = rollback()
    serving = record.serving
    files = list(serving.files) if release_change and serving is not None else []
    previous = serving.label() if serving is not None else "none recorded"
    helpers = ["sparkrig-supervisor", "sparkrig-watchdog"]  # the watchdog's stop is a no-op if off

    previous_restored(
        name="Put the previous release's unit and lockfiles back",
        files=files,
        _if=lambda: bool(release_change) and rolls_back(),
    )
    on_head(
        is_head,
        server.shell,
        name="Stand the API front aside for a previous release from before it",
        commands=[aside_for_older_release(paths(s).rank_unit)],
        _if=lambda: bool(release_change) and rolls_back(),
    )
    pause = "Pause the head's supervisor and watchdog during the rollback"
    pair_stopped_in_order(
        s,
        helpers=[(pause, unit, rolls_back) for unit in helpers],
        ranks=("Stop every rank to roll back", rolls_back),
    )
    pair_started_in_order(
        s,
        names=(
            "Start the worker rank of the previous release",
            "Wait until every worker of the previous release runs",
            "Start the head rank of the previous release",
        ),
        when=(rolls_back, rolls_back, rolls_back),
    )
    on_head(
        is_head,
        api_serving,
        name="Wait for the previous release's API to finish booting",
        command=boot,
        explain=why_command(s),
        _if=rolls_back,
    )
    on_head(
        is_head,
        previous_gates_passed,
        name="Pass the four serving gates on the previous release",
        command=[*gates, "--only", ",".join(ROLLBACK_GATES)],  # argparse: the last --only wins
        _if=rolls_back,
    )
    on_head(
        is_head,
        server.shell,
        name="Put the pair back into the endpoint's balance on its previous release",
        commands=[restore_command(s)],
        _if=lambda: rolls_back() and drained(s.me.name),
    )
    on_head(
        is_head,
        unit_state_set,
        name="Resume the head's supervisor after the rollback",
        service="sparkrig-supervisor",
        running=True,
        _if=rolls_back,
    )
    upgrade_failed(
        name="Fail the run: the upgrade failed and the previous release serves again",
        release_change=release_change or "the release",
        previous=previous,
        _if=rolls_back,
    )
