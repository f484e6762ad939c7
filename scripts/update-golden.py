#!/usr/bin/env python3
"""Rewrite tests/golden/ from the templates after an intended change (review the diff, commit).

A separate action on purpose: the golden test only compares, so a run never blesses itself."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.unit import test_rings  # noqa: E402
from tests.unit.test_templates import GOLDEN, rendered  # noqa: E402


def main() -> int:
    for nodes in (2, 4):
        shutil.rmtree(GOLDEN / f"{nodes}nodes", ignore_errors=True)
        for path, text in rendered(nodes).items():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(path.relative_to(ROOT))
    for nodes in (2, 3, 4):  # fabric_layout "ports" (docs/rings.md)
        shutil.rmtree(test_rings.GOLDEN / f"{nodes}nodes", ignore_errors=True)
        for path, text in test_rings.rendered(nodes).items():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(path.relative_to(ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
