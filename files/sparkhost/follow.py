"""``sparkhost follow``: print the progress a running fetch writes to its status file, until the
fetch ends (exit 0 done, 1 failed or gone, 3 on --timeout while it still runs). With ``--unit``
(the deploy's transient fetch unit) a status an earlier run wrote is not taken for this one's."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

from sparkhost.common import EXIT_FAILED, EXIT_OK, progress_line
from sparkhost.units import pid_alive, unit_active, unit_main_pid


def cmd_follow(args: argparse.Namespace) -> int:
    deadline = time.monotonic() + args.timeout if args.timeout else None
    last = None
    printed_at = -1e18
    alive: Callable[[dict[str, Any] | None], bool]
    if args.unit:
        alive = lambda s: unit_active(args.unit)  # noqa: E731
    else:
        alive = lambda s: bool(s and pid_alive(int(s.get("pid", 0))))  # noqa: E731
    while True:
        try:
            with open(args.status) as fh:
                s: dict[str, Any] | None = json.load(fh)
        except (OSError, ValueError):
            s = None
        if s is not None and args.unit:
            main_pid = unit_main_pid(args.unit)
            if main_pid and int(s.get("pid", 0)) != main_pid:
                s = None  # a previous run's status: the running fetch has not written yet
        if s is not None:
            line = progress_line(s)
            ended = s.get("state") in ("done", "failed")
            due = time.monotonic() - printed_at >= args.print_every
            if line != last and (due or ended):
                print(line, flush=True)
                last, printed_at = line, time.monotonic()
            if s.get("state") == "done":
                return EXIT_OK
            if s.get("state") == "failed":
                for f in s.get("failed", []):
                    print(f"FAILED {f['path']}: {f['error']}", flush=True)
                return EXIT_FAILED
        if not alive(s):
            time.sleep(1)  # the final status write may race the exit
            try:
                with open(args.status) as fh:
                    s = json.load(fh)
                if s and s.get("state") == "done":
                    print(progress_line(s), flush=True)
                    return EXIT_OK
            except (OSError, ValueError):
                pass
            print("fetch is not running and did not finish", flush=True)
            return EXIT_FAILED
        if deadline is not None and time.monotonic() > deadline:
            print("follow: timeout (the fetch keeps running)", flush=True)
            return 3
        time.sleep(args.interval)


def build_parser() -> argparse.ArgumentParser:
    fo = argparse.ArgumentParser(prog="sparkhost follow", description=__doc__.split("\n")[0])
    fo.add_argument("--status", required=True)
    fo.add_argument("--unit", help="systemd unit to watch (else the pid in the status)")
    fo.add_argument("--interval", type=float, default=10.0)
    fo.add_argument("--print-every", type=float, default=0.0,
                    help="seconds between progress lines (the last always printed)")  # fmt: skip
    fo.add_argument("--timeout", type=float, default=0.0)
    return fo


def main(argv: list[str] | None = None) -> int:
    return cmd_follow(build_parser().parse_args(argv))
