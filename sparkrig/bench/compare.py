"""python3 -m sparkrig.bench compare: several results side by side, one per stack.

    python3 -m sparkrig.bench compare RESULT.json RESULT.json ... [--published FILE] [--out STEM]

Prints one table (a row per figure, a column per result: measured, the stack's own published
figure, the status) and writes one figure, STEM.svg and STEM.png (default
bench/results/compare-<UTC>). Each result is judged against its own stack's published figures
(sparkrig/bench/published.py says where they come from), never against another stack's. Where a
result holds them: each speed's p10 beside its median (the release gate's runs:
.sparkrig/bench/release-gate-<UTC>-release.json, one per release), the drafter's acceptance and
which drafter files it was, the long-context decode and the fabric's bus bandwidth.
Exit status: 0, or 2 when a file cannot be read.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import expected, plot, published, seed004
from .report import num


@dataclass
class Column:
    name: str  # the result's stack, else its file's name
    result: dict[str, Any]
    published: list[expected.Figure]


# The drafter and the fabric: figures a result holds where it measured them (older results
# hold none of them and still compare).
DRAFTED = ("spec_acceptance", "spec_acceptance_length", *seed004.ACCEPTANCE_FIGURES)


def measured(result: dict[str, Any]) -> dict[str, float]:
    """Every figure the result holds, by the names the published figures use (the worst
    context for prefill and the long-context decode); each speed's p10 after it where the
    result holds its spread (several passes, waves or release-gate runs)."""
    spread = result.get("spread") or {}
    speeds = ["single_stream_tok_s"]
    speeds += [f"decode_tok_s.{k}" for k in (result.get("decode_tok_s") or {}) if k != "1"]
    names = [n for s in speeds for n in (s, f"{s}.p10" if s in spread else "") if n]
    names += [
        "prefill_tok_s",
        "context_decode_tok_s",
        "ttft_p50_s",
        "fffd_per_10k_chars",
        *seed004.FIGURES,
        "max_model_len",
        *DRAFTED,
        "fabric_busbw_gbs",
    ]
    out = {}
    for name in names:
        values = expected.lookup(result, name)
        if values:
            worst = "prefill" in name or name == "context_decode_tok_s"
            out[name] = min(values) if worst else values[0]
    return out


def drafter_line(col: Column) -> str:
    """Which drafter files a column's acceptance is of, and how many release-gate runs its
    spread is over; '' when the result says neither."""
    parts = []
    d = col.result.get("drafter")
    if isinstance(d, dict):
        parts.append(f"drafter {d.get('repo')}@{str(d.get('commit'))[:12]}, lockfile sha256 "
                     f"{str(d.get('lockfile_sha256'))[:12]}")  # fmt: skip
        parts += [f"{k} {v[:12]}" for k, v in (d.get("weights_sha256") or {}).items()]
    gate = col.result.get("release_gate")
    if isinstance(gate, dict):
        parts.append(f"release gate, {gate.get('runs')} runs")
    return "; ".join(parts)


def columns(paths: list[Path], table: published.Table | None) -> list[Column]:
    cols: list[Column] = []
    for path in paths:
        result = json.loads(path.read_text())
        if not isinstance(result, dict):
            raise ValueError(f"{path}: not a bench result (a JSON object)")
        name = result.get("stack") or path.stem
        if isinstance(result.get("release_gate"), dict):  # one release's gate: when it ran
            name = f"{name} {result.get('started', '')}".rstrip()
        taken = [c.name for c in cols]
        name = name if name not in taken else f"{name} ({taken.count(name) + 1})"
        cols.append(Column(name, result, published.figures_for(result, table)))
    return cols


def figure_names(cols: list[Column]) -> list[str]:
    """Every figure measured or published in any column, in order of first appearance."""
    names: dict[str, None] = {}
    for c in cols:
        names.update(dict.fromkeys(measured(c.result)))
        names.update(dict.fromkeys(e.figure for e in c.published))
    return list(names)


def cells(col: Column, figure: str, tolerance: float) -> tuple[str, str, str]:
    """(measured, published, status) of one figure in one column."""
    mine = [e for e in col.published if e.figure == figure]
    if not mine:
        return num(measured(col.result).get(figure)), "-", ""
    row = expected.judge(mine[0], col.result, tolerance)
    return num(row["measured"]), num(row["expected"]), row["status"]


LABEL = 28  # the figure column's width


def table(cols: list[Column], tolerance: float) -> str:
    width = 34
    names = figure_names(cols)
    lines = [f"sparkrig bench compare: {len(cols)} results, tolerance {tolerance:g}"]
    lines.append(f"{'':<{LABEL}}" + "".join(f" | {c.name:<{width}}" for c in cols))
    lines.append(f"{'':<{LABEL}}" + "".join(
        f" | {c.result.get('protocol_name') or 'seed000'}, {c.result.get('started', '?')}"
        .ljust(width + 3) for c in cols))  # fmt: skip
    lines.append(f"{'figure':<{LABEL}}" + f" | {'measured':>9} {'published':>11} {'status':<12}"
                 * len(cols))  # fmt: skip
    for figure in names:
        row = f"{plot.label(figure)[:LABEL]:<{LABEL}}"
        for c in cols:
            m, p, s = cells(c, figure, tolerance)
            row += f" | {m:>9} {p:>11} {s.upper():<12}"
        lines.append(row.rstrip())
    drafters = [(c.name, line) for c in cols if (line := drafter_line(c))]
    if drafters:
        lines.append("\ndrafters and runs:")
        lines += [f"  {name}: {line}" for name, line in drafters]
    lines.append("\npublished figures:")
    for c in cols:
        if not c.published:
            lines.append(f"  {c.name}: none known for protocol "
                         f"{c.result.get('protocol_name') or 'seed000'}")  # fmt: skip
        said: dict[tuple[str, str], list[str]] = {}
        for e in c.published:
            said.setdefault((e.source, e.condition), []).append(plot.label(e.figure))
        for (source, condition), labels in said.items():
            which = "" if len(said) == 1 else f" ({' / '.join(labels)})"  # one source: all of them
            lines.append(f"  {c.name}{which}: {source}; {condition}")
    return "\n".join(lines)


def draw(cols: list[Column], stem: Path) -> list[Path]:
    stacks = [c.name for c in cols]
    figures = figure_names(cols)
    ranges = {c.name: {e.figure: (e.low, e.high) for e in c.published} for c in cols}
    fig = plot.side_by_side(stacks, figures, {c.name: measured(c.result) for c in cols}, ranges,
                            "sparkrig bench: " + " vs ".join(stacks))  # fmt: skip
    stem.parent.mkdir(parents=True, exist_ok=True)
    return plot.save(fig, stem)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python3 -m sparkrig.bench compare", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("results", nargs="+", type=Path, help="bench result JSON files, one per stack")
    p.add_argument("--published", type=Path, help="published figures per stack and protocol "
                   "(JSON; sparkrig/bench/published.py gives the form)")  # fmt: skip
    p.add_argument("--out", type=Path, help="the figure's path without suffix (.svg and .png)")
    p.add_argument("--tolerance", type=float, default=expected.DEFAULT_TOLERANCE)
    return p


def main(argv: list[str], results_dir: Path) -> int:
    args = parser().parse_args(argv)
    try:
        table_ = published.load(args.published) if args.published else None
        cols = columns(args.results, table_)
    except (OSError, ValueError) as exc:
        print(f"bench compare: {exc}", file=sys.stderr)
        return 2
    stem = args.out or results_dir / time.strftime("compare-%Y%m%dT%H%M%SZ", time.gmtime())
    print(table(cols, args.tolerance))
    svg, png = draw(cols, stem)
    print(f"\nSVG: {svg}\nPNG: {png}")
    return 0
