"""The verdict on a result against the figures it is expected to reach.

The figures themselves are the stacks' declarations (``Stack.figures``, sparkrig/stacks/: each
quoted from its source, with the condition it was measured under and, for today's recipe, the
likely causes when a run falls short); sparkrig/bench/published.py picks a result's. Seed 000's
were measured on two DGX Sparks with the community v11 image; a pair on other hardware, image or
weights is compared with them only as a rough guide.
"""

from __future__ import annotations

from typing import Any, Protocol

from sparkrig.stacks import DEFAULT_STACK, STACKS

# How far below a figure a measurement may fall and still count as within it. Seed 000 saw its
# own single-request figure move between 30.8 and 32.3 tok/s (5%) and treats rows within 3% as
# equal; its protocol also differs from ours in details (256 forced tokens for the speed table,
# recall asked in a separate request), so 10%.
DEFAULT_TOLERANCE = 0.10


def lookup(result: dict[str, Any], figure: str) -> list[float]:
    """The measured values a figure names (several for prefill and the long-context decode:
    one per context; ``prefill_ttft_s.<N>`` the TTFT of the context of N prompt tokens, as
    ``--contexts`` asked it). ``<figure>.p10`` is that figure's p10 in the result's ``spread``;
    ``fabric_busbw_gbs`` the NCCL smoke test's bus bandwidth the result holds (``fabric``, as
    the release record keeps it). A name the result does not hold gives none (a result from
    before it was measured)."""
    if figure.endswith(".p10"):
        s = (result.get("spread") or {}).get(figure.removesuffix(".p10"))
        v = s.get("p10") if isinstance(s, dict) else None
        return [] if v is None else [float(v)]
    if figure == "fabric_busbw_gbs":
        v = (result.get("fabric") or {}).get("busbw_gbs")
        return [float(v)] if isinstance(v, int | float) else []
    if figure == "context_decode_tok_s":
        return [float(p["decode_tok_s"]) for p in result.get("prefill") or []
                if p.get("decode_tok_s") is not None]  # fmt: skip
    if figure.startswith("decode_tok_s."):
        v = (result.get("decode_tok_s") or {}).get(figure.split(".", 1)[1])
        return [] if v is None else [float(v)]
    if figure.startswith("prefill_ttft_s."):  # the cold prefill's TTFT at one context
        target = int(figure.split(".", 1)[1])
        return [float(p["ttft_s"]) for p in result.get("prefill") or []
                if p.get("target_tokens") == target and p.get("ttft_s") is not None]  # fmt: skip
    if figure == "prefill_tok_s":
        return [float(p["prefill_tok_s"]) for p in result.get("prefill") or []
                if p.get("prefill_tok_s") is not None]  # fmt: skip
    v = result.get(figure)
    return [] if v is None else [float(v)]


class Figure(Protocol):
    """An expected or published figure: this module's Expected, published.Published."""

    @property
    def figure(self) -> str: ...
    @property
    def low(self) -> float: ...
    @property
    def high(self) -> float: ...
    @property
    def source(self) -> str: ...
    @property
    def condition(self) -> str: ...
    @property
    def lower_is_better(self) -> bool: ...


def judge(e: Figure, result: dict[str, Any], tolerance: float) -> dict[str, Any]:
    """One verdict row: measured (the worst of several), expected, source, condition, status
    ("within" the tolerance, "short" of it, "better", "not measured")."""
    values = lookup(result, e.figure)
    row: dict[str, Any] = {
        "figure": e.figure, "expected": [e.low, e.high] if e.high != e.low else e.low,
        "source": e.source, "condition": e.condition, "measured": None,
        "status": "not measured", "causes": "",
    }  # fmt: skip
    if values:
        worst = max(values) if e.lower_is_better else min(values)
        row["measured"] = worst
        if e.lower_is_better:
            bad = worst > e.high * (1 + tolerance)
            good = worst < e.low * (1 - tolerance)
        else:
            bad = worst < e.low * (1 - tolerance)
            good = worst > e.high * (1 + tolerance)
        row["status"] = "short" if bad else "better" if good else "within"
    return row


def verdicts_of(figures: list[Figure], result: dict[str, Any], tolerance: float
                ) -> list[dict[str, Any]]:  # fmt: skip
    """One row per figure (judge); a short one names the likely causes where the figure's
    declaration gives them (today's recipe's: sparkrig/stacks/vllm_nvfp4.py CAUSES)."""
    rows = []
    for e in figures:
        row = judge(e, result, tolerance)
        if row["status"] == "short":
            row["causes"] = getattr(e, "causes", "")
        rows.append(row)
    return rows


def verdicts(result: dict[str, Any], profile: str | None, tolerance: float) -> list[dict[str, Any]]:
    """The verdicts on today's recipe's (the default stack's) seed-000 figures of ``profile``."""
    figures = [f for f in STACKS[DEFAULT_STACK].figures
               if f.protocol == "seed000" and f.profile == profile]  # fmt: skip
    return verdicts_of(list(figures), result, tolerance)
