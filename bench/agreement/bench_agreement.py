#!/usr/bin/env python3
"""Timing agreements: the figures the suite no longer asserts, because they depend on how busy
the machine is (issue 32). Results go to docs/bench.md ("Timing agreements") by hand.

  python3 bench/agreement/bench_agreement.py [--out bench/agreement/results.json] [--no-vllm]

Each agreement measures the lab's stand-in (lab/standin_vllm.py, exact configured rates) on
127.0.0.1 and compares two figures within a tolerance:
  rates        the bench's figures against the stand-in's configured rates (3%): single stream
               with 3 tokens a chunk, 2 and 4 streams, prefill at 8K and 16K
  slow         the slow variant (STANDIN_SPEED=0.7, the lab's lab-slow image) at 70 tok/s (3%)
  vllm         `vllm bench serve` and the bench on the same stand-in (5%): output tok/s at 4
               streams, and per stream against 1000 / median TPOT (needs requirements-vllm.txt)
  gate         the release gate's short bench, as the deploy runs it: the same release measured
               twice stays within bench_tolerance (10%); the slow variant falls below 90%
The suite keeps what does not depend on the load (tests/bench: both clients complete and count
the same tokens, the configured speed, the gate's judgement of given figures). Exit 1 when an
agreement is outside its tolerance.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from sparkrig import benchgate as bg  # noqa: E402
from sparkrig.bench import Endpoint, Protocol, measure  # noqa: E402
from sparkrig.scripts import load_script  # noqa: E402

helpers = load_script("bench_helpers", ROOT / "tests" / "bench" / "bench_helpers.py")
MODEL, standin, within = helpers.MODEL, helpers.standin, helpers.within

Row = dict[str, Any]


def row(agreement: str, figure: str, measured: float | None, wanted: float, tol: float) -> Row:
    """``measured`` within ``tol`` of ``wanted``."""
    rule, ok = f"within {tol:.0%} of {wanted:.2f}", within(measured, wanted, tol)
    return {"agreement": agreement, "figure": figure, "measured": measured, "rule": rule, "ok": ok}


def below(agreement: str, figure: str, measured: float | None, limit: float) -> Row:
    """``measured`` under ``limit``."""
    rule, ok = f"below {limit:.2f}", measured is not None and measured < limit
    return {"agreement": agreement, "figure": figure, "measured": measured, "rule": rule, "ok": ok}


def rates(tmp: Path) -> list[Row]:
    decode, prefill = 250.0, 8000.0
    proto = Protocol(decode_tokens=400, repeats=3, prompts=1, streams=(2, 4),
                     contexts=(8192, 16384), tool=False, fffd_tokens=0)  # fmt: skip
    flags = ("--standin-decode-tok-s", str(decode), "--standin-prefill-tok-s", str(prefill),
             "--standin-tokens-per-chunk", "3")  # fmt: skip
    with standin(tmp, *flags) as url:
        r = measure(Endpoint(url, MODEL), proto)
    rows = [row("rates", "single stream tok/s", r["single_stream_tok_s"], decode, 0.03)]
    rows += [row("rates", f"{n} streams tok/s", r["decode_tok_s"].get(str(n)), n * decode, 0.03)
             for n in (2, 4)]  # fmt: skip
    rows += [row("rates", f"prefill tok/s at {p['target_tokens']}", p["prefill_tok_s"], prefill,
                 0.03) for p in r["prefill"]]  # fmt: skip
    return rows


def slow(tmp: Path) -> list[Row]:
    # 70 tok/s (14 ms a token): a token's pacing, not a loaded CPU's, sets the figure
    proto = Protocol(decode_tokens=140, repeats=1, prompts=2, streams=(), contexts=(),
                     tool=False, fffd_tokens=0)  # fmt: skip
    env = {"STANDIN_SPEED": "0.7", "STANDIN_DECODE_TOK_S": "100"}
    with standin(tmp, env=env) as url:
        r = measure(Endpoint(url, MODEL), proto)
    return [row("slow", "single stream tok/s", r["single_stream_tok_s"], 70.0, 0.03)]


def vllm(tmp: Path) -> list[Row]:
    helpers.vllm_cpu()
    tokenizer = helpers.word_tokenizer(tmp / "tokenizer")
    proto = Protocol(decode_tokens=256, repeats=2, prompts=1, streams=(4,), contexts=(),
                     tool=False, fffd_tokens=0)  # fmt: skip
    flags = ("--standin-decode-tok-s", "300", "--standin-tokens-per-chunk", "2",
             "--max-num-seqs", "8")  # fmt: skip
    with standin(tmp, *flags) as url:
        ours = measure(Endpoint(url, MODEL), proto)
        theirs = helpers.vllm_bench_serve(url, tokenizer, tmp / "vb", 4, 8, 256)
    return [
        row("vllm", "4 streams tok/s (bench vs vllm bench serve)", ours["decode_tok_s"].get("4"),
            theirs["output_throughput"], 0.05),
        row("vllm", "per stream tok/s (bench vs 1000 / median TPOT)",
            ours["per_stream_tok_s"].get("4"), 1000 / theirs["median_tpot_ms"], 0.05),
    ]  # fmt: skip


def gate(tmp: Path) -> list[Row]:
    bg.RESULTS_DIR = tmp / "results"

    def short(speed: str) -> dict[str, Any]:
        (tmp / speed).mkdir(exist_ok=True)
        with standin(tmp / speed, "--standin-decode-tok-s", "400",
                     env={"STANDIN_SPEED": speed}) as url:  # fmt: skip
            return bg.run_short_bench(bg.Target(url, MODEL, None, "shared"), timeout_s=300)

    base = bg.figures_of(short("1"))
    again, slow_ = bg.figures_of(short("1")), bg.figures_of(short("0.7"))
    rows = []
    for key in ("single_stream_tok_s", "decode_tok_s.4"):
        rows.append(row("gate", f"{key}, the same release again", again[key], base[key], 0.10))
        ratio = slow_[key] / base[key] if slow_[key] and base[key] else None
        # the slow variant (configured at 70%) must fail the gate: below 90% of the baseline
        rows.append(below("gate", f"{key}, slow variant / baseline", ratio, 0.9))
    return rows


AGREEMENTS: dict[str, Callable[[Path], list[Row]]] = {
    "rates": rates, "slow": slow, "vllm": vllm, "gate": gate,
}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help="write the figures as JSON here")
    ap.add_argument("--no-vllm", action="store_true", help="leave out `vllm bench serve`")
    args = ap.parse_args()
    names = [n for n in AGREEMENTS if not (n == "vllm" and args.no_vllm)]
    if "vllm" in names and importlib.util.find_spec("vllm") is None:
        sys.exit("vllm is not installed (requirements-vllm.txt, `make deps`): use --no-vllm")
    rows: list[Row] = []
    load_before = os.getloadavg()
    started = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            (Path(tmp) / name).mkdir()
            rows += AGREEMENTS[name](Path(tmp) / name)
    for r in rows:
        measured = "none" if r["measured"] is None else f"{r['measured']:.2f}"
        print(f"{'ok ' if r['ok'] else 'OFF'} {r['agreement']:6} {r['figure']:48} {measured:>9} "
              f"{r['rule']}")  # fmt: skip
    result = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "seconds": round(time.time() - started, 1),
        "cpus": os.cpu_count(),
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
        "rows": rows,
    }
    print(f"{len(rows)} figures in {result['seconds']} s on {result['cpus']} CPUs, load average "
          f"{load_before[0]:.2f} before, {result['loadavg_after'][0]:.2f} after")  # fmt: skip
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
