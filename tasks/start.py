"""Phase 6, service, 6 of 7: the ordered start: worker(s) first, the head once every worker's
container runs (its beacon answers over the fabric), never a fixed sleep; then the supervisor and
the watchdog, paused for it (tasks/stop.py), kept running again. A run without the head
(`--limit worker`) never starts a worker's rank alone: the worker asks the head's supervisor for
the ordered restart, so the pair serves again at the end of the run."""

import shlex

from pyinfra import inventory
from pyinfra.operations import server

from sparkrig import hostpkg, hoststate
from sparkrig.config.inventory import current, for_inventory
from sparkrig.helperunits import keep_helper_running
from sparkrig.ordering import in_this_run, on_head, on_workers
from sparkrig.pairrestart import pair_restart
from sparkrig.paths import paths
from sparkrig.release import change
from sparkrig.rollback import rollback
from tasks.pair_start import pair_started_in_order

settings = current()
knobs = settings.knobs
host_paths = paths(settings)
is_head = settings.me.is_head
restart = pair_restart()
rank_active, _ = hoststate.read(settings).unit(settings.unit_name)
# During an upgrade a failed start does not stop the run: it decides the rollback
# (sparkrig/rollback.py, tasks/verify.py), and what would start the new release is skipped.
upgrading = bool(change(settings, hoststate.read(settings).release))
rolls_back = rollback()
# --limit worker: the head is not in this run (tasks/stop.py says so). The worker then leaves its
# rank to the head's supervisor (an authenticated request below).
head_in_run = in_this_run(settings.head.name)
pair_started_in_order(
    settings,
    names=(
        "Start the worker rank", "Wait until every worker's container runs", "Start the head rank"
    ),
    when=(
        lambda: (head_in_run or not (restart() or not rank_active)) and not rolls_back(),
        lambda: (restart() or not rank_active) and not rolls_back(),
        lambda: not rolls_back(),
    ),
    enabled=True,
    ignore_errors=upgrading,
    watch=rolls_back,
    after_workers=lambda: on_workers(
        is_head,
        server.shell,
        name="Ask the head's supervisor to restart the pair in order",
        commands=[
            shlex.join(
                [
                    *hostpkg.command(knobs.install_dir, "pair"), "request",
                    "--head", settings.dial(settings.head),
                    "--port", str(knobs.pair_port), "--agent-port", str(knobs.agent_port),
                    "--token-file", host_paths.pair_token, "--timeout", "900",
                ]
            )
        ],
        _if=lambda: not head_in_run and (restart() or not rank_active),
    ),
)  # fmt: skip

keep_helper_running(on_head, is_head, "sparkrig-supervisor")
if for_inventory(inventory)[settings.head.name].knobs.watchdog:  # a head-only knob
    keep_helper_running(on_head, is_head, "sparkrig-watchdog")
