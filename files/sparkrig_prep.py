#!/usr/bin/python3
"""Start gate of a sparkrig rank (runs as root in the unit's ExecStartPre).

1. The fabric NIC still has its MTU (a firmware update can reset it to 1500).
2. NCCL_IB_GID_INDEX in the rank's env file still names the RoCE v2 GID ::ffff:<fabric IP>
   (indices move after reboots); on mismatch print the table and fail closed: re-run the deploy.
3. Drop the page cache (it counts as used GPU memory on unified memory) and wait until MemFree,
   not MemAvailable, reaches the floor; otherwise list the top consumers and refuse to start.

Stdlib only. Exit codes: 0 ready, 2 fabric or GID wrong, 3 not enough free memory.
"""

from __future__ import annotations

import argparse
import glob
import os
import subprocess
import sys
import time

GIB = 1024**3


def read_env(path: str) -> dict[str, str]:
    env = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if line and not line.startswith("#") and "=" in line:
                key, _, value = line.partition("=")
                env[key] = value
    return env


def read(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().strip()
    except OSError:
        return ""


def mapped_gid(ip: str) -> str:
    a, b, c, d = (int(x) for x in ip.split("."))
    return f"0000:0000:0000:0000:0000:ffff:{a:02x}{b:02x}:{c:02x}{d:02x}"


def gid_table(hca: str, port: str) -> str:
    rows = []
    base = f"/sys/class/infiniband/{hca}/ports/{port}"
    for path in sorted(glob.glob(f"{base}/gids/*"), key=lambda p: int(p.rsplit("/", 1)[1])):
        idx = path.rsplit("/", 1)[1]
        gid = read(path)
        if gid and set(gid) - set("0:"):
            kind = read(f"{base}/gid_attrs/types/{idx}")
            ndev = read(f"{base}/gid_attrs/ndevs/{idx}")
            rows.append(f"  {idx:>4}  {gid}  {kind:<11} {ndev}")
    return "\n".join(rows) or "  (empty)"


def check_fabric(env: dict[str, str]) -> list[str]:
    problems = []
    iface, ip = env["SPARKRIG_FABRIC_INTERFACE"], env["SPARKRIG_FABRIC_IP"]
    mtu = read(f"/sys/class/net/{iface}/mtu")
    if mtu != env["SPARKRIG_FABRIC_MTU"]:
        problems.append(f"{iface} MTU is {mtu or '?'}, expected {env['SPARKRIG_FABRIC_MTU']}")
    hca, port, idx = env["NCCL_IB_HCA"], env["SPARKRIG_ROCE_PORT"], env["NCCL_IB_GID_INDEX"]
    base = f"/sys/class/infiniband/{hca}/ports/{port}"
    gid = read(f"{base}/gids/{idx}") if idx.isdigit() else ""
    kind = read(f"{base}/gid_attrs/types/{idx}") if idx.isdigit() else ""
    if gid != mapped_gid(ip) or kind.lower() != "roce v2":
        problems.append(
            f"NCCL_IB_GID_INDEX={idx!r} on {hca} port {port} is {gid or 'empty'} ({kind or '?'}), "
            f"not RoCE v2 ::ffff:{ip}; GID table:\n{gid_table(hca, port)}"
        )
    return problems


def memfree() -> int:
    for line in read("/proc/meminfo").splitlines():
        if line.startswith("MemFree:"):
            return int(line.split()[1]) * 1024
    return 0


def drop_caches() -> None:
    os.sync()
    for path, value in (("/proc/sys/vm/drop_caches", "3"), ("/proc/sys/vm/compact_memory", "1")):
        try:
            with open(path, "w") as f:
                f.write(value)
        except OSError:
            pass


def top_consumers() -> str:
    out = subprocess.run(
        ["ps", "-eo", "rss,comm", "--sort=-rss"], capture_output=True, text=True, check=False
    ).stdout.splitlines()
    return "\n".join("  " + line for line in out[:6])


def gate_memory(floor: int, wait_s: float) -> bool:
    deadline = time.monotonic() + wait_s
    while True:
        drop_caches()
        free = memfree()
        if free >= floor:
            print(f"sparkrig-prep: MemFree {free / GIB:.1f} GiB >= {floor / GIB:.1f} GiB")
            return True
        if time.monotonic() >= deadline:
            print(
                f"sparkrig-prep: MemFree {free / GIB:.1f} GiB < {floor / GIB:.1f} GiB after "
                f"{wait_s:.0f} s of dropping caches; top consumers:\n{top_consumers()}",
                file=sys.stderr,
            )
            return False
        time.sleep(2)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--env", required=True, help="the rank's env file")
    p.add_argument("--memfree-min-gib", type=float, required=True)
    p.add_argument("--wait", type=float, default=120, help="seconds to keep dropping caches")
    args = p.parse_args(argv)

    env = read_env(args.env)
    problems = check_fabric(env)
    if problems:
        for problem in problems:
            print(f"sparkrig-prep: {problem}", file=sys.stderr)
        print("sparkrig-prep: refusing to start; re-run the deploy to fix it", file=sys.stderr)
        return 2
    if not gate_memory(int(args.memfree_min_gib * GIB), args.wait):
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
