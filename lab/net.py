"""The lab's network namespace: bridges for uplink A (management), uplink B and the fabric, the
"internet" address, per-guest taps, and helpers to run processes inside the namespace.

Layout inside namespace NS (the namespace itself is the router of both uplinks):
  br-a   172.30.1.1/24  uplink A + management (guests' enP7s7, default route metric 100)
  br-b   172.30.2.1/24  uplink B (guests' enP9s9, default route metric 600)
  br-fab no address, MTU 9000, L2 only (guests' enp1s0f1np1; fabric subnet 10.200.0.0/24); in
         fabric layout "ports" (and two pairs and more: `lab up --pairs P`) one bridge per cable
         and function class instead (lab/fabric.py)
  lo     also holds the "internet" address 203.0.113.1/32, where the test servers listen
A server there sees 172.30.1.x when a guest came through uplink A and 172.30.2.x through uplink B.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
from collections.abc import Sequence
from pathlib import Path

from lab import fabric

NS = "sparkrig-lab"
INTERNET = "203.0.113.1"
FABRIC_MTU = 9000
UPLINKS = {
    "a": {"bridge": "br-a", "prefix": "172.30.1", "interface": "enP7s7", "metric": 100},
    "b": {"bridge": "br-b", "prefix": "172.30.2", "interface": "enP9s9", "metric": 600},
}
FABRIC_PREFIX = "10.200.0"
CLONE_NEWNET = 0x40000000


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(argv, text=True, capture_output=True)
    if check and r.returncode != 0:
        raise SystemExit(f"{' '.join(argv)}: {r.stderr.strip()} (rc {r.returncode})")
    return r


def nsip(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return sh("ip", "-n", NS, *argv, check=check)


def exists() -> bool:
    return Path(f"/run/netns/{NS}").exists()


def setns() -> None:
    """Move the calling thread into the lab namespace (Python 3.11 has no os.setns)."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/run/netns/{NS}", os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns({NS}): {os.strerror(err)}")
    finally:
        os.close(fd)


def spawn(argv: Sequence[str], log: Path, cwd: Path | None = None, in_ns: bool = True) -> int:
    """Start a long-running process (inside the namespace unless in_ns=False), detached; return
    its real PID (`ip netns exec` would fork, so its PID is not the server's)."""
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            preexec_fn=setns if in_ns else None,
            start_new_session=True,
        )
    return proc.pid


def tap_names(idx: int) -> dict[str, str]:
    """The taps of guest ``idx``'s uplinks (its fabric NICs' are lab/fabric.py's)."""
    return {"a": f"g{idx}a", "b": f"g{idx}b"}


def create(n_hosts: int, fabric_layout: str = "single", pairs: int = 0) -> None:
    """Create the namespace, bridges, internet address and one tap per guest NIC (the fabric's
    segments and NICs as lab/fabric.py lays them out; ``pairs``: that many pairs' cables)."""
    sh("ip", "netns", "add", NS)
    nsip("link", "set", "lo", "up")
    sh("ip", "netns", "exec", NS, "sysctl", "-qw", "net.ipv4.ip_forward=0")
    nsip("addr", "add", f"{INTERNET}/32", "dev", "lo")  # no dummy module on this kernel
    for up in UPLINKS.values():
        br = str(up["bridge"])
        nsip("link", "add", br, "type", "bridge")
        nsip("addr", "add", f"{up['prefix']}.1/24", "dev", br)
        nsip("link", "set", br, "up")
    for bridge in fabric.bridges(fabric_layout, n_hosts, pairs):
        # mtu before type: `ip link add NAME type bridge mtu N` is parsed as a bridge option
        nsip("link", "add", bridge, "mtu", str(FABRIC_MTU), "type", "bridge")
        nsip("link", "set", bridge, "up")
    for idx in range(1, n_hosts + 1):
        for kind, tap in tap_names(idx).items():
            nsip("tuntap", "add", "dev", tap, "mode", "tap")
            nsip("link", "set", tap, "master", str(UPLINKS[kind]["bridge"]))
            nsip("link", "set", tap, "up")
        for nic in fabric.nics(fabric_layout, n_hosts, idx, pairs):
            nsip("tuntap", "add", "dev", nic.tap, "mode", "tap")
            nsip("link", "set", nic.tap, "mtu", str(FABRIC_MTU))
            nsip("link", "set", nic.tap, "master", nic.bridge)
            nsip("link", "set", nic.tap, "up")


def ns_pids() -> list[int]:
    if not exists():
        return []
    out = sh("ip", "netns", "pids", NS, check=False).stdout
    return [int(p) for p in out.split()]


def destroy() -> None:
    if exists():
        sh("ip", "netns", "del", NS, check=False)


def shape(uplink: str, rate: str | None) -> str:
    """Shape traffic towards the guests on one uplink (tbf on the bridge); rate None removes it."""
    br = str(UPLINKS[uplink]["bridge"])
    if rate is None:
        sh("tc", "-n", NS, "qdisc", "del", "dev", br, "root", check=False)
        return f"uplink {uplink}: unshaped"
    tbf = ["tbf", "rate", rate, "burst", "256kb", "latency", "100ms"]
    sh("tc", "-n", NS, "qdisc", "replace", "dev", br, "root", *tbf)
    return f"uplink {uplink}: {rate} towards the guests (tbf on {br})"


def shaping() -> dict[str, str]:
    out = {}
    for name, up in UPLINKS.items():
        q = sh("tc", "-n", NS, "qdisc", "show", "dev", str(up["bridge"]), check=False).stdout
        q = q.strip()
        out[name] = q if "tbf" in q else "unshaped"
    return out
