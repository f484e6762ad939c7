"""The stack declarations these tests cover and the recipe facts kept apart from them as test data
(tests/stacks/data/recipes.json, each entry with its source in docs/stacks-facts.md)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from sparkrig.stacks import STACKS, entrpi_exl3, sfxnz_v13
from sparkrig.stacks.base import Stack

REPO = Path(__file__).resolve().parents[2]
# the serving suite's vLLM helpers (vLLM on CPU, the pin) are this suite's too
if str(REPO / "tests" / "serving") not in sys.path:
    sys.path.insert(0, str(REPO / "tests" / "serving"))
RECIPES: dict[str, Any] = json.loads((Path(__file__).parent / "data" / "recipes.json").read_text())

# the declarations of issue 33 items 2 and 3, as the layer's registry holds them
MODULES = {m.STACK.name: m for m in (entrpi_exl3, sfxnz_v13)}
DECLARED: dict[str, Stack] = {name: STACKS[name] for name in MODULES}


def fork_only(stack: Stack) -> dict[str, dict[str, str]]:
    return RECIPES[stack.name]["fork_only"]
