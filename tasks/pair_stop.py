"""The pair stopped in order, one group of operations (pyinfra's ``@deploy``) that the deploy's
ordered restart (tasks/stop.py), the rollback (tasks/rollback.py) and uninstall.py all add:
first the head's helpers that would start a rank again (the supervisor restarts a stopped pair,
the watchdog restarts a rank it finds down), then the ranks in the running stack's stop order
(``Stack.stop_order``): ``together``, every rank in one operation (vllm-nvfp4); ``head-first``,
the head's rank, then the workers' (Entrpi's "always head down first", sfxnz's stop.sh);
``workers-first``, the reverse. ``systemctl stop`` returns once its rank is down and pyinfra
starts nothing before every host's stop returned, so the stop-together watch can only stop what
is already stopping. Every operation exists on every host and acts only where its condition
holds, so pyinfra's barrier orders them across hosts. A ``together`` stop is the one operation
it has always been (the default stack's plan is unchanged)."""

from collections.abc import Callable
from typing import Any

from pyinfra import host
from pyinfra.api import deploy

from sparkrig.config.model import Settings
from sparkrig.ordering import on_head, on_workers
from sparkrig.owned import unit_state_set
from sparkrig.stacks.base import StopOrder

Condition = Callable[[], bool]
# (operation name, unit, condition or None for always)
Helper = tuple[str, str, Condition | None]


def _when(condition: Condition | None) -> dict[str, Any]:
    return {} if condition is None else {"_if": condition}


@deploy("Stop the pair in order")
def pair_stopped_in_order(
    s: Settings,
    helpers: list[Helper],
    ranks: tuple[str, Condition | None],
    enabled: bool | None = None,
    order: StopOrder | None = None,
) -> None:
    """The head's helpers stopped, then the ranks in the stack's stop order.

    + s: this host's settings
    + helpers: the head's units that would start a rank again, each its own operation
    + ranks: the name and condition of the ranks' stop (one operation, or two for an order)
    + enabled: also disable (False) the helpers and ranks; None leaves that alone
    + order: the stop order; None: the stack of this run (``s.stack``), the same on every host
      so every host adds the same operations (release records are per host: a stack switch
      stops the old stack's ranks in the new stack's order, which orders both ranks' stops)
    """
    for name, unit, condition in host.loop(helpers):
        on_head(s.me.is_head, unit_state_set, name=name, service=unit, running=False,
                enabled=enabled, **_when(condition))  # fmt: skip
    name, condition = ranks
    order = order or s.stack.stop_order
    if order == "together":
        unit_state_set(name=name, service=s.unit_name, running=False, enabled=enabled,
                       **_when(condition))  # fmt: skip
        return
    first, then = (on_head, on_workers) if order == "head-first" else (on_workers, on_head)
    who = ("the head", "the workers") if order == "head-first" else ("the workers", "the head")
    first(s.me.is_head, unit_state_set, name=f"{name}: {who[0]} first", service=s.unit_name,
          running=False, enabled=enabled, **_when(condition))  # fmt: skip
    then(s.me.is_head, unit_state_set, name=f"{name}: then {who[1]}", service=s.unit_name,
         running=False, enabled=enabled, **_when(condition))  # fmt: skip
