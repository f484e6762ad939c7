"""The rule that keeps worker-before-head: every host runs the same sequence of operations, and
pyinfra runs each operation on every host before the next one (its default barrier:
pyinfra/api/operations.py, run_ops). Operations that act on some hosts only still exist on every
host and do nothing where their condition does not hold. ``--serial`` (hosts one after the
other, in set order) and ``--no-wait`` (no barrier) would let the head start before its workers,
so the deploy refuses them before any command reaches a host."""

from __future__ import annotations

import sys
import types
from collections.abc import Generator
from pathlib import Path
from typing import Any

from pyinfra import host, inventory, state
from pyinfra.api import operation
from pyinfra.api.exceptions import DeployError
from pyinfra.api.operation import OperationMeta

from sparkrig import REPO

ORDER_BREAKING = {
    "serial": "--serial runs the hosts one after the other in an unspecified order",
    "no_wait": "--no-wait drops the barrier between operations",
}


def refuse_unordered_run(params: dict[str, object] | None = None) -> None:
    """Raise DeployError when the pyinfra command line asks for ``--serial`` or ``--no-wait``.

    pyinfra 3.10 keeps neither in its state or config: they are arguments of the CLI's
    ``_main`` (pyinfra_cli/cli.py). They are read from the running click command where it is
    visible, and from the ``pyinfra`` process's own argv: the CLI loads the deploy file in a
    gevent greenlet, where click's context (a thread-local, which gevent makes per greenlet) is
    None."""
    if params is None:
        import click

        ctx = click.get_current_context(silent=True)
        params = dict(ctx.params) if ctx is not None else {}
        params.update({k: True for k in argv_options(sys.argv)})
    asked = [reason for key, reason in ORDER_BREAKING.items() if params.get(key)]
    if asked:
        raise DeployError(
            "sparkrig refuses this run: "
            + "; ".join(asked)
            + ". Every host must run the same operations in step so the workers' ranks start "
            "before the head's (worker-before-head); run without --serial and --no-wait."
        )


def argv_options(argv: list[str]) -> list[str]:
    """The ORDER_BREAKING options in the argv of a ``pyinfra`` process (none in any other: a
    test runner's own argv says nothing of pyinfra's). Options end at ``--``."""
    program = argv[0] if argv else ""
    if Path(program).name != "pyinfra" and "pyinfra_cli" not in program:
        return []
    given = argv[1 : argv.index("--")] if "--" in argv else argv[1:]
    return [key for key in ORDER_BREAKING if f"--{key.replace('_', '-')}" in given]


def in_this_run(name: str) -> bool:
    """Whether host ``name`` is in this run: one that ``--limit`` leaves out is never reached
    (not even read)."""
    return bool(state.is_host_in_limit(inventory.get_host(name)))


def index_deploy_files(root: Path = REPO) -> None:
    """Make pyinfra's operation order cheap to compute: a placeholder module per deploy and task
    file, so ``inspect`` finds each file by a dict lookup.

    pyinfra 3.10 places every operation by the line numbers of ``inspect.stack()``
    (``get_operation_order_from_stack``), and ``inspect.getmodule`` scans all of ``sys.modules``
    for each frame whose file is no module's: ``deploy.py`` and ``tasks/*.py``, which pyinfra
    execs. That scan was about half of the control side's time: a 4-node no-op on ``@fake``
    hosts took 1.29 s without the index, 0.72 s with it (bench/noop/bench_control.py); the
    more modules are loaded, the more each scan costs."""
    for path in [root / "deploy.py", *sorted((root / "tasks").glob("*.py"))]:
        module = types.ModuleType(f"_sparkrig_deploy_file_{path.parent.name}_{path.stem}")
        module.__file__ = str(path)
        sys.modules[module.__name__] = module


# ---------------------------------------------------------------------------------------------
# Operations some hosts act on: one idiom (every host has them, so all share one sequence)
# ---------------------------------------------------------------------------------------------


@operation()
def acting_where(
    acting: bool, elsewhere: str, op: Any, kwargs: dict[str, Any]
) -> Generator[Any, None, None]:
    """
    ``op`` on the hosts where ``acting`` holds, a no-op elsewhere (saying ``elsewhere``): every
    host has the operation, so pyinfra's barrier orders it the same way on all of them.

    + acting: whether this host acts
    + elsewhere: the no-op reason where it does not
    + op: a sparkrig or pyinfra operation
    + kwargs: its arguments
    """
    if not acting:
        host.noop(elsewhere)
        return
    yield from op._inner(**kwargs)


def _role_op(acting: bool, elsewhere: str, op: Any, name: str, **kwargs: Any) -> OperationMeta:
    global_args = {k: kwargs.pop(k) for k in list(kwargs) if k.startswith("_")}
    return acting_where(
        name=name, acting=acting, elsewhere=elsewhere, op=op, kwargs=kwargs, **global_args
    )


def on_head(is_head: bool, op: Any, name: str, **kwargs: Any) -> OperationMeta:
    """The idiom for "only on the head": ``on_head(s.me.is_head, file_present, name=..., ...)``."""
    return _role_op(is_head, "the head alone acts here", op, name, **kwargs)


def on_workers(is_head: bool, op: Any, name: str, **kwargs: Any) -> OperationMeta:
    """The idiom for "only on the workers": ``on_workers(s.me.is_head, op, name=..., ...)``."""
    return _role_op(not is_head, "the workers alone act here", op, name, **kwargs)


def on_ranks(ranks: tuple[int, ...], my_rank: int, op: Any, name: str, **kwargs: Any
             ) -> OperationMeta:  # fmt: skip
    """The idiom for "only on these ranks" (one wave of an ordered start)."""
    said = ", ".join(map(str, ranks))
    return _role_op(my_rank in ranks, f"rank {said} alone acts here", op, name, **kwargs)
