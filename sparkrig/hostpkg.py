"""The host package (files/sparkhost): where it lands on a host, how every program is invoked,
and which of its modules each job runs (what a changed module restarts).

Shipped as a package directory, one owned file per module (``<install_dir>/lib/sparkhost/*.py``,
root 0644), not as a zipapp: each module is a file of the one state read (sparkrig/hoststate.py),
so a converged host costs no command more; ``--dry --diff`` shows a changed module as a readable
diff (a zipapp would be one opaque binary); and a change restarts only the helpers whose job
imports the changed module (``uses``), where one archive would restart every helper for any
change. Every program runs the same way, ``/usr/bin/python3 <dir> JOB ARGS`` (``command``), in
units, templates and the deploy's remote commands alike."""

from __future__ import annotations

import ast
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

from sparkrig import REPO
from sparkrig.runscope import Watch, watch

SOURCE = REPO / "files" / "sparkhost"
PYTHON = "/usr/bin/python3"
PACKAGE = "sparkhost"


def remote_dir(install_dir: str) -> str:
    """Where the package lands on a host."""
    return f"{install_dir.rstrip('/')}/lib/{PACKAGE}"


def invocation(install_dir: str) -> list[str]:
    """argv prefix of every host program: ``invocation(d) + [job, *args]``."""
    return [PYTHON, remote_dir(install_dir)]


def command(install_dir: str, job: str, *args: str) -> list[str]:
    """argv of one job of the host package (``sparkhost/__main__.py`` JOBS)."""
    if job not in jobs():
        raise KeyError(f"{job!r} is not a job of {PACKAGE} ({', '.join(jobs())})")
    return [*invocation(install_dir), job, *args]


@cache
def modules() -> tuple[str, ...]:
    """The package's module files, as shipped (``__init__.py``, ``__main__.py``, ``fetch.py``)."""
    return tuple(sorted(p.name for p in SOURCE.glob("*.py")))


def source(module: str) -> Path:
    return SOURCE / module


def remote_dirs(install_dir: str) -> list[str]:
    """The directories the package needs on a host, parent first."""
    return [remote_dir(install_dir).rsplit("/", 1)[0], remote_dir(install_dir)]


def legacy_files(install_dir: str) -> list[str]:
    """Where sparkrig put its host programs before the package (removed by the deploy)."""
    d = install_dir.rstrip("/")
    bin_dir = f"{d}/bin"
    return [f"{bin_dir}/sparkrig-prep", f"{bin_dir}/sparkrig-fetch", f"{bin_dir}/sparkrig-pair",
            f"{d}/sparkrig_gate.py"]  # fmt: skip


def remote_files(install_dir: str) -> list[str]:
    """Every file of the package on a host (owned files of the state read)."""
    return [f"{remote_dir(install_dir)}/{m}" for m in modules()]


@cache
def jobs() -> dict[str, str]:
    """job -> the module that runs it, as ``__main__.py`` declares them."""
    from sparkhost.__main__ import JOBS

    return dict(JOBS)


def _imports(module: str) -> set[str]:
    """The package modules ``module`` imports (``from sparkhost import x``, ``import
    sparkhost.x``, ``from sparkhost.x import y``), as file names."""
    tree = ast.parse(source(module).read_text(), filename=str(source(module)))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == PACKAGE:
                found |= {f"{a.name}.py" for a in node.names}
            elif node.module.startswith(PACKAGE + "."):
                found.add(node.module.split(".")[1] + ".py")
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith(PACKAGE + "."):
                    found.add(a.name.split(".")[1] + ".py")
    return found & set(modules())


@cache
def uses(job: str) -> frozenset[str]:
    """Every module file a running ``job`` has loaded: its module, what that imports (all the
    way down) and the package's ``__init__.py`` and ``__main__.py``. A change to any of them
    is a change to the program that job runs."""
    todo = [f"{jobs()[job]}.py"]
    seen = {"__init__.py", "__main__.py"}
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.add(m)
        todo += sorted(_imports(m) - seen)
    return frozenset(seen)


# ---------------------------------------------------------------------------------------------
# What changed in this run (per host): the host phase records its install operations
# ---------------------------------------------------------------------------------------------


def _shipped() -> Watch:
    return watch("host package", Watch)  # "<host>:<module>" -> its install operation


def shipped(ops: dict[str, Any]) -> None:
    """Record the current host's install operation of every module (tasks/host.py)."""
    from pyinfra.context import ctx_host

    if set(ops) != set(modules()):
        raise ValueError(f"every module of {PACKAGE} is installed by one operation")
    name = ctx_host.get().name
    for module, meta in ops.items():
        _shipped().add(f"{name}:{module}", meta)


def changed(job: str) -> Callable[[], bool]:
    """For ``_if``: did this run change any module the current host's ``job`` loads (``uses``)?"""
    from pyinfra.context import ctx_host

    name = ctx_host.get().name
    keys = [f"{name}:{m}" for m in sorted(uses(job))]
    ops = _shipped()
    if any(key not in ops.metas for key in keys):
        raise KeyError(f"{name}: the host package is not installed in this deploy (tasks/host.py)")
    return lambda: bool(ops.changed(*keys))
