"""The bench's outputs: one JSON per run in a results directory, a printed table, a figure
(SVG and PNG)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from . import plot, published, seed004


def run_name(result: dict[str, Any]) -> str:
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(result.get("started_unix", time.time())))
    if result.get("protocol_name") == seed004.NAME:
        return f"bench-{stamp}-{result.get('stack') or 'endpoint'}-{seed004.NAME}"
    return f"bench-{stamp}-{result.get('profile') or 'endpoint'}"


def write(result: dict[str, Any], results_dir: Path, json_path: Path | None
          ) -> tuple[Path, list[Path]]:  # fmt: skip
    """Write the run's JSON (``json_path``, else into ``results_dir``) and its figure beside it
    (SVG and PNG)."""
    results_dir.mkdir(parents=True, exist_ok=True)
    out = json_path or results_dir / f"{run_name(result)}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    return out, plot.save(figure(result), out.with_suffix(""))


def figure(result: dict[str, Any]) -> Figure:
    """Seed 000's protocol: its curves; seed 004's: its five figures as bars, each against the
    stack's published one."""
    figures = published.figures_for(result)
    if result.get("protocol_name") != seed004.NAME:
        return plot.seed000(result, figures)
    name = result.get("stack") or "endpoint"
    values = {k: v for k in seed004.FIGURES if (v := result.get(k)) is not None}
    return plot.side_by_side([name], list(seed004.FIGURES), {name: values},
                             {name: {e.figure: (e.low, e.high) for e in figures}},
                             f"sparkrig bench, seed 004 protocol: {name}")  # fmt: skip


def num(v: Any, unit: str = "") -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "ok" if v else "FAILED"
    if isinstance(v, list):
        return f"{v[0]:g}-{v[1]:g}{unit}"
    if isinstance(v, float | int):
        return f"{int(v)}{unit}" if float(v).is_integer() else f"{v:g}{unit}"
    return str(v)


def table(result: dict[str, Any]) -> str:
    """The figures, then each expected (or the stack's published) figure against its
    measurement."""
    profile = result.get("profile") or "(none: --profile P compares)"
    lines = [f"sparkrig bench: {result.get('url')} model {result.get('model')} profile {profile}"
             f" stack {result.get('stack') or '-'} protocol "
             f"{result.get('protocol_name') or 'seed000'}"]  # fmt: skip

    def row(label: str, value: Any, note: str = "") -> None:
        lines.append(f"{label:<30} {num(value):>12}   {note}".rstrip())

    row("figure", "measured")
    if result.get("protocol_name") == seed004.NAME:
        for w in result.get("workloads") or []:
            row(f"{w['workload']} decode tok/s", w["decode_tok_s"],
                f"{w['completion_tokens']} tokens ({w['finish_reason']}), reasoning "
                f"{w['reasoning_effort'] or 'not sent'}")  # fmt: skip
            row(f"{w['workload']} prefill tok/s", w["prefill_tok_s"],
                f"{w['prompt_tokens']} prompt tokens, TTFT {num(w['ttft_s'])} s")  # fmt: skip
    else:
        seed000_rows(result, row)
    drafter_rows(result, row)
    verdicts = result.get("verdicts") or []
    if verdicts:
        lines.append(f"\nagainst the expected figures (tolerance {result.get('tolerance'):g}):")
    for v in verdicts:
        lines.append(
            f"  {v['figure']:<22} measured {num(v['measured']):>9}  expected "
            f"{num(v['expected']):>11}  {v['status'].upper():<12} {v['source']}"
        )
        lines.append(f"      {v['condition']}")
        if v["causes"]:
            lines.append(f"      likely causes: {v['causes']}")
    lines += [f"ERROR {err}" for err in result.get("errors") or []]
    return "\n".join(lines)


def seed000_rows(result: dict[str, Any], row: Callable[..., None]) -> None:
    spread = result.get("spread") or {}

    def p10(name: str) -> str:
        s = spread.get(name)
        return f"; p10 {s['p10']:g} of {s['n']}" if isinstance(s, dict) else ""

    row("single stream tok/s", result.get("single_stream_tok_s"),
        f"passes {result.get('single_stream_passes')}{p10('single_stream_tok_s')}")  # fmt: skip
    row("TTFT p50, prose (s)", result.get("ttft_p50_s"))
    per_stream = result.get("per_stream_tok_s") or {}
    for k, v in (result.get("decode_tok_s") or {}).items():
        per = per_stream.get(k)
        note = (f"{per:g} per stream" if per else "") + p10(f"decode_tok_s.{k}")
        row(f"{k} stream(s) aggregate tok/s", v, note.removeprefix("; "))
    for r in result.get("prefill") or []:
        recall = "ok" if r["recall"] else "MISSED"
        decode = f", then decode {r['decode_tok_s']:g} tok/s" if r.get("decode_tok_s") else ""
        row(f"prefill {r['prompt_tokens']} tok, tok/s", r["prefill_tok_s"],
            f"TTFT {r['ttft_s']:g} s, recall {recall}{decode}")  # fmt: skip
    row("tool call (required)", result.get("tool_call_ok"), result.get("tool_call_detail", ""))
    row("U+FFFD per 10k chars", result.get("fffd_per_10k_chars"),
        f"{result.get('fffd_count')} in {result.get('fffd_chars')} characters")  # fmt: skip


def drafter_rows(result: dict[str, Any], row: Callable[..., None]) -> None:
    """The drafter's acceptance over the run and which drafter files it was (a result from
    before they were recorded has neither: nothing is printed)."""
    if "spec_acceptance" not in result:
        return
    spec = result.get("spec_decode") or {}
    share = result.get("spec_acceptance")
    note = (f"{spec.get('accepted_tokens')} of {spec.get('draft_tokens')} draft tokens, mean "
            f"acceptance length {num(result.get('spec_acceptance_length'))}"
            if share is not None else str(spec.get("note", "")))  # fmt: skip
    row("drafter acceptance", share, note)
    drafter = result.get("drafter")
    if isinstance(drafter, dict):
        weights = ", ".join(f"{k} {v[:12]}" for k, v in (drafter.get("weights_sha256") or {})
                            .items())  # fmt: skip
        row("drafter", f"{drafter.get('repo')}@{str(drafter.get('commit'))[:12]}",
            f"lockfile sha256 {str(drafter.get('lockfile_sha256'))[:12]}"
            + (f"; {weights}" if weights else ""))  # fmt: skip
