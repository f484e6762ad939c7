"""Fake Sparks cabled as the rule says (docs/rings.md): port 0 of rank i to port 1 of rank i+1,
the last back to rank 0; both PCIe functions of every port. Written from the rule and DGX OS's
names, not from sparkrig/topology.py: cable e joins rank e's port 0 (.1) and rank e+1's port 1
(.2), its primary functions on 198.18.<2e>.0/24 and its twins on 198.18.<2e+1>.0/24.

``fabric_state`` makes one rank's fabric facts (who answers on each port, each netdev's link
and don't-fragment ping, every RDMA device's GID table) as ``pairfakes.fabric_state`` does for
a pair."""

from __future__ import annotations

import re
from typing import Any

from sparkrig.factlines import END
from tests.plan.fakehosts import GIDS, STATE, gid_table, host
from tests.plan.rings.pairfakes import LINKS, PROBE, PROVE, ll, mac


def netdev(port: int, function: int) -> str:
    return f"enp1s0f{port}np{port}" if function == 0 else f"enP2p1s0f{port}np{port}"


def rdma(port: int, function: int) -> str:
    return f"rocep1s0f{port}" if function == 0 else f"roceP2p1s0f{port}"


def far_end(n: int, rank: int, port: int) -> tuple[int, int]:
    """(rank, port) at the other end of the cable in ``rank``'s ``port``."""
    return ((rank + 1) % n, 1) if port == 0 else ((rank - 1) % n, 0)


def cable_of(n: int, rank: int, port: int) -> int:
    return rank if port == 0 else (rank - 1) % n


def address(n: int, rank: int, port: int, function: int) -> str:
    return f"198.18.{2 * cable_of(n, rank, port) + function}.{1 if port == 0 else 2}"


def plan(n: int, rank: int) -> list[tuple[str, str, str, str]]:
    """(netdev, RDMA device, address, the far end's address) of every function of ``rank``."""
    out = []
    for port in (0, 1):
        peer, peer_port = far_end(n, rank, port)
        for f in (0, 1):
            out.append(
                (netdev(port, f), rdma(port, f), address(n, rank, port, f),
                 address(n, peer, peer_port, f))
            )  # fmt: skip
    return out


def probe(n: int, rank: int) -> list[str]:
    """Each netdev hears both functions of the port at its cable's far end."""
    out = []
    for port in (0, 1):
        peer, peer_port = far_end(n, rank, port)
        for f in (0, 1):
            dev = netdev(port, f)
            out += [f"##netdev {dev}", f"mac {mac(rank, port, f)}",
                    f"addr 2: {dev}    inet6 {ll(rank, port, f)}/64 scope link"]  # fmt: skip
            for g in (0, 1):
                them = ll(peer, peer_port, g)
                out += [f"from {them}", f"neigh {them} lladdr {mac(peer, peer_port, g)} STALE"]
    return [*out, END]


def links(n: int, rank: int, addressed: bool = False, mtu: int = 1500) -> list[str]:
    out = []
    for dev, _, ip, _ in plan(n, rank):
        out += [f"df {dev} {0 if addressed else 1}", f"link {dev} 0x1003 1 {mtu}"]
        if addressed:
            out.append(f"addr {dev} {ip}/24")
    return [*out, END]


def gids(n: int, rank: int) -> list[str]:
    out: list[str] = []
    for i, (dev, device, ip, _) in enumerate(plan(n, rank)):
        out += gid_table(device, dev, ip, index=3 + i)[:-1]
    return [*out, END]


LAN = re.compile(r"^ip -o -4 addr show scope global ")  # fabric.LanAddresses
SYSFS_PORTS = re.compile(r"^for d in /sys/class/infiniband/\*; do ")  # fabric.FabricPorts


def sysfs_ports() -> list[str]:
    """What sysfs shows on a Spark (cabling.discovery_command): each RDMA device's PCI function
    (the twin on domain 0002) and netdev, DGX OS's names."""
    return [
        f"rdma {rdma(port, f)} pci {'0002' if f else '0000'}:01:00.{port} netdev {netdev(port, f)}"
        for port in (0, 1)
        for f in (0, 1)
    ] + [END]


def lan_address(rank: int) -> str:
    """Each rank's LAN address (host data lan_address): the head 192.168.1.10, rank r .1r."""
    return f"192.168.1.{10 + rank}"


def fabric_state(n: int, rank: int, **kw: Any) -> dict[Any, Any]:
    return {
        PROBE: probe(n, rank),
        LINKS: links(n, rank, **kw.get("links", {})),
        GIDS: gids(n, rank),
        PROVE: kw.get("prove", ""),
        LAN: kw.get("lan", [f"enP7s7 {lan_address(rank)}/24", END]),
        SYSFS_PORTS: kw.get("sysfs", sysfs_ports()),
    }


def ring_host(name: str, n: int, rank: int) -> tuple[str, dict]:
    """A bare node of a ring of ``n`` (what a test put in fakehosts.STATE first)."""
    mine = STATE.get(name, {})
    responses = {**mine, **{k: v for k, v in fabric_state(n, rank).items() if k not in mine}}
    address, data = host(
        name, "192.168.100.10", responses=responses, fabric_layout="ports",
        lan_address=lan_address(rank),
    )  # fmt: skip
    drop = ("fabric_address", "fabric_interface")
    return address, {k: v for k, v in data.items() if k not in drop}
