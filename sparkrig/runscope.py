"""One object per pyinfra run.

A deploy file runs once per host, so what must be decided once for the whole run (validated
settings, the pair-restart decision, the state reads, the pair secret) is kept here, keyed by the
object that identifies the run (pyinfra's state or inventory); a new run gets a new one.
"""

from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

_HELD: dict[str, tuple[Any, Any]] = {}  # name -> (the run's state or inventory, its object)


def once_per_run(name: str, run: Any, make: Callable[[], T]) -> T:
    """The object ``make`` built for ``run`` under ``name``, made on first use in that run.

    + name: what the object is (one slot each)
    + run: pyinfra's state or inventory of the current run
    + make: builds the object; called once per run
    """
    held = _HELD.get(name)
    if held is None or held[0] is not run:
        held = (run, make())
        _HELD[name] = held
    return held[1]
