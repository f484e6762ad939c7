"""requirements.txt is the control side, exactly: every third-party module the deploy imports
(sparkrig/, tasks/, deploy.py, status.py, config.py, inventory.py, group_data/) and nothing else,
so a fresh venv made from the README's one command runs `pyinfra inventory.py deploy.py`."""

from __future__ import annotations

import ast
import re
import sys
from importlib.metadata import packages_distributions
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONTROL = ["sparkrig", "tasks", "group_data", "deploy.py", "status.py", "config.py", "inventory.py"]
LOCAL = {"sparkrig", "sparkhost", "tasks", "group_data", "files", "config"}


def control_sources() -> list[Path]:
    out: list[Path] = []
    for name in CONTROL:
        path = ROOT / name
        out.extend(sorted(path.rglob("*.py")) if path.is_dir() else [path] if path.exists() else [])
    return out


def imported_top_modules(sources: list[Path]) -> set[str]:
    mods: set[str] = set()
    for src in sources:
        for node in ast.walk(ast.parse(src.read_text(), str(src))):
            if isinstance(node, ast.Import):
                mods.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                mods.add(node.module.split(".")[0])
    return {m for m in mods if m not in sys.stdlib_module_names and m not in LOCAL}


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def required() -> set[str]:
    names = set()
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            names.add(norm(re.split(r"[<>=!~\[; ]", line, maxsplit=1)[0]))
    return names


def test_requirements_txt_lists_exactly_what_the_control_side_imports():
    dists = packages_distributions()
    wanted: set[str] = set()
    for mod in imported_top_modules(control_sources()):
        assert mod in dists, f"{mod}: imported by the control side but installed by no package"
        wanted.update(norm(d) for d in dists[mod])
    listed = required()
    assert wanted == listed, (
        f"missing from requirements.txt: {sorted(wanted - listed)}; "
        f"listed but never imported: {sorted(listed - wanted)}"
    )


def test_the_walk_sees_the_control_side():
    mods = imported_top_modules(control_sources())
    assert {"pyinfra", "pydantic", "jinja2"} <= mods
