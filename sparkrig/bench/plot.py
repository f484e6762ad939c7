"""The bench's figures through matplotlib, each written as SVG and PNG.

Figures are matplotlib ``Figure`` objects, never pyplot's: no global figure state and no display;
the Agg backend draws the PNG and matplotlib's SVG backend the SVG, on any machine without a
screen (the control machine, CI)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # before anything of matplotlib picks a GUI backend

from matplotlib.artist import Artist  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

MEASURED = "tab:blue"
PUBLISHED = "black"
LABELS = {
    "single_stream_tok_s": "1 stream",
    "prefill_tok_s": "prefill (worst context)",
    "prose_decode_tok_s": "prose decode",
    "code_low_decode_tok_s": "code decode, reasoning low",
    "code_max_decode_tok_s": "code decode, reasoning max",
    "prose_prefill_tok_s": "prefill, prose prompt",
    "code_prefill_tok_s": "prefill, code prompt",
    "ttft_p50_s": "TTFT p50 (s)",
    "max_model_len": "context cap (tokens)",
    "fffd_per_10k_chars": "U+FFFD per 10k chars",
    "context_decode_tok_s": "decode after a long prompt",
    "spec_acceptance": "drafter acceptance",
    "spec_acceptance_length": "acceptance length",
    "code_low_acceptance_length": "acceptance length, code low",
    "code_max_acceptance_length": "acceptance length, code max",
    "fabric_busbw_gbs": "fabric busbw (GB/s)",
}


def label(figure: str) -> str:
    if figure.endswith(".p10"):
        return f"{label(figure.removesuffix('.p10'))} p10"
    if figure.startswith("decode_tok_s."):
        return f"{figure.split('.', 1)[1]} streams"
    return LABELS.get(figure, figure)


PANELS = ("decode tok/s", "prefill tok/s", "drafter acceptance", "fabric busbw GB/s")


def panel_of(figure: str) -> str | None:
    """Which panel of a side-by-side figure draws it: decode (a median and its p10 side by
    side) or prefill tok/s, the drafter's acceptance (a share of its draft tokens), the fabric's
    bus bandwidth; else none (the table still lists it)."""
    if "prefill" in figure:
        return "prefill tok/s"
    if figure == "spec_acceptance":
        return "drafter acceptance"
    if figure == "fabric_busbw_gbs":
        return "fabric busbw GB/s"
    if "acceptance" in figure:
        return None
    if "decode" in figure or figure.startswith("single_stream_tok_s"):
        return "decode tok/s"
    return None


def save(fig: Figure, stem: Path) -> list[Path]:
    """``stem``.svg and ``stem``.png. The SVG keeps its words as text (searchable) and no date, so
    a figure redrawn from the same result is the same file."""
    paths = [stem.with_suffix(".svg"), stem.with_suffix(".png")]
    # text as <text>, not glyph paths; ids from a fixed salt, not a random one per file
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "sparkrig"}):
        fig.savefig(paths[0], format="svg", metadata={"Date": None})
    fig.savefig(paths[1], format="png", dpi=100)
    return paths


Range = tuple[float, float]


def side_by_side(stacks: list[str], figures: list[str], measured: dict[str, dict[str, float]],
                 published: dict[str, dict[str, Range]], title: str) -> Figure:  # fmt: skip
    """Grouped bars, one colour per stack, one group per figure; each stack's own published
    figure drawn on its bar (a range as a line from low to high). One panel per unit."""
    panels = [p for p in PANELS if any(panel_of(f) == p for f in figures)]
    fig = Figure(figsize=(5.5 * max(1, len(panels)), 4.2), layout="constrained")
    fig.suptitle(title)
    colours = matplotlib.colormaps["tab10"]
    for i, panel in enumerate(panels):
        ax: Axes = fig.add_subplot(1, len(panels), i + 1)
        names = [f for f in figures if panel_of(f) == panel]
        width = 0.8 / max(1, len(stacks))
        for j, stack in enumerate(stacks):
            xs = [k + (j - (len(stacks) - 1) / 2) * width for k in range(len(names))]
            ax.bar(xs, [measured[stack].get(f, 0.0) for f in names], width * 0.9,
                   color=colours(j))  # fmt: skip
            for x, f in zip(xs, names, strict=True):
                if f in published[stack]:
                    low, high = published[stack][f]
                    ax.plot([x - width * 0.45, x + width * 0.45], [low, low], color=PUBLISHED,
                            lw=2)  # fmt: skip
                    if high != low:
                        ax.plot([x, x], [low, high], color=PUBLISHED, lw=2)  # fmt: skip
        ax.set_xticks(range(len(names)), [label(f) for f in names], rotation=20, ha="right")
        ax.set_ylabel(panel)
        ax.grid(axis="y", alpha=0.3)
    legend: list[Artist] = [Patch(color=colours(j), label=stack) for j, stack in enumerate(stacks)]
    legend.append(Line2D([], [], color=PUBLISHED, lw=2, label="published (each stack's own)"))
    fig.legend(handles=legend, loc="outside lower center", ncols=len(legend))
    return fig


def seed000(result: dict[str, Any], published: list[Any]) -> Figure:
    """Decode tok/s against streams, prefill tok/s and TTFT against context; the published
    figures as points (decode) and a band (prefill)."""
    fig = Figure(figsize=(15, 4.2), layout="constrained")
    fig.suptitle(f"sparkrig bench: {result.get('stack') or result.get('profile') or 'endpoint'}")
    tok, pre, ttft = (fig.add_subplot(1, 3, i) for i in (1, 2, 3))
    decode = sorted((int(k), v) for k, v in (result.get("decode_tok_s") or {}).items())
    tok.plot([n for n, _ in decode], [v for _, v in decode], "o-", color=MEASURED,
             label="measured")  # fmt: skip
    points = [(1 if e.figure == "single_stream_tok_s" else int(e.figure.split(".")[1]), e.low)
              for e in published if e.figure == "single_stream_tok_s"
              or e.figure.startswith("decode_tok_s.")]  # fmt: skip
    if points:
        tok.plot(*zip(*points, strict=True), "D", color=PUBLISHED, mfc="none", label="published")
    tok.set(title="decode tok/s vs streams", xlabel="streams", ylabel="tok/s")
    rows = sorted(result.get("prefill") or [], key=lambda r: r["prompt_tokens"])
    ctx = [r["prompt_tokens"] for r in rows]
    pre.plot(ctx, [r["prefill_tok_s"] or 0.0 for r in rows], "o-", color=MEASURED,
             label="measured")  # fmt: skip
    for e in [e for e in published if e.figure == "prefill_tok_s"][:1]:
        pre.axhspan(e.low, e.high, color=PUBLISHED, alpha=0.15, label="published")
    pre.set(title="prefill tok/s vs context", xlabel="prompt tokens", ylabel="tok/s")
    ttft.plot(ctx, [r["ttft_s"] for r in rows], "o-", color=MEASURED, label="measured")
    ttft.set(title="TTFT vs context", xlabel="prompt tokens", ylabel="s")
    for ax in (tok, pre, ttft):
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend()
    return fig
