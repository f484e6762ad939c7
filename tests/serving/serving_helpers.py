"""Helpers for the serving tests: load host-side programs from files/ and lab/ by path, and run
the host package's remote commands from the checkout."""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType

from sparkrig.scripts import load_script

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # `sparkrig` is imported from the checkout, installed or not
    sys.path.insert(0, str(REPO))


load_path = load_script  # the same loader the control side uses


def files_module(name: str) -> ModuleType:
    return load_path(name, REPO / "files" / f"{name}.py")


def local_argv(argv: list[str]) -> list[str]:
    """A host package command (sparkrig/hostpkg.py) as this checkout runs it: this Python, the
    package in files/ (the argv must start with the package's invocation, whatever directory)."""
    from sparkrig import hostpkg

    assert argv[0] == hostpkg.PYTHON and argv[1].endswith("/lib/sparkhost"), argv
    return [sys.executable, str(hostpkg.SOURCE), *argv[2:]]
