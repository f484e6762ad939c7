"""python3 -m sparkrig.bench: the seeds' measurement protocols against the pair or any endpoint.

    python3 -m sparkrig.bench --inventory inventory.py          # the head the deploy made
    python3 -m sparkrig.bench --url https://host:8000 --model NAME [--api-key-file F] [--cacert CA]
                               [--profile P] [--drafter-lock LOCKFILE]
    python3 -m sparkrig.bench ... --protocol seed004 --stack NAME   # seed 004's protocol
    python3 -m sparkrig.bench compare A.json B.json ...          # results side by side

--protocol seed000 (the default) is seeds 000 and 003's protocol (sparkrig/bench/protocol.py),
seed004 seed 004's (sparkrig/bench/seed004.py). One JSON per run under --results-dir (default
bench/results), or at --json PATH; its figure beside it (SVG and PNG); a table on stdout with each
figure against the running profile's expected one, or the stack's published one (docs/bench.md).
Exit status: 0 when every measurement ran, 1 when one failed (an error listed), 2 on bad usage.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from sparkhost.gate import read_api_key

from . import compare, expected, published, report, seed004, specdecode, target
from .client import Endpoint
from .protocol import SHORT, Protocol, measure

REPO = Path(__file__).resolve().parents[2]
PROFILES = ("single", "shared", "guard", "long")
PROTOCOLS = ("seed000", seed004.NAME)
SEED000_ONLY = ("short", "decode_tokens", "repeats", "prompts", "streams", "contexts",
                "context_decode_tokens", "fffd_tokens", "no_tool")  # fmt: skip


def ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x.strip().upper().removesuffix("K")) * (1024 if x.strip().upper()
                     .endswith("K") else 1) for x in text.split(",") if x.strip())  # fmt: skip
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of integers: {text!r}") from None


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python3 -m sparkrig.bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--inventory", help="measure this inventory's head (url, model, profile, "
                       "key file as the deploy made them)")  # fmt: skip
    where.add_argument("--url", help="an OpenAI-compatible endpoint, e.g. http://host:8000")
    p.add_argument("--model", help="served model name (with --url)")
    p.add_argument("--api-key-file", help="file holding the API key (sent as a Bearer token)")
    p.add_argument("--cacert", help="CA file an https URL's certificate is checked against "
                   "(with --inventory, default: the pair's, api_tls_dir/ca.crt)")  # fmt: skip
    p.add_argument("--profile", choices=PROFILES, help="compare with this profile's figures")
    p.add_argument("--drafter-lock", help="the served drafter's lockfile: its repo, commit and "
                   "digest are recorded beside the acceptance (with --inventory, default: the "
                   "one the deploy fetched it by, when its profile loads one)")  # fmt: skip
    p.add_argument("--protocol", choices=PROTOCOLS, default="seed000",
                   help="seed000: seeds 000/003's (default); seed004: seed 004's")  # fmt: skip
    p.add_argument("--stack", help="the stack measured, recorded in the result (compare judges "
                   "it against that stack's published figures; with --inventory, default: the "
                   "stack the inventory deploys)")  # fmt: skip
    p.add_argument("--nnodes", type=int, help="the rank count measured, recorded in the result "
                   "(a stack's figures of one rank count apply to it only; with --inventory, "
                   "default: the inventory's)")  # fmt: skip
    p.add_argument("--json", type=Path, help="write the run's JSON here (figure beside it)")
    p.add_argument("--results-dir", type=Path, default=REPO / "bench" / "results")
    p.add_argument("--short", action="store_true", help="the release gate's short bench")
    p.add_argument(
        "--pair-only",
        action="store_true",
        help="behind one endpoint of several "
        "pairs: measure the pair of the head dialled alone (docs/pairs.md)",
    )
    p.add_argument("--decode-tokens", type=int, help="forced tokens per request (512)")
    p.add_argument("--repeats", type=int, help="passes / waves per figure, median taken (3)")
    p.add_argument("--prompts", type=int, help="prose prompts per pass (8)")
    p.add_argument("--streams", type=ints, help="parallel streams (2,4,8)")
    p.add_argument("--contexts", type=ints, help="prefill prompt sizes (8K,32K,128K); longer "
                   "ones are opt-in, up to the model's context")  # fmt: skip
    p.add_argument("--context-decode-tokens", type=int, help="tokens forced after each long "
                   "prompt, the long-context decode (512; 0: the recall answer only)")  # fmt: skip
    p.add_argument("--fffd-tokens", type=int, help="length of the Japanese answer (4096; 0: skip)")
    p.add_argument("--no-tool", action="store_true", help="skip the tool-call probe")
    p.add_argument("--tolerance", type=float, default=expected.DEFAULT_TOLERANCE)
    return p


def protocol_of(args: argparse.Namespace) -> Protocol:
    base = SHORT if args.short else Protocol()
    changes = {
        "decode_tokens": args.decode_tokens, "repeats": args.repeats, "prompts": args.prompts,
        "streams": args.streams, "contexts": args.contexts, "fffd_tokens": args.fffd_tokens,
        "context_decode_tokens": args.context_decode_tokens,
    }  # fmt: skip
    p = Protocol(**{**base.as_dict(), **{k: v for k, v in changes.items() if v is not None}})
    p.tool = p.tool and not args.no_tool
    return p


def measured_stack(given: str | None, inventory_target: dict[str, Any]) -> str:
    """The stack an --inventory run measures: ``--stack`` when given, else the one the inventory
    and its group data deploy (``stack`` knob), else the default stack."""
    return given or inventory_target.get("stack") or published.DEFAULT_STACK


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["compare"]:
        return compare.main(argv[1:], REPO / "bench" / "results")
    args = parser().parse_args(argv)
    if args.protocol == seed004.NAME:
        given = [f"--{n.replace('_', '-')}" for n in SEED000_ONLY if getattr(args, n) not in
                 (None, False)]  # fmt: skip
        if given:
            parser().error(f"{', '.join(given)}: seed 000's protocol only, not --protocol seed004")
    if args.inventory:
        t = target.read(args.inventory, Path.cwd())
        url, model, profile = t["url"], args.model or t["model"], args.profile or t["profile"]
        key_file = args.api_key_file or t["api_key_file"]
        ca_file = args.cacert or t.get("ca_file")
        stack = measured_stack(args.stack, t)
        nnodes = args.nnodes or t.get("nnodes")
        drafter_lock = args.drafter_lock or t.get("drafter_lock")
    else:
        if not args.model:
            parser().error("--url needs --model (the served model name)")
        url, model, profile, key_file = args.url, args.model, args.profile, args.api_key_file
        ca_file = args.cacert
        stack, nnodes, drafter_lock = args.stack, args.nnodes, args.drafter_lock
    try:
        key = read_api_key(key_file) if key_file else ""
    except (OSError, ValueError) as exc:
        print(f"bench: API key file {key_file}: {exc}", file=sys.stderr)
        return 2
    try:
        drafter = specdecode.drafter_identity(drafter_lock) if drafter_lock else None
    except (OSError, ValueError) as exc:
        print(f"bench: drafter lockfile {drafter_lock}: {exc}", file=sys.stderr)
        return 2
    proto: Protocol | seed004.Seed004 = (
        seed004.Seed004() if args.protocol == seed004.NAME else protocol_of(args)
    )
    ep = Endpoint(url, model, key, verify=ca_file or True, pair_only=args.pair_only)
    why = ep.unanswered()
    if why:  # one line, nothing measured, nothing written
        print(f"bench: {why}; nothing measured, nothing written", file=sys.stderr)
        return 1
    started = time.time()
    print(f"bench: {url} model {model} profile {profile or '-'} stack {stack or '-'}; protocol "
          f"{args.protocol} {proto.as_dict()}", flush=True)  # fmt: skip
    result = {
        "schema": "sparkrig-bench/1",
        "started_unix": round(started, 3),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "url": url, "model": model, "profile": profile, "stack": stack,
        "protocol_name": args.protocol, "protocol": proto.as_dict(), "tolerance": args.tolerance,
    }  # fmt: skip
    if nnodes:
        result["nnodes"] = nnodes
    result["drafter"] = drafter  # None: no drafter named (none served, or --url without one)
    log = lambda m: print(f"  {m}", flush=True)  # noqa: E731
    if isinstance(proto, seed004.Seed004):
        result.update(seed004.measure(ep, proto, log=log))
    else:
        result.update(measure(ep, proto, log=log))
    # against the stack's own published figures (today's recipe: the profile's expected ones)
    result["verdicts"] = expected.verdicts_of(published.figures_for(result), result,
                                              args.tolerance)  # fmt: skip
    result["duration_s"] = round(time.time() - started, 1)
    out, pictures = report.write(result, args.results_dir, args.json)
    print(report.table(result))
    print(f"\nJSON: {out}\n" + "\n".join(f"{p.suffix[1:].upper()}:  {p}" for p in pictures))
    return 1 if result["errors"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
