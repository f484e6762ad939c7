"""Each stack's published figures, per protocol: what a result is compared with.

A result names its stack (``--stack``, the JSON's ``stack``) and its protocol (``protocol_name``).
Its published figures come from, first to last:

1. a published-figures file (``compare --published FILE``), JSON of the form
   ``{"<stack>": {"<protocol>": [{"figure": ..., "value": 27.4 or [low, high], "source": ...,
   "condition": ..., "lower_is_better": false}]}}``; a stack the file names takes only the file's
   figures. This is the seam for the stack declarations (sparkrig.stacks, issue 33 item 1): each
   stack's expected figures, with their sources, written in this form;
2. the figures below: seed 004's for the two stacks it measured (seed 004 protocol), and for
   today's recipe (``vllm-nvfp4``, or a result with no stack) the running profile's figures of
   seeds 000 and 003 (sparkrig/bench/expected.py, seed 000 protocol); for another declared
   stack, its declaration's own figures that a seed 000 result measures (``declared``: e.g.
   tensorfold's MiaAI figures, 60.4 tok/s alone, 108.8 at 4, prefill 1,952).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparkrig.stacks import STACKS  # the declarations know no bench: one way

from . import expected

DEFAULT_STACK = "vllm-nvfp4"  # today's recipe (seeds 000-002): the stack knob's default
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


def _seed004(prose: float, low: float, high: float, pre_prose: float, pre_code: float,
             cap: int, who: str) -> tuple[Published, ...]:  # fmt: skip
    """Seed 004 line 7, in its order: prose decode, code at reasoning low, code at reasoning max,
    prefill on the prose prompt, prefill on the code prompt, the context cap (the result's
    max_model_len, from /v1/models)."""
    c = f"{who}; {SEED_004_CONDITION}"
    return (
        Published("prose_decode_tok_s", prose, prose, SEED_004, c),
        Published("code_low_decode_tok_s", low, low, SEED_004, c),
        Published("code_max_decode_tok_s", high, high, SEED_004, c),
        Published("prose_prefill_tok_s", pre_prose, pre_prose, SEED_004, c),
        Published("code_prefill_tok_s", pre_code, pre_code, SEED_004, c),
        Published("max_model_len", cap, cap, SEED_004, c),
    )


# Seed 004 line 7: "Prose decode was 27.4 tok/s on Entrpi and 35.8 on TensorFold. Code at reasoning
# low was 53.6 and 36.3. Code at reasoning max was 62.7 and 44.6. Prefill on the prose prompt was
# 1,369 tok/s and 1,342. On the code prompt, 1,306 and 1,364. Context cap is 524,288 on Entrpi and
# 1,048,576 on TensorFold." The TensorFold figures are the seed author's own TensorFold stack on
# neko-legends' EXL3 (line 5), not another recipe's (docs/stacks-facts.md section 0.2).
SEED004_FIGURES: dict[str, tuple[Published, ...]] = {
    "entrpi-exl3": _seed004(27.4, 53.6, 62.7, 1369.0, 1306.0, 524288,
                            "Entrpi's kit, brandonmusic's 4bpw EXL3, MXFP8 DFlash2 drafter"),
    "tensorfold": _seed004(35.8, 36.3, 44.6, 1342.0, 1364.0, 1048576,
                           "TensorFold, neko-legends' EXL3, incoai's DFlash2"),
}  # fmt: skip

Table = Mapping[str, Mapping[str, Sequence[Published]]]  # stack -> protocol -> figures


def _readable(name: str) -> bool:
    """Whether ``expected.lookup`` reads a figure of this name from a seed 000 result."""
    plain = ("single_stream_tok_s", "prefill_tok_s", "ttft_p50_s", "fffd_per_10k_chars")
    return name in plain or name.startswith("decode_tok_s.")


def declared(stack: str, profile: str | None) -> list[expected.Figure]:
    """A declared stack's own figures (``Stack.figures``, sparkrig/stacks/) beside a seed 000
    result: the publisher's, measured under its own protocol (e.g. MiaAI's sparkDash), so a
    rough guide; only figures a seed 000 result measures, of the result's profile."""
    found = STACKS.get(stack)
    if found is None:
        return []
    return [
        Published(f.name, f.value, f.value, f.source,
                  f"{f.protocol} protocol (the publisher's own, a rough guide); profile "
                  f"{f.profile or 'any'}")
        for f in found.figures
        if f.protocol != "seed004" and _readable(f.name)
        and (not f.profile or profile in (None, f.profile))
    ]  # fmt: skip


def builtin(stack: str | None, protocol: str, profile: str | None) -> list[expected.Figure]:
    if protocol == "seed004":
        return list(SEED004_FIGURES.get(stack or "", ()))
    if stack in (None, DEFAULT_STACK):
        return [e for e in expected.EXPECTED if e.profile == profile]
    return declared(stack, profile) if stack else []


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
