#!/usr/bin/env python3
"""What re-checking a converged deploy costs on the lab (issue 12; not a test, run by hand).

  python3 bench/noop/bench_noop.py [--inventory lab/inventory.py] [--runs 3] [--out results.json]
                                   [--guest-cpu 0.4]

For sparkrig (deploy.py) and for the plain 20-operation pyinfra deploy in bench/noop/plain
(the yardstick of docs/sources.md, "pyinfra 3.10"), against the same guests in the same sitting:

1. converge once (``-y``; skipped with --no-converge),
2. ``--dry --debug``: remote commands per host (every "Running command on" line of --debug),
3. ``-y --debug`` again, ``--runs`` times: the no-op's remote commands per host and wall time,

then prints both and the ratios (sparkrig / plain). Needs the lab up (python3 -m lab up
[--hosts 4]); run from the repository root. The goal (issue 12): at most 12 commands per host for
--dry, a no-op at most 1.5x the plain deploy's, four guests at most 1.5x two.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PLAIN = Path(__file__).resolve().parent / "plain"
COMMAND = re.compile(r"Running command on (?P<host>[^:\s]+): \(pty=")
UPLOAD = re.compile(r"Attempting upload of .* to ")


def count_commands(debug_output: str) -> dict[str, int]:
    """Remote commands per host, from pyinfra 3.10's --debug log (connectors/ssh.py logs
    "Running command on <host>: (pty=...) <command>" for facts and operations alike)."""
    return dict(Counter(m["host"] for m in COMMAND.finditer(debug_output)))


def pyinfra(args: list[str], cwd: Path) -> tuple[float, str]:
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "pyinfra", *args], cwd=cwd, capture_output=True, text=True
    )
    took = time.monotonic() - start
    output = proc.stdout + proc.stderr
    if proc.returncode != 0:
        sys.stderr.write(output[-4000:])
        raise SystemExit(f"pyinfra {' '.join(args)} failed (exit {proc.returncode}) in {cwd}")
    return took, output


def measure(name: str, inventory: str, deploy: list[str], cwd: Path, runs: int, converge: bool):
    if converge:
        print(f"{name}: converging once", flush=True)
        pyinfra(["-y", *deploy[:-1], inventory, deploy[-1]], cwd)
    print(f"{name}: --dry --debug", flush=True)
    dry_s, dry_out = pyinfra(["--dry", "--debug", *deploy[:-1], inventory, deploy[-1]], cwd)
    noops = []
    for i in range(runs):
        print(f"{name}: -y no-op {i + 1}/{runs}", flush=True)
        took, out = pyinfra(["-y", "--debug", *deploy[:-1], inventory, deploy[-1]], cwd)
        noops.append({"seconds": round(took, 1), "commands": count_commands(out),
                      "uploads": len(UPLOAD.findall(out))})  # fmt: skip
    return {
        "dry": {"seconds": round(dry_s, 1), "commands": count_commands(dry_out)},
        "noop": noops,
        "noop_median_s": statistics.median(n["seconds"] for n in noops),
    }


CPU_CGROUP = Path("/sys/fs/cgroup/cpu")  # cgroup v1's cpu controller (this machine's)


def guest_pids() -> dict[str, int]:
    """The lab's qemu processes by guest name (their command lines start ``qemu-system-x86_64
    -name <guest>``)."""
    found = {}
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if proc.name.isdigit() and argv[0].endswith(b"qemu-system-x86_64") and argv[1] == b"-name":
            found[argv[2].decode()] = int(proc.name)
    return found


@contextlib.contextmanager
def guest_cpu_quota(fraction: float | None):
    """Each lab guest capped at ``fraction`` of a host core for the sitting (a cgroup per qemu,
    CFS quota), so a guest has the same CPU with four guests as with two, as each Spark has its
    own; the cap is lifted afterwards. None: no cap."""
    if fraction is None:
        yield {}
        return
    groups = {}
    try:
        for name, pid in guest_pids().items():
            group = CPU_CGROUP / "sparkrig-bench" / name
            group.mkdir(parents=True, exist_ok=True)
            (group / "cpu.cfs_period_us").write_text("100000")
            (group / "cpu.cfs_quota_us").write_text(str(int(fraction * 100000)))
            (group / "cgroup.procs").write_text(str(pid))
            groups[name] = group
        print(f"each guest capped at {fraction} of a core: {', '.join(sorted(groups))}")
        yield groups
    finally:
        for group in groups.values():
            for pid in (group / "cgroup.procs").read_text().split():
                (CPU_CGROUP / "cgroup.procs").write_text(pid)
            group.rmdir()
        if groups:
            (CPU_CGROUP / "sparkrig-bench").rmdir()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--inventory", default="lab/inventory.py")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--no-converge", action="store_true", help="both deploys already converged")
    ap.add_argument("--out", type=Path, help="write the results as JSON")
    ap.add_argument("--guest-cpu", type=float, help="cap each guest at this share of a core")
    a = ap.parse_args()
    inventory = str((ROOT / a.inventory).resolve())
    converge = not a.no_converge
    with guest_cpu_quota(a.guest_cpu):
        results: dict[str, Any] = {
            "sparkrig": measure("sparkrig", inventory, ["deploy.py"], ROOT, a.runs, converge),
            # from bench/noop/plain (its relative src paths); the repo's group_data is not
            # loaded there, so --sudo stands for its `_sudo = True`
            "plain": measure("plain", inventory, ["--sudo", "deploy.py"], PLAIN, a.runs, converge),
        }
    results["guest_cpu"] = a.guest_cpu
    hosts = sorted(results["sparkrig"]["dry"]["commands"])
    results["hosts"] = len(hosts)
    ratio = results["sparkrig"]["noop_median_s"] / max(results["plain"]["noop_median_s"], 0.1)
    results["noop_ratio"] = round(ratio, 2)
    print(f"\n{len(hosts)} guests; remote commands per host (--dry | -y no-op, last run)")
    for name in ("sparkrig", "plain"):
        r = results[name]
        for h in hosts:
            dry = r["dry"]["commands"].get(h, 0)
            noop = r["noop"][-1]["commands"].get(h, 0)
            print(f"  {name:<9} {h:<12} {dry:>4} | {noop:>4}")
        times = ", ".join(f"{n['seconds']:.1f}" for n in r["noop"])
        print(f"  {name:<9} no-op wall time: median {r['noop_median_s']:.1f} s ({times})")
    worst = max(results["sparkrig"]["dry"]["commands"].values(), default=0)
    print(f"\nsparkrig --dry: at most {worst} commands per host (goal: 12)")
    print(f"no-op time, sparkrig / plain: {ratio:.2f} (goal: at most 1.5)")
    if a.out:
        a.out.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
