"""One object per pyinfra run.

A deploy file runs once per host, so what must be decided once for the whole run (validated
settings, the pair-restart decision, the state reads, the pair secret) is kept here, keyed by the
object that identifies the run (pyinfra's state or inventory); a new run gets a new one.

pyinfra 3.10 loads the deploy file for every host at once, one greenlet each
(pyinfra_cli/util.py ``_parallel_load_hosts``), and a ``make`` that reads a host over SSH yields
to the others: without the per-name lock below, two hosts each made their own object (a rotated
pair secret came out different on the head and the worker, found in the lab).
"""

from collections.abc import Callable
from typing import Any, TypeVar

from gevent.lock import RLock

T = TypeVar("T")

_HELD: dict[str, tuple[Any, Any]] = {}  # name -> (the run's state or inventory, its object)
_LOCKS: dict[str, RLock] = {}  # name -> held while that object is made


def once_per_run(name: str, run: Any, make: Callable[[], T]) -> T:
    """The object ``make`` built for ``run`` under ``name``, made on first use in that run.

    + name: what the object is (one slot each)
    + run: pyinfra's state or inventory of the current run
    + make: builds the object; called once per run, even when it yields to other hosts' greenlets
    """
    with _LOCKS.setdefault(name, RLock()):
        held = _HELD.get(name)
        if held is None or held[0] is not run:
            held = (run, make())
            _HELD[name] = held
        return held[1]
