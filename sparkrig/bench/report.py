"""The bench's outputs: one JSON per run in a results directory, a printed table, a PNG."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from . import expected, png


def run_name(result: dict[str, Any]) -> str:
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(result.get("started_unix", time.time())))
    return f"bench-{stamp}-{result.get('profile') or 'endpoint'}"


def write(result: dict[str, Any], results_dir: Path, json_path: Path | None) -> tuple[Path, Path]:
    """Write the run's JSON (``json_path``, else into ``results_dir``) and its PNG beside it."""
    results_dir.mkdir(parents=True, exist_ok=True)
    out = json_path or results_dir / f"{run_name(result)}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    picture = out.with_suffix(".png")
    picture.write_bytes(plot(result))
    return out, picture


def _expected_points(result: dict[str, Any], figure: str) -> list[expected.Expected]:
    return [e for e in expected.EXPECTED if e.profile == result.get("profile")
            and e.figure == figure]  # fmt: skip


def plot(result: dict[str, Any]) -> bytes:
    decode = result.get("decode_tok_s") or {}
    streams = sorted(int(k) for k in decode)
    for e in expected.EXPECTED:
        if e.profile == result.get("profile") and e.figure.startswith("decode_tok_s."):
            n = int(e.figure.split(".")[1])
            streams = sorted(set(streams) | {n})
    exp_single = _expected_points(result, "single_stream_tok_s")
    if exp_single:
        streams = sorted(set(streams) | {1})
    idx = {n: i for i, n in enumerate(streams)}
    tok = png.Panel("DECODE TOK/S VS STREAMS", [str(n) for n in streams])
    tok.series.append(png.Series("MEASURED", [(idx[int(k)], v) for k, v in decode.items()],
                                 png.BLUE))  # fmt: skip
    exp = [
        (idx[int(e.figure.split(".")[1])], e.low)
        for e in expected.EXPECTED
        if e.profile == result.get("profile") and e.figure.startswith("decode_tok_s.")
    ]
    exp += [(idx[1], e.low) for e in exp_single[:1]]
    if exp:
        tok.series.append(png.Series("EXPECTED", exp, png.ORANGE, line=False))  # fmt: skip

    rows = sorted(result.get("prefill") or [], key=lambda r: r["prompt_tokens"])
    labels = [f"{round(r['prompt_tokens'] / 1024)}K" for r in rows]
    pre = png.Panel("PREFILL TOK/S VS CONTEXT", labels)
    pre.series.append(png.Series("MEASURED", [(i, r["prefill_tok_s"] or 0.0)
                                              for i, r in enumerate(rows)], png.BLUE))  # fmt: skip
    for e in _expected_points(result, "prefill_tok_s")[:1]:
        pre.bands.append((e.low, e.high, "EXPECTED"))
    ttft = png.Panel("TTFT (S) VS CONTEXT", labels)
    ttft.series.append(png.Series("MEASURED", [(i, r["ttft_s"]) for i, r in enumerate(rows)],
                                  png.BLUE))  # fmt: skip
    return png.plot([tok, pre, ttft])


def _num(v: Any, unit: str = "") -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "ok" if v else "FAILED"
    if isinstance(v, list):
        return f"{v[0]:g}-{v[1]:g}{unit}"
    return f"{v:g}{unit}" if isinstance(v, float | int) else str(v)


def table(result: dict[str, Any]) -> str:
    """The figures, then each expected figure of the profile against its measurement."""
    profile = result.get("profile") or "(none: --profile P compares)"
    lines = [f"sparkrig bench: {result.get('url')} model {result.get('model')} profile {profile}"]

    def row(label: str, value: Any, note: str = "") -> None:
        lines.append(f"{label:<30} {_num(value):>12}   {note}".rstrip())

    row("figure", "measured")
    row("single stream tok/s", result.get("single_stream_tok_s"),
        f"passes {result.get('single_stream_passes')}")  # fmt: skip
    row("TTFT p50, prose (s)", result.get("ttft_p50_s"))
    per_stream = result.get("per_stream_tok_s") or {}
    for k, v in (result.get("decode_tok_s") or {}).items():
        per = per_stream.get(k)
        row(f"{k} stream(s) aggregate tok/s", v, f"{per:g} per stream" if per else "")
    for r in result.get("prefill") or []:
        recall = "ok" if r["recall"] else "MISSED"
        row(f"prefill {r['prompt_tokens']} tok, tok/s", r["prefill_tok_s"],
            f"TTFT {r['ttft_s']:g} s, recall {recall}")  # fmt: skip
    row("tool call (required)", result.get("tool_call_ok"), result.get("tool_call_detail", ""))
    row("U+FFFD per 10k chars", result.get("fffd_per_10k_chars"),
        f"{result.get('fffd_count')} in {result.get('fffd_chars')} characters")  # fmt: skip
    verdicts = result.get("verdicts") or []
    if verdicts:
        lines.append(f"\nagainst the expected figures (tolerance {result.get('tolerance'):g}):")
    for v in verdicts:
        lines.append(
            f"  {v['figure']:<22} measured {_num(v['measured']):>9}  expected "
            f"{_num(v['expected']):>11}  {v['status'].upper():<12} {v['source']}"
        )
        lines.append(f"      {v['condition']}")
        if v["causes"]:
            lines.append(f"      likely causes: {v['causes']}")
    lines += [f"ERROR {err}" for err in result.get("errors") or []]
    return "\n".join(lines)
