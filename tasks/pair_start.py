"""The pair started in order, one group of operations (pyinfra's ``@deploy``) that the deploy's
start and restart (tasks/start.py) and the rollback (tasks/rollback.py) both add: the workers'
ranks first, then the head waits until every worker's container runs (its beacon answers over
the fabric), then the head's rank: the order of the head's own ordered restart
(files/sparkhost/pair.py) and of its start gate. The workers start in the stack's order
(``Stack.start_waves``): every worker at once, or (``last-to-first`` on three ranks and more) rank
N-1 started and seen running before rank N-2, ..., then rank 1, then the head. Every operation
exists on every host and acts only where its condition holds, so pyinfra's barrier orders them
across hosts."""

from collections.abc import Callable
from functools import partial

from pyinfra import host
from pyinfra.api import deploy

from sparkrig.bringup import starts_in_turn, worker_wait_args, worker_waves, workers_running
from sparkrig.config.model import Settings
from sparkrig.ordering import on_head, on_ranks, on_workers
from sparkrig.owned import unit_state_set
from sparkrig.rollback import Rollback

Condition = Callable[[], bool]


@deploy("Start the pair in order")
def pair_started_in_order(
    s: Settings,
    names: tuple[str, str, str],
    when: tuple[Condition, Condition, Condition],
    enabled: bool | None = None,
    ignore_errors: bool = False,
    watch: Rollback | None = None,
    after_workers: Callable[[], object] | None = None,
) -> None:
    """The workers' ranks started, every worker's container awaited from the head, the head's
    rank started; one worker at a time where the stack starts them in turn (``worker_waves``):
    each wave's start and wait named with its rank (``(rank 3 of 4)``).

    + s: this host's settings
    + names: the three operations' names (workers' start, the wait, the head's start)
    + when: the three operations' conditions (``_if``)
    + enabled: also enable (True) the rank units; None leaves that alone
    + ignore_errors: a failure does not stop the run (an upgrade: it decides the rollback)
    + watch: the rollback decision that watches the three operations (an upgrade)
    + after_workers: adds the operations that run between the workers' start and the wait
    """
    is_head = s.me.is_head
    workers, wait, head = names
    workers_if, wait_if, head_if = when
    waves = worker_waves(s)
    in_turn = starts_in_turn(s)  # one worker at a time (the stack's last-to-first on 3+ ranks)
    steps = []
    for n, wave in enumerate(host.loop(waves) if in_turn else waves):
        said = f" ({', '.join(f'rank {r}' for r in wave)} of {s.nnodes})" if in_turn else ""
        these = partial(on_ranks, wave, s.me.rank) if in_turn else partial(on_workers, is_head)
        steps.append(
            (
                "worker start",
                these(unit_state_set, name=workers + said, service=s.unit_name, running=True,
                      enabled=enabled, journal_on_failure=True, _if=workers_if,
                      _ignore_errors=ignore_errors),
            )
        )  # fmt: skip
        if n == 0 and after_workers is not None:
            after_workers()
        steps.append(
            (
                "workers' containers",
                on_head(is_head, workers_running, name=wait + said,
                        **worker_wait_args(s, wave if in_turn else None), _if=wait_if,
                        _ignore_errors=ignore_errors),
            )
        )  # fmt: skip
    steps.append(
        (
            "head start",
            on_head(is_head, unit_state_set, name=head, service=s.unit_name, running=True,
                    enabled=enabled, journal_on_failure=True, _if=head_if,
                    _ignore_errors=ignore_errors),
        )
    )  # fmt: skip
    for what, meta in steps:
        if watch is not None:
            watch.watch(what, meta)
