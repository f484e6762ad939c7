"""Helpers for the serving tests: load host-side programs from files/ and lab/ by path."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # `sparkrig` is imported from the checkout, installed or not
    sys.path.insert(0, str(REPO))


def load_path(name: str, path: Path) -> ModuleType:
    """Import a stand-alone script (files/*.py) as a module under ``name``."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def files_module(name: str) -> ModuleType:
    return load_path(name, REPO / "files" / f"{name}.py")
