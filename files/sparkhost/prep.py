"""``sparkhost prep``: the start gate of a sparkrig rank (root, the unit's ExecStartPre).

1. Wait (bounded by --fabric-wait, polling) until the fabric NIC has carrier, the RDMA device
   exists and its GID table holds the RoCE v2 entry ::ffff:<fabric IP> on the fabric netdev
   (fabric_layout "ports": every function the env lists, each device's GID by its own address)
   (the kernel adds it only once the address is on the NIC; after a reboot a peer powered off
   means no carrier, so no address and no GID yet). None within the bound: print the table and
   fail closed.
2. The fabric NIC has its MTU (a firmware update can reset it to 1500).
3. Hand THAT index to the container: write it to --gid-env (sparkhost.rankenv), which the unit
   reads for `docker run` (indices move after reboots; the deploy's rank.env keeps the one it saw).
4. Drop the page cache (it counts as used GPU memory on unified memory) and wait until MemFree,
   not MemAvailable, reaches the floor; otherwise list the top consumers and refuse to start.

4a. Leftovers of a crash: this rank's own container, by its name, when it is still there (an
   engine that outlived its unit, a removal docker did not finish) is removed; then, while GPU
   compute processes are left without another container (a dead engine's, still exiting) or the
   container was just removed, wait (bounded by --wait, said in the journal) for them to go and
   MemFree to reach the floor before the checks below decide.
5. Refuse (exit 4, listing them) while another container or a GPU compute process
   (`nvidia-smi --query-compute-apps`, when present) runs on this node. The MemFree floor is
   --memfree-min-gib when given, else ceil(MemTotal x --gpu-memory-utilization) + the margin:
   vLLM's own start check (docs/vllm.md). A stack may measure otherwise (--memory-measure,
   sparkrig/stacks/base.py MemoryGate): MemAvailable must reach the floor (`available`), or
   free(1)'s "used" (MemTotal - MemAvailable, procps-ng 4) must stay at or below it (`used`,
   Entrpi's 6 GB preflight); both need the floor pinned.
Stdlib only. Exit codes: 0 ready, 2 fabric or GID wrong, 3 not enough free memory, 4 memory held
by another container or GPU process.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable

from sparkhost import gid, rankenv
from sparkhost.common import read_text as read

GIB = 1024**3

# Where the kernel's trees are; tests point them at a fake tree.
SYS = "/sys"
PROC = "/proc"


def log(msg: str) -> None:
    print(f"sparkrig-prep: {msg}", flush=True)


def warn(msg: str) -> None:
    print(f"sparkrig-prep: {msg}", file=sys.stderr, flush=True)


# --- the fabric: carrier, RDMA device, the RoCE v2 GID of the address -------------------------


def port_dir(hca: str, port: int) -> str:
    return f"{SYS}/class/infiniband/{hca}/ports/{port}"


def gid_table(hca: str, port: int) -> str:
    return gid.format_table(gid.read_table(SYS, hca, int(port)))


def find_gid(hca: str, port: int, ip: str, iface: str) -> int | None:
    """Index of the RoCE v2 entry ::ffff:<ip> on ``iface`` (docs/sources.md, "Fabric"), or None."""
    try:
        return gid.select_gid(gid.read_table(SYS, hca, int(port)), ip, iface, hca, int(port)).index
    except gid.GidNotFound:
        return None


def functions(env: rankenv.RankEnv) -> list[tuple[str, str, str]]:
    """(netdev, RDMA device, IPv4) of every fabric function the rank uses: the single layout's
    one; fabric_layout "ports" lists every function facing a peer, in the env's order
    (SPARKRIG_FABRIC_NETDEVS, SPARKRIG_ROCE_DEVICES, SPARKRIG_FABRIC_ADDRESSES: docs/rings.md)."""
    if not env.ports:
        return [(env.interface, env.hca, env.ip)]
    return list(zip(env.netdevs, env.roce_devices, env.addresses, strict=True))


def fabric_missing(env: rankenv.RankEnv) -> tuple[list[str], dict[str, int]]:
    """What the fabric still lacks for this rank (empty when ready) and the GID index found on
    each RDMA device (by value: ::ffff:<the function's IPv4> on its netdev, RoCE v2)."""
    port = env.roce_port
    missing: list[str] = []
    found: dict[str, int] = {}
    for iface, hca, ip in functions(env):
        if read(f"{SYS}/class/net/{iface}/carrier") != "1":
            missing.append(f"carrier on {iface}")
        if not os.path.isdir(port_dir(hca, port)):
            missing.append(f"RDMA device {hca} port {port}")
        index = find_gid(hca, port, ip, iface)
        if index is None:
            missing.append(f"the RoCE v2 GID ::ffff:{ip} on {iface} (the address on the NIC)")
        else:
            found[hca] = index
    return missing, found


def wait_for_fabric(
    env: rankenv.RankEnv,
    bound: float,
    interval: float = 1.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, int] | None:
    """Poll until the fabric is ready; each RDMA device's GID index, or None after ``bound``."""
    start = clock()
    said = ""
    while True:
        missing, found = fabric_missing(env)
        if not missing:
            if said:
                log(f"fabric ready after {clock() - start:.0f} s")
            return found
        if clock() - start >= bound:
            warn(f"no {'; no '.join(missing)} after {bound:.0f} s")
            return None
        now = "; ".join(missing)
        if now != said:
            log(f"waiting up to {bound:.0f} s for {now}")
            said = now
        sleep(interval)


def check_mtu(env: rankenv.RankEnv) -> str | None:
    """Every fabric netdev at the env's MTU, else what differs."""
    want = env.mtu
    wrong = []
    for iface, _, _ in functions(env):
        mtu = read(f"{SYS}/class/net/{iface}/mtu")
        if mtu != str(want):
            wrong.append(f"{iface} MTU is {mtu or '?'}, expected {want}")
    return "; ".join(wrong) or None


def device_index(hca: str) -> int | None:
    """The RDMA device's kernel index (``rdma dev show``: "<index>: <name>: ..."), which a
    device made again gets anew; None without iproute2's rdma or the device."""
    try:
        out = subprocess.run(
            ["rdma", "dev", "show", hca], capture_output=True, text=True, timeout=10, check=False
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.match(r"(\d+): ", out)
    return int(m.group(1)) if m else None


def hand_over_gid(
    env: rankenv.RankEnv, index: int, path: str, found: dict[str, int] | None = None
) -> None:
    """Write the index the container gets (atomically); say so when it moved since the deploy.
    fabric_layout "ports" hands every device's index over too (``found``), for the deploy and
    status to compare; the container gets none there (NCCL picks each GID by value)."""
    deployed = env.gid_index
    if deployed != index and not env.ports:
        log(
            f"GID index of ::ffff:{env.ip} is {index} now (the deploy saw "
            f"{'none' if deployed is None else deployed}); the container gets {index}"
        )
    hca = functions(env)[0][1]
    kernel = {dev: i for dev in found or {} if (i := device_index(dev)) is not None}
    rankenv.write_handed(path, index, hca, device_index(hca), found, kernel)


def gate_fabric(env: rankenv.RankEnv, bound: float, gid_env: str) -> bool:
    """Steps 1-3; False (reasons printed) when the rank must not start."""
    try:
        os.unlink(gid_env)  # never hand over a stale index
    except OSError:
        pass
    found = wait_for_fabric(env, bound)
    problem = check_mtu(env)
    if problem:
        warn(problem)
    if found is None:
        port = env.roce_port
        for _, hca, _ in functions(env):
            warn(f"GID table of {hca} port {port}:\n{gid_table(hca, port)}")
        return False
    if problem:
        return False
    first = functions(env)[0][1]
    hand_over_gid(env, found[first], gid_env, found if env.ports else None)
    return True


# --- memory -----------------------------------------------------------------------------------


def meminfo(key: str = "MemFree") -> int:
    for line in read(f"{PROC}/meminfo").splitlines():
        if line.startswith(f"{key}:"):
            return int(line.split()[1]) * 1024
    return 0


def memfree() -> int:
    return meminfo("MemFree")


# What the gate reads (--memory-measure), its name in the journal, and whether the floor is a
# minimum (memfree, available) or a ceiling (used).
MEASURES = {"memfree": "MemFree", "available": "MemAvailable", "used": "used memory"}


def memory_reading(measure: str = "memfree") -> int:
    """Bytes of the gate's measure now."""
    if measure == "used":
        return meminfo("MemTotal") - meminfo("MemAvailable")
    return meminfo("MemAvailable") if measure == "available" else memfree()


def memory_met(measure: str, value: int, floor: int) -> bool:
    return value <= floor if measure == "used" else value >= floor


def memory_said(measure: str, value: int, floor: int) -> str:
    """e.g. ``MemFree 100.0 GiB >= 8.0 GiB``."""
    met = memory_met(measure, value, floor)
    sign = ("<=" if met else ">") if measure == "used" else (">=" if met else "<")
    return f"{MEASURES[measure]} {value / GIB:.1f} GiB {sign} {floor / GIB:.1f} GiB"


def memory_floor(
    min_gib: float | None, utilization: float, margin_gib: float, total: int | None = None
) -> int:
    """The MemFree a start needs. vLLM's worker refuses to start when free device memory is below
    ceil(total x gpu_memory_utilization) (v1/worker/utils.py request_memory; it ignores
    --kv-cache-memory-bytes), and on GB10 free device memory tracks MemFree: so, unless the
    operator pinned a floor, utilization x MemTotal plus a margin (MiaAI: + 1.5 GiB).
    ``total``: MemTotal in bytes (default: read here; status.py passes the one it read)."""
    if min_gib is not None:
        return int(min_gib * GIB)
    total = meminfo("MemTotal") if total is None else total
    return math.ceil(total * utilization) + int(margin_gib * GIB)


def foreign_holders(own: str | None) -> list[str]:
    """Other containers and GPU compute processes on this node (jayleaton: a stale one
    holds 30-90 GiB; refuse instead of failing minutes into the boot)."""
    return [f"container {n}" for n in other_containers(own)] + [
        f"GPU process {p}" for p in gpu_processes()
    ]


def other_containers(own: str | None) -> list[str]:
    """Running containers but this rank's own, as "name (image)"."""
    if not shutil.which("docker"):
        return []
    ps = subprocess.run(["docker", "ps", "--format", "{{.Names}} ({{.Image}})"],
                        capture_output=True, text=True, check=False)  # fmt: skip
    return [n for n in ps.stdout.split("\n") if n and n.split()[0] != own]


def gpu_processes() -> list[str]:
    """GPU compute processes as nvidia-smi lists them ("pid, name, used memory")."""
    if not shutil.which("nvidia-smi"):
        return []
    q = subprocess.run(
        ["nvidia-smi", "--query-compute-apps=pid,process_name,used_memory",
         "--format=csv,noheader"], capture_output=True, text=True, check=False,
    )  # fmt: skip
    return [ln.strip() for ln in q.stdout.splitlines() if ln.strip()]


def remove_own_container(name: str) -> bool:
    """This rank's container, left by a crash, removed by its known name; True when there was
    one (the memory its engine held comes back only as its processes exit)."""
    if not shutil.which("docker"):
        return False
    ps = subprocess.run(["docker", "ps", "--all", "--format", "{{.Names}} {{.State}}"],
                        capture_output=True, text=True, check=False)  # fmt: skip
    states = [ln.split()[1:] for ln in ps.stdout.splitlines() if ln.split()[:1] == [name]]
    if not states:
        return False
    state = " ".join(states[0]) or "unknown"
    log(f"removing this rank's stale container {name} ({state}), left by a crash")
    subprocess.run(["docker", "rm", "--force", name], capture_output=True, check=False)
    return True


def await_release(
    floor: int,
    wait_s: float,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    measure: str = "memfree",
) -> bool:
    """Wait, up to ``wait_s``, until no GPU compute process is left and MemFree reaches the floor
    (a dead engine's memory comes back as its processes exit); True when it did. Says what it
    waits for, and how it ended; the checks after it decide either way."""
    start = clock()
    drop_caches()
    name = MEASURES[measure]
    procs, free = gpu_processes(), memory_reading(measure)
    if not procs and memory_met(measure, free, floor):
        return True
    log(
        f"waiting up to {wait_s:.0f} s for the memory a dead engine held to come back: {name} "
        f"{free / GIB:.1f} GiB of {floor / GIB:.1f} GiB"
        + (f"; GPU processes left: {'; '.join(procs)}" if procs else "")
    )
    while clock() - start < wait_s:
        sleep(2)
        drop_caches()
        procs, free = gpu_processes(), memory_reading(measure)
        if not procs and memory_met(measure, free, floor):
            log(f"memory back after {clock() - start:.0f} s: {name} {free / GIB:.1f} GiB")
            return True
    log(f"after {wait_s:.0f} s {name} is {free / GIB:.1f} GiB; the checks below decide")
    return False


def drop_caches() -> None:
    os.sync()
    for name, value in (("drop_caches", "3"), ("compact_memory", "1")):
        try:
            with open(f"{PROC}/sys/vm/{name}", "w") as f:
                f.write(value)
        except OSError:
            pass


def top_consumers() -> str:
    out = subprocess.run(
        ["ps", "-eo", "rss,comm", "--sort=-rss"], capture_output=True, text=True, check=False
    ).stdout.splitlines()
    return "\n".join("  " + line for line in out[:6])


def gate_memory(
    floor: int,
    wait_s: float,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    measure: str = "memfree",
) -> bool:
    deadline = clock() + wait_s
    while True:
        drop_caches()
        value = memory_reading(measure)
        if memory_met(measure, value, floor):
            log(memory_said(measure, value, floor))
            return True
        if clock() >= deadline:
            warn(
                f"{memory_said(measure, value, floor)} after "
                f"{wait_s:.0f} s of dropping caches; top consumers:\n{top_consumers()}"
            )
            return False
        sleep(2)


def memory_advice(min_gib: float | None, margin_gib: float) -> str:
    """What an operator changes when MemFree stays below the floor: the knobs that set it."""
    if min_gib is not None:
        floor = f"memfree_min_gib = {min_gib:g} pins it"
    else:
        floor = (
            "it is MemTotal x the profile's gpu-memory-utilization + memfree_margin_gib = "
            f"{margin_gib:g}, or memfree_min_gib when set"
        )
    return (
        f"free that memory, or lower the floor ({floor}) in group_data/all.py and run the "
        "deploy again; vLLM itself refuses to start below MemTotal x gpu-memory-utilization"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="sparkhost prep", description=__doc__.splitlines()[0])
    p.add_argument("--env", required=True, help="the rank's env file")
    p.add_argument("--memfree-min-gib", type=float, default=None, help="pin the floor (GiB)")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.85, help="the profile's")
    p.add_argument("--memfree-margin-gib", type=float, default=1.5)
    p.add_argument("--container", help="this rank's container (not a foreign holder)")
    p.add_argument("--memory-measure", choices=sorted(MEASURES), default="memfree",
                   help="what the floor is checked against (the stack's memory gate)")  # fmt: skip
    p.add_argument("--wait", type=float, default=120, help="seconds to keep dropping caches")
    p.add_argument(
        "--fabric-wait", type=float, default=300, help="seconds to wait for carrier and GID"
    )
    p.add_argument("--gid-env", default=rankenv.HANDED_PATH, help="where the index goes")
    args = p.parse_args(argv)

    if args.memory_measure != "memfree" and args.memfree_min_gib is None:
        p.error(f"--memory-measure {args.memory_measure} needs --memfree-min-gib (the floor)")
    env = rankenv.read_rank_env(args.env)
    if not gate_fabric(env, args.fabric_wait, args.gid_env):
        warn("refusing to start; if the fabric itself is wrong, re-run the deploy to fix it")
        return 2
    floor = memory_floor(args.memfree_min_gib, args.gpu_memory_utilization,
                         args.memfree_margin_gib)  # fmt: skip
    removed = bool(args.container) and remove_own_container(args.container)
    if removed or (gpu_processes() and not other_containers(args.container)):
        await_release(floor, args.wait, measure=args.memory_measure)
    holders = foreign_holders(args.container)
    if holders:
        warn("refusing to start: memory on this node is held by:\n  " + "\n  ".join(holders)
             + "\nstop them (docker rm -f / kill), then start again")  # fmt: skip
        return 4
    if not gate_memory(floor, args.wait, measure=args.memory_measure):
        warn("refusing to start: " + memory_advice(args.memfree_min_gib, args.memfree_margin_gib))
        return 3
    return 0
