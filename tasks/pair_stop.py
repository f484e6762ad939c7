"""The pair stopped in order, one group of operations (pyinfra's ``@deploy``) that the deploy's
ordered restart (tasks/service.py), the rollback (tasks/rollback.py) and uninstall.py all add:
first the head's helpers that would start a rank again (the supervisor restarts a stopped pair,
the watchdog restarts a rank it finds down), then every rank in one operation. ``systemctl stop``
returns once its rank is down and pyinfra starts nothing before every host's stop returned, so
the stop-together watch can only stop what is already stopping. Every operation exists on every
host and acts only where its condition holds, so pyinfra's barrier orders them across hosts."""

from collections.abc import Callable
from typing import Any

from pyinfra import host
from pyinfra.api import deploy

from sparkrig.ordering import on_head
from sparkrig.owned import unit_state_set
from sparkrig.settings import Settings

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
) -> None:
    """The head's helpers stopped, then every rank.

    + s: this host's settings
    + helpers: the head's units that would start a rank again, each its own operation
    + ranks: the name and condition of the one operation that stops every rank
    + enabled: also disable (False) the helpers and ranks; None leaves that alone
    """
    for name, unit, condition in host.loop(helpers):
        on_head(s.me.is_head, unit_state_set, name=name, service=unit, running=False,
                enabled=enabled, **_when(condition))  # fmt: skip
    name, condition = ranks
    unit_state_set(name=name, service=s.unit_name, running=False, enabled=enabled,
                   **_when(condition))  # fmt: skip
