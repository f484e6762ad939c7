"""python3 -m sparkrig.config group-data|table [--write]: group_data/all.py, or docs/
configuration.md's knob table, as sparkrig/config/knobs.py declares the knobs: printed, or
written in place (the file, or the table between its markers) when it differs."""

from __future__ import annotations

import argparse
import sys

from sparkrig.config import generate


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m sparkrig.config", description=__doc__)
    p.add_argument("what", choices=("group-data", "table"))
    p.add_argument("--write", action="store_true", help="write it in place instead of printing")
    args = p.parse_args(argv)
    if args.what == "group-data":
        path, new = generate.GROUP_DATA, generate.group_data()
        old = path.read_text() if path.exists() else ""
    else:
        path = generate.DOC
        old = path.read_text()
        new = generate.rewritten(old)
    if not args.write:
        sys.stdout.write(new if args.what == "group-data" else generate.table() + "\n")
    elif new != old:
        path.write_text(new)
        print(f"{path.relative_to(generate.REPO)}: written")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
