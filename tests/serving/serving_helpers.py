"""Helpers for the serving tests: load host-side programs from files/ and lab/ by path."""

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
