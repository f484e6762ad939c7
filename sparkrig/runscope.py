"""One object per pyinfra run.

A deploy file runs once per host, so what must be decided once for the whole run (validated
settings, the pair-restart decision, the state reads, the pair secret) is kept here, keyed by the
object that identifies the run (pyinfra's state or inventory); a new run gets a new one. What
watches operations for a change or a failure over the run is one kind of object, ``Watch``.

pyinfra 3.10 loads the deploy file for every host at once, one greenlet each
(pyinfra_cli/util.py ``_parallel_load_hosts``), and a ``make`` that reads a host over SSH yields
to the others: without the per-name lock below, two hosts each made their own object (a rotated
pair secret came out different on the head and the worker, found in the lab).
"""

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from gevent.lock import RLock
from pyinfra.context import ctx_state

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


def changed(meta: Any) -> bool:
    """Did this operation (an OperationMeta) run and change something?"""
    return bool(meta.is_complete() and meta.did_change())


def failed(meta: Any) -> bool:
    """Did this operation (an OperationMeta) run and fail?"""
    return bool(meta.is_complete() and meta.did_error())


class Watch:
    """The one change-watcher: operations watched for the whole run under names (any host's),
    asked which changed something or failed so far. Each purpose gets one per run (``watch``):
    the pair-restart triggers, the rollback's watched operations, the host package's modules.

    + names: the names it accepts (empty: any)"""

    def __init__(self, names: Iterable[str] = ()) -> None:
        self.declared = tuple(names)
        self.metas: dict[str, list[Any]] = {name: [] for name in self.declared}

    def add(self, name: str, meta: Any) -> Any:
        """Watch ``meta`` (an OperationMeta) under ``name``; returns it."""
        if self.declared and name not in self.metas:
            raise KeyError(f"{name!r} is not one of {self.declared}")
        self.metas.setdefault(name, []).append(meta)
        return meta

    def changed(self, *names: str) -> list[str]:
        """The names (of ``names``, all when empty) whose operation changed something so far."""
        return [
            n for n, ms in self.metas.items() if (n in names or not names) and any(map(changed, ms))
        ]

    def failed(self) -> list[tuple[str, Any]]:
        """(name, meta) of every watched operation that failed so far."""
        return [(n, m) for n, ms in self.metas.items() for m in ms if failed(m)]


W = TypeVar("W", bound=Watch)


def watch(purpose: str, make: Callable[[], W]) -> W:
    """The current run's watcher for ``purpose`` (one for every host and phase)."""
    state = ctx_state.get()
    return once_per_run(purpose, state, make)
