"""The fake pair in fabric_layout "ports" (docs/rings.md, tests/plan/rings/pair_ports.py): the
cable in port 1 of both ranks (fabric_interface enp1s0f1np1), both PCIe functions planned; the
fabric facts of each rank (who answers on each port, each planned netdev's link and
don't-fragment ping, both RDMA devices' GID tables) as ``fabric_state`` makes them."""

from __future__ import annotations

import re
from typing import Any

from sparkrig.factlines import END
from tests.plan.fakehosts import GIDS, STATE, gid_table, host

PROBE = re.compile(r"^echo '##netdev ")  # cabling.probe_command (FabricNeighbours)
LINKS = re.compile(r"^\( ping -M do ")  # fabric.links_command (FabricLinks)
PROVE = re.compile(r"^rc=0; ping -M do ")  # fabric.fabric_functions_proven
PLAN = {  # rank -> (netdev, RDMA device, address) of each function on the pair's cable
    0: [
        ("enp1s0f1np1", "rocep1s0f1", "198.18.0.1"),
        ("enP2p1s0f1np1", "roceP2p1s0f1", "198.18.1.1"),
    ],
    1: [
        ("enp1s0f1np1", "rocep1s0f1", "198.18.0.2"),
        ("enP2p1s0f1np1", "roceP2p1s0f1", "198.18.1.2"),
    ],
}
# today's inventory form, fabric_layout left to its default: the typed primary addresses kept,
# the twins on the buddy subnet (tests/plan/rings/pair_today.py)
TODAY = {
    rank: [(dev, rdma, ip.replace("198.18.0.", "10.200.0.").replace("198.18.1.", "10.200.1."))
           for dev, rdma, ip in ifaces]
    for rank, ifaces in PLAN.items()
}  # fmt: skip
PORT0 = ("enp1s0f0np0", "enP2p1s0f0np0")  # the other port's netdevs, probed too


def mac(rank: int, port: int, function: int) -> str:
    return f"02:00:00:0{rank}:0{port}:0{function}"


def ll(rank: int, port: int, function: int) -> str:
    return f"fe80::{rank + 1}:{port}:{function}"


def probe(rank: int, cable: tuple[int, int] = (1, 1), link_local: bool = True) -> list[str]:
    """What rank ``rank`` hears on each netdev of both ports, the cable joining rank 0's port
    ``cable[0]`` and rank 1's port ``cable[1]``."""
    mine, other = cable[rank], cable[1 - rank]
    out = []
    for port, devs in ((0, PORT0), (1, tuple(d for d, _, _ in PLAN[rank]))):
        for function, dev in enumerate(devs):
            out += [f"##netdev {dev}", f"mac {mac(rank, port, function)}"]
            if link_local:
                out.append(f"addr 2: {dev}    inet6 {ll(rank, port, function)}/64 scope link")
            if port == mine and link_local:
                for g in (0, 1):
                    out.append(f"from {ll(1 - rank, other, g)}")
                    out.append(
                        f"neigh {ll(1 - rank, other, g)} lladdr {mac(1 - rank, other, g)} STALE"
                    )
    return [*out, END]


def links(
    rank: int,
    addressed: bool = False,
    silent: tuple[str, ...] = (),
    mtu: int = 1500,
    plan: dict[int, list[tuple[str, str, str]]] = PLAN,
) -> list[str]:
    """Each planned netdev up with carrier, at ``mtu``, with its planned address when
    ``addressed``; its don't-fragment ping answers when addressed and not in ``silent``."""
    out = []
    for dev, _, ip in plan[rank]:
        ok = addressed and dev not in silent
        out += [f"df {dev} {0 if ok else 1}", f"link {dev} 0x1003 1 {mtu}"]
        if addressed:
            out.append(f"addr {dev} {ip}/24")
    return [*out, END]


def gids(rank: int, plan: dict[int, list[tuple[str, str, str]]] = PLAN) -> list[str]:
    """Both RDMA devices' GID tables, each holding its function's address (as after the
    netplan is applied), the twin's at another index than the primary's."""
    (d0, r0, ip0), (d1, r1, ip1) = plan[rank]
    return [*gid_table(r0, d0, ip0, index=3)[:-1], *gid_table(r1, d1, ip1, index=5)]


def fabric_state(rank: int, **kw: Any) -> dict[Any, Any]:
    from tests.plan.rings.ringfakes import SYSFS_PORTS, sysfs_ports

    return {
        SYSFS_PORTS: kw.get("sysfs", sysfs_ports()),
        PROBE: probe(rank, **kw.get("probe", {})),
        LINKS: links(rank, **kw.get("links", {}), plan=kw.get("plan", PLAN)),
        GIDS: gids(rank, kw.get("plan", PLAN)),
        PROVE: kw.get("prove", ""),
    }


def pair_host(name: str, rank: int) -> tuple[str, dict]:
    responses = {**STATE.get(name, {}), **{k: v for k, v in fabric_state(rank).items()
                                           if k not in STATE.get(name, {})}}  # fmt: skip
    address, data = host(name, "192.168.100.10", responses=responses, fabric_layout="ports")
    return address, {k: v for k, v in data.items() if k != "fabric_address"}


def today_host(name: str, rank: int) -> tuple[str, dict]:
    """A pair host of today's inventory form (fabric_interface, fabric_address, roce_device)
    with fabric_layout left to group_data/all.py's default."""
    responses = {**STATE.get(name, {}), **{k: v for k, v in fabric_state(rank, plan=TODAY).items()
                                           if k not in STATE.get(name, {})}}  # fmt: skip
    address, data = host(
        name, f"10.200.0.{rank + 1}", responses=responses, roce_device="rocep1s0f1"
    )
    return address, {k: v for k, v in data.items() if k != "fabric_layout"}
