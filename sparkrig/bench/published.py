"""Each stack's published figures, per protocol: what a result is compared with.

A result names its stack (``--stack``, the JSON's ``stack``) and its protocol (``protocol_name``).
Its published figures come from, first to last:

1. a published-figures file (``compare --published FILE``), JSON of the form
   ``{"<stack>": {"<protocol>": [{"figure": ..., "value": 27.4 or [low, high], "source": ...,
   "condition": ..., "lower_is_better": false}]}}``; a stack the file names takes only the file's
   figures (figures not yet in a declaration, or another source's);
2. the stack's declaration (``Stack.figures``, sparkrig/stacks/): the one source of published
   figures, each with its source. A result with no stack is today's recipe's (vllm-nvfp4);
   figures of one profile apply to a run of that profile only;
3. for a stack not declared here (TensorFold, issue 34, until its declaration lands), seed 004's
   figures of it (``UNDECLARED``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparkrig.stacks import DEFAULT_STACK, STACKS

from . import expected

SEED_004 = "seed 004 (004_d4f0c35b177c450a.txt, one operator, 2x DGX Spark, two stacks)"
SEED_004_CONDITION = (
    "one streamed call, temperature 0.2, 384 tokens, prompt around 3.7k tokens (seed 004 line 1)"
)


@dataclass(frozen=True)
class Published:
    figure: str  # a name expected.lookup reads from a result
    low: float
    high: float  # == low for a single figure
    source: str
    condition: str
    lower_is_better: bool = False


# Seed 004 line 7's TensorFold figures: "Prose decode was ... 35.8 on TensorFold. Code at reasoning
# low was ... 36.3. Code at reasoning max was ... 44.6. Prefill on the prose prompt was ... 1,342.
# On the code prompt, ... 1,364. Context cap is ... 1,048,576 on TensorFold." The seed author's
# own TensorFold stack on neko-legends' EXL3 (line 5; docs/stacks-facts.md section 0.2). Moves
# into the TensorFold stack's declaration when it is declared (a declared stack wins).
_TF = f"TensorFold, neko-legends' EXL3, incoai's DFlash2; {SEED_004_CONDITION}"
UNDECLARED: dict[str, dict[str, tuple[Published, ...]]] = {
    "tensorfold": {"seed004": (
        Published("prose_decode_tok_s", 35.8, 35.8, SEED_004, _TF),
        Published("code_low_decode_tok_s", 36.3, 36.3, SEED_004, _TF),
        Published("code_max_decode_tok_s", 44.6, 44.6, SEED_004, _TF),
        Published("prose_prefill_tok_s", 1342.0, 1342.0, SEED_004, _TF),
        Published("code_prefill_tok_s", 1364.0, 1364.0, SEED_004, _TF),
        Published("max_model_len", 1048576, 1048576, SEED_004, _TF),
    )},
}  # fmt: skip

Table = Mapping[str, Mapping[str, Sequence[Published]]]  # stack -> protocol -> figures


def builtin(stack: str | None, protocol: str, profile: str | None) -> list[expected.Figure]:
    """The declared figures of ``stack`` (None: the default stack) for ``protocol``: those of
    no profile, and those of ``profile``."""
    name = stack or DEFAULT_STACK
    if name not in STACKS:
        return list(UNDECLARED.get(name, {}).get(protocol, ()))
    declared = STACKS[name]
    one = len(declared.profiles) == 1  # a stack serving one profile: its figures are its own
    return [f for f in declared.figures
            if f.protocol == protocol and (one or f.profile in ("", profile))]  # fmt: skip


def figures_for(result: dict[str, Any], table: Table | None = None) -> list[expected.Figure]:
    """The published figures a result is compared with: the table's for its stack, else the
    built-in ones (the module's docstring)."""
    stack, protocol = result.get("stack"), result.get("protocol_name") or "seed000"
    if table is not None and isinstance(stack, str) and stack in table:
        return list(table[stack].get(protocol, ()))
    return builtin(stack, protocol, result.get("profile"))


def load(path: Path) -> dict[str, dict[str, list[Published]]]:
    """A published-figures file (the module's docstring); ValueError naming what is wrong."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"published figures {path}: {exc}") from None
    out: dict[str, dict[str, list[Published]]] = {}
    if not isinstance(data, dict):
        raise ValueError(f"published figures {path}: not a JSON object of stacks")
    for stack, protocols in data.items():
        if not isinstance(protocols, dict):
            raise ValueError(f"published figures {path}: {stack}: not an object of protocols")
        for protocol, rows in protocols.items():
            out.setdefault(stack, {})[protocol] = [_row(path, stack, protocol, r) for r in rows]
    return out


def _row(path: Path, stack: str, protocol: str, row: Any) -> Published:
    where = f"published figures {path}: {stack} {protocol}"
    if not isinstance(row, dict) or not {"figure", "value", "source"} <= row.keys():
        raise ValueError(f"{where}: each figure needs figure, value and source: {row!r}")
    value = row["value"]
    if isinstance(value, int | float):
        value = [value, value]
    if not (isinstance(value, list) and len(value) == 2
            and all(isinstance(v, int | float) for v in value)):  # fmt: skip
        raise ValueError(f"{where}: {row['figure']}: value is a number or [low, high]")
    low, high = value
    return Published(
        str(row["figure"]), float(low), float(high), str(row["source"]),
        str(row.get("condition", "")), bool(row.get("lower_is_better", False)),
    )  # fmt: skip
