"""The endpoint of several pairs against one pair: the bench's aggregate decode (tok/s over N
parallel streams) through one head's front twice, balanced over every pair and pinned to that
head's pair alone (``--pair-only``), with the same protocol; the ratio per stream count.

    python3 -m bench.pairs.aggregate --url https://127.0.0.1:28000 --model glm-5.3-flash \\
        --api-key-file .sparkrig/api-key --cacert .sparkrig/tls/ca.crt \\
        --out bench/results/pairs-lab/aggregate.json

docs/pairs.md has the figures of the lab's run and what they mean on Sparks."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def bench(args: argparse.Namespace, pair_only: bool, out: Path) -> dict[str, Any]:
    argv = [
        sys.executable, "-m", "sparkrig.bench", "--url", args.url, "--model", args.model,
        "--api-key-file", args.api_key_file, "--cacert", args.cacert,
        "--streams", args.streams, "--decode-tokens", str(args.decode_tokens),
        "--repeats", str(args.repeats), "--prompts", "1", "--contexts", "",
        "--fffd-tokens", "0", "--no-tool", "--json", str(out),
    ]  # fmt: skip
    if pair_only:
        argv.append("--pair-only")
    subprocess.run(argv, cwd=REPO, check=True)
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def ratios(endpoint: dict[str, Any], pair: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per stream count: the endpoint's aggregate, one pair's, and their ratio."""
    out = {}
    for n, one in (pair.get("decode_tok_s") or {}).items():
        both = (endpoint.get("decode_tok_s") or {}).get(n)
        ratio = round(both / one, 2) if both and one else None
        out[n] = {"endpoint_tok_s": both, "one_pair_tok_s": one, "ratio": ratio}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m bench.pairs.aggregate", description=__doc__)
    ap.add_argument("--url", required=True, help="one head's API (its front)")
    ap.add_argument("--model", default="glm-5.3-flash")
    ap.add_argument("--api-key-file", default=".sparkrig/api-key")
    ap.add_argument("--cacert", default=".sparkrig/tls/ca.crt")
    ap.add_argument("--streams", default="1,4,8,16")
    ap.add_argument("--decode-tokens", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        pair = bench(args, True, Path(tmp) / "pair.json")
        endpoint = bench(args, False, Path(tmp) / "endpoint.json")
    figures = {
        "url": args.url,
        "protocol": {
            "streams": args.streams,
            "decode_tokens": args.decode_tokens,
            "repeats": args.repeats,
        },  # fmt: skip
        "streams": ratios(endpoint, pair),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(figures, indent=2) + "\n")
    for n, f in figures["streams"].items():
        print(f"{n:>3} streams: endpoint {f['endpoint_tok_s']} tok/s, one pair "
              f"{f['one_pair_tok_s']} tok/s, x{f['ratio']}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
