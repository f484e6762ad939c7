"""One object per pyinfra run, or per pair of the run.

A deploy file runs once per host, so what must be decided once for the whole run (validated
settings, the state reads, the endpoint's API key and CA) is kept here, keyed by the object that
identifies the run (pyinfra's state or inventory); a new run gets a new one. An inventory may hold
several pairs behind one endpoint (host data ``pair``): what belongs to one pair (its pair-restart
decision, its rollback, its agents' secret, its bench figures) is kept once per pair of the run
(``once_per_pair``, ``watch``), so two pairs never share a decision nor trigger each other's. The
config tells this module which pair each host is in (``pairs_are``); it knows nothing else of
the config. What watches operations for a change or a failure is one kind of object, ``Watch``.

pyinfra 3.10 loads the deploy file for every host at once, one greenlet each
(pyinfra_cli/util.py ``_parallel_load_hosts``), and a ``make`` that reads a host over SSH yields
to the others: without the per-name lock below, two hosts each made their own object (a rotated
pair secret came out different on the head and the worker, found in the lab).
"""

from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from gevent.lock import RLock
from pyinfra.context import ctx_host, ctx_state

T = TypeVar("T")

_HELD: dict[str, tuple[Any, Any]] = {}  # name -> (the run's state or inventory, its object)
_LOCKS: dict[str, RLock] = {}  # name -> held while that object is made
# the run's inventory and its hosts' pairs (host name -> pair name, "" when one cluster)
_PAIRS: tuple[Any, dict[str, str]] = (None, {})


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


def _real(run: Any) -> Any:
    """The object behind pyinfra's context proxy (``from pyinfra import inventory``), else
    ``run`` itself: the proxy and the inventory it stands for are one run."""
    module = getattr(run, "_get_module", None)
    return module() if callable(module) and module() is not None else run


def pairs_are(inventory: Any, pairs: Mapping[str, str]) -> None:
    """Say which pair each host of ``inventory`` (pyinfra's, the run's) is in: host name -> the
    pair's name, "" for every host of an inventory that is one cluster (sparkrig/config)."""
    global _PAIRS
    _PAIRS = (_real(inventory), dict(pairs))


def pair_of(name: str, inventory: Any) -> str:
    """The pair host ``name`` of ``inventory`` is in; "" when the inventory is one cluster (or
    its pairs were never said: nothing is then told apart, as before pairs)."""
    held, pairs = _PAIRS
    return pairs.get(name, "") if held is not None and held is _real(inventory) else ""


def slot(name: str, pair: str) -> str:
    """The slot of ``name`` for one pair: ``name`` itself for an inventory of one cluster (its
    one pair is the run), ``name [pair]`` for a named pair."""
    return f"{name} [{pair}]" if pair else name


def once_per_pair(name: str, make: Callable[[], T]) -> T:
    """The object ``make`` built under ``name`` for the current host's pair in the current run
    (pyinfra's state and host): one for every host of that pair, another for each other pair."""
    state = ctx_state.get()
    current = ctx_host.get()
    pair = pair_of(current.name, getattr(state, "inventory", None)) if current is not None else ""
    return once_per_run(slot(name, pair), state, make)


def changed(meta: Any) -> bool:
    """Did this operation (an OperationMeta) run and change something?"""
    return bool(meta.is_complete() and meta.did_change())


def failed(meta: Any) -> bool:
    """Did this operation (an OperationMeta) run and fail?"""
    return bool(meta.is_complete() and meta.did_error())


class Watch:
    """The one change-watcher: operations watched for a pair under names (any of its hosts'),
    asked which changed something or failed so far. Each purpose gets one per pair of the run
    (``watch``): the pair-restart triggers, the rollback's watched operations, the host package's
    modules, the helpers' units.

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
    """The watcher for ``purpose`` of the current host's pair in the current run (one for every
    host of the pair and every phase; the other pair's is another): a trigger that fires in one
    pair never restarts another, a failure in one never rolls another back."""
    return once_per_pair(purpose, make)
