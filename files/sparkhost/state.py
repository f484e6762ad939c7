"""``sparkhost state``: one JSON object saying what of a lockfile is on disk, for the deploy's
state read (read-only: stat and stamps, never a hash; always exit 0, a fact must never fail)."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from sparkhost.common import EXIT_OK
from sparkhost.lockfile import load_lock
from sparkhost.stamps import Stamps, add_lock_args, classify, default_stamps, default_status


def state_of(lock_path: str, dest: str, stamps_path: str | None) -> dict[str, Any]:
    lock, entries = load_lock(lock_path)
    stamps = Stamps(stamps_path or default_stamps(dest))
    c = classify(entries, dest, stamps)
    fetch_bytes = sum(e.size for e, _ in c["missing"] + c["mismatched"])
    fetch_bytes += sum(e.size - have for e, have in c["partial"])
    # unverified files (right size, no stamp) get hashed first; count them as to fetch (worst case)
    fetch_bytes += sum(e.size for e, _ in c["unverified"])
    return {
        "repo": lock["repo"],
        "commit": lock["commit"],
        "total_files": len(entries),
        "total_bytes": sum(e.size for e in entries),
        "verified": len(c["verified"]),
        "unverified": len(c["unverified"]),
        "missing": len(c["missing"]),
        "partial": len(c["partial"]),
        "mismatched": len(c["mismatched"]),
        "files_to_fetch": len(entries) - len(c["verified"]),
        "bytes_to_fetch": fetch_bytes,
    }


def cmd_state(args: argparse.Namespace) -> int:
    try:
        res: dict[str, Any] = state_of(args.lock, args.dest, args.stamps)
        res["ok"] = True
    except Exception as e:  # a fact must never fail the host
        res = {"ok": False, "error": f"{type(e).__name__}: {e}"}
    try:
        with open(args.status or default_status(args.dest)) as fh:
            st = json.load(fh)
        res["fetch"] = {k: st.get(k) for k in ("state", "pid", "bytes_done", "files_done")}
    except (OSError, ValueError):
        res["fetch"] = None
    print(json.dumps(res, sort_keys=True))
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    s = argparse.ArgumentParser(prog="sparkhost state", description=__doc__.split("\n")[0])
    add_lock_args(s)
    s.add_argument("--status")
    return s


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.dest = os.path.abspath(args.dest)
    return cmd_state(args)
