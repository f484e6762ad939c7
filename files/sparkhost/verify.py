"""``sparkhost verify``: check a lockfile's files on disk. ``--mode quick`` trusts valid stamps
and hashes only unstamped files; ``full`` re-hashes everything in parallel. One JSON line; exit 0
when every file matches."""

from __future__ import annotations

import argparse
import json
import os
import time

from sparkhost.common import EXIT_FAILED, EXIT_OK
from sparkhost.lockfile import load_lock
from sparkhost.stamps import Stamps, add_lock_args, classify, default_stamps, parallel_hash


def cmd_verify(args: argparse.Namespace) -> int:
    lock, entries = load_lock(args.lock)
    stamps = Stamps(args.stamps or default_stamps(args.dest))
    t0 = time.monotonic()
    c = classify(entries, args.dest, stamps)
    to_hash = [e for e, _ in c["unverified"]]
    ok = [e for e, _ in c["verified"]]
    if args.mode == "full":
        to_hash += ok
        ok = []
    bad: list[str] = [e.path for e, _ in c["mismatched"]]
    hashed = 0
    for e, good, _err in parallel_hash(to_hash, args.dest, args.jobs):
        hashed += e.size
        if good:
            stamps.put(e, os.path.join(args.dest, e.path))
            ok.append(e)
        else:
            stamps.drop(e.path)
            bad.append(e.path)
    if to_hash and os.access(os.path.dirname(stamps.path) or ".", os.W_OK):
        stamps.save()
    el = time.monotonic() - t0
    missing = [e.path for e, _ in c["missing"]] + [e.path for e, _ in c["partial"]]
    res = {
        "mode": args.mode,
        "repo": lock["repo"],
        "commit": lock["commit"],
        "total_files": len(entries),
        "verified": len(ok),
        "mismatched": sorted(bad),
        "missing": sorted(missing),
        "hashed_bytes": hashed,
        "seconds": round(el, 3),
        "hash_rate": round(hashed / el) if el > 0 and hashed else None,
    }
    print(json.dumps(res, sort_keys=True))
    return EXIT_OK if len(ok) == len(entries) else EXIT_FAILED


def build_parser() -> argparse.ArgumentParser:
    v = argparse.ArgumentParser(prog="sparkhost verify", description=__doc__.split("\n")[0])
    add_lock_args(v)
    v.add_argument("--mode", choices=["quick", "full"], default="quick")
    return v


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.dest = os.path.abspath(args.dest)
    return cmd_verify(args)
