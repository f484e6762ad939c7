"""Each stack's published figures, per protocol: what a result is compared with.

A result names its stack (``--stack``, the JSON's ``stack``) and its protocol (``protocol_name``).
Its published figures come from, first to last:

1. a published-figures file (``compare --published FILE``), JSON of the form
   ``{"<stack>": {"<protocol>": [{"figure": ..., "value": 27.4 or [low, high], "source": ...,
   "condition": ..., "lower_is_better": false}]}}``; a stack the file names takes only the file's
   figures (figures not yet in a declaration, or another source's);
2. the stack's declaration (``Stack.figures``, sparkrig/stacks/): the one source of published
   figures, each with its source. A result with no stack is today's recipe's (vllm-nvfp4);
   figures of one profile apply to a run of that profile only, and figures of one rank count
   (``Figure.nodes``: tensorfold-ring's three and four Sparks) to a result of that ``nnodes``
   only (a result that names none gets the figures that name none);
3. beside a seed 000 run of a stack declared with no seed 000 figures, its publisher's own
   (``declared``: e.g. tensorfold's MiaAI figures, 60.4 tok/s alone, 108.8 at 4, prefill 1,952);
4. for a stack not declared here, ``UNDECLARED`` (empty today).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparkrig.stacks import DEFAULT_STACK, STACKS  # the declarations know no bench
from sparkrig.stacks.base import Figure

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


# Stacks not declared in sparkrig/stacks/ whose published figures the bench still shows (none
# today: TensorFold's seed 004 figures live in its declaration).
UNDECLARED: dict[str, dict[str, tuple[Published, ...]]] = {}

Table = Mapping[str, Mapping[str, Sequence[Published]]]  # stack -> protocol -> figures


def _readable(name: str) -> bool:
    """Whether ``expected.lookup`` reads a figure of this name from a seed 000 result."""
    plain = ("single_stream_tok_s", "prefill_tok_s", "ttft_p50_s", "fffd_per_10k_chars",
             "spec_acceptance", "spec_acceptance_length")  # fmt: skip
    return name in plain or name.startswith(("decode_tok_s.", "prefill_ttft_s."))


def _of_nodes(f: Figure, nnodes: int | None) -> bool:
    """Whether a declared figure applies to a result measured on ``nnodes`` ranks."""
    return f.nodes is None or f.nodes == nnodes


def declared(stack: str, profile: str | None, nnodes: int | None = None
             ) -> list[expected.Figure]:  # fmt: skip
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
        if f.protocol != "seed004" and _readable(f.name) and _of_nodes(f, nnodes)
        and (not f.profile or profile in (None, f.profile))
    ]  # fmt: skip


def builtin(stack: str | None, protocol: str, profile: str | None, nnodes: int | None = None
            ) -> list[expected.Figure]:  # fmt: skip
    """The declared figures of ``stack`` (None: the default stack) for ``protocol``: those of
    no profile, and those of ``profile``, of no rank count and of ``nnodes``; beside a seed 000
    run of a stack declared with none of that protocol, the publisher's own (``declared``)."""
    name = stack or DEFAULT_STACK
    if name not in STACKS:
        return list(UNDECLARED.get(name, {}).get(protocol, ()))
    found = STACKS[name]
    one = len(found.profiles) == 1  # a stack serving one profile: its figures are its own
    own: list[expected.Figure] = [f for f in found.figures
           if f.protocol == protocol and (one or f.profile in ("", profile))
           and _of_nodes(f, nnodes)]  # fmt: skip
    if protocol == "seed000" and not own:
        return declared(name, profile, nnodes)
    return own


def figures_for(result: dict[str, Any], table: Table | None = None) -> list[expected.Figure]:
    """The published figures a result is compared with: the table's for its stack, else the
    built-in ones (the module's docstring)."""
    stack, protocol = result.get("stack"), result.get("protocol_name") or "seed000"
    if table is not None and isinstance(stack, str) and stack in table:
        return list(table[stack].get(protocol, ()))
    nnodes = result.get("nnodes")
    nodes = nnodes if isinstance(nnodes, int) else None
    return builtin(stack, protocol, result.get("profile"), nodes)


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
