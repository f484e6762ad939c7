"""The lab's fabric: which fabric NICs each guest has, on which PCI slot (the guest's .link files
name them as a DGX Spark's), which L2 segment each NIC's tap joins, and which Soft-RoCE device
each guest makes on which NIC (kernel command line ``sparkrig.rxe=``, read by lab-rxe).

- ``cable`` (the default for two guests): the pair's one cable in port 1 of each, both PCIe
  functions, each function class its own segment; the inventory is today's form (fabric_interface,
  fabric_address 10.200.0.<idx>/24, roce_device rocep1s0f1) and leaves fabric_layout to its
  default, "auto": the deploy derives the twin (enP2p1s0f1np1, 10.200.1.<idx>/24).
- ``single`` (the default for three guests and more): one fabric NIC per guest, ``enp1s0f1np1``
  (Soft-RoCE ``rxe0``), every guest on one bridge: a switch; the inventory says fabric_layout
  "single".
- ``ports`` with two guests: the ``cable`` NICs, every address derived from fabric_cidr:
  fabric_layout "ports".
- ``ports`` with three and more: both functions of both ports, cabled as the rule says (port 0 of
  rank i to port 1 of rank i+1, the last back to rank 0), each cable's function class its own
  segment between two guests only: a triangle or a ring, fabric_layout "ports".

Two pairs and more (``lab up --pairs P``, issue 52: P pairs behind one endpoint): guests 2p+1 (the
head) and 2p+2 (the worker) are pair p (``pair_a``, ``pair_b``, ...), each pair cabled as the
``cable`` lab on segments of its own (no L2 between two pairs' fabrics), pair p's primary
functions on 10.<200+2p>.0.<1|2>/24 (the deploy derives the twins on 10.<200+2p>.1.x).

The RDMA devices carry DGX OS's names in the ports layouts (``rocep1s0f1`` ...), which the deploy
derives from the netdev names. Pure: lab/net.py makes the bridges and taps, lab/vm.py the NICs.
"""

from __future__ import annotations

from dataclasses import dataclass

LAYOUTS = ("cable", "single", "ports")


def default_layout(n_hosts: int) -> str:
    """What ``lab up`` cables without --fabric: a pair's one cable, else a switch."""
    return "cable" if n_hosts == 2 else "single"


SINGLE_BRIDGE = "br-fab"  # lab/net.py's FABRIC_BRIDGE: every guest's one fabric NIC
# DGX OS's names per (port, PCIe function) and the PCI slot each has in the guest (slot 8 is
# today's fabric NIC; 7 and 9 are the uplinks)
NETDEVS = {
    (0, 0): "enp1s0f0np0",
    (0, 1): "enP2p1s0f0np0",
    (1, 0): "enp1s0f1np1",
    (1, 1): "enP2p1s0f1np1",
}
RDMA = {
    (0, 0): "rocep1s0f0",
    (0, 1): "roceP2p1s0f0",
    (1, 0): "rocep1s0f1",
    (1, 1): "roceP2p1s0f1",
}
SLOTS = {(1, 0): 0x08, (0, 0): 0x0A, (0, 1): 0x0B, (1, 1): 0x0C}


@dataclass(frozen=True)
class Nic:
    """One fabric NIC of a guest: its netdev (by PCI slot), its Soft-RoCE device, the host tap
    behind it and the segment (bridge) the tap joins."""

    netdev: str
    rdma: str
    slot: int
    tap: str
    bridge: str


def tap_name(idx: int, port: int, function: int) -> str:
    """The host-side tap of guest ``idx``'s (port, function) NIC (<= 15 characters)."""
    return f"g{idx}p{port}f{function}"


def cable_bridge(cable: int, function: int) -> str:
    """The segment of one function class of one cable: two guests only."""
    return f"br-c{cable}f{function}"


PAIR_LETTERS = "abcd"  # `lab up --pairs P`: 2 to 4 pairs
PAIR_SUBNET = "10.{}.0"  # pair p's primary functions: 10.<200 + 2p>.0.0/24 (its twins: .1.0/24)


def pair_name(p: int) -> str:
    """The name of pair ``p`` (0: the first): its host data ``pair`` and its inventory group."""
    return f"pair_{PAIR_LETTERS[p]}"


def pair_of(idx: int) -> tuple[int, int]:
    """(pair p from 0, the guest's index in its pair: 1 the head, 2 the worker) of guest
    ``idx`` of a pairs lab."""
    return (idx - 1) // 2, (idx - 1) % 2 + 1


def pair_hosts(pairs: int) -> list[tuple[str, str, str]]:
    """(name, role, pair) of every guest of a lab of ``pairs`` pairs, in guest order: the first
    pair's are today's lab-head and lab-worker1, pair p's lab-head<p+1> and lab-worker<p+1>."""
    check_pairs(pairs)
    out = []
    for p in range(pairs):
        suffix = "" if p == 0 else str(p + 1)
        out.append((f"lab-head{suffix}", "head", pair_name(p)))
        out.append((f"lab-worker{p + 1}", "worker", pair_name(p)))
    return out


def pair_subnet(p: int) -> str:
    """Pair ``p``'s primary fabric subnet (10.200.0.0/24 for the first: today's cable lab)."""
    return PAIR_SUBNET.format(200 + 2 * p) + ".0/24"


def check_pairs(pairs: int, layout: str = "cable", n_hosts: int | None = None) -> None:
    if not 2 <= pairs <= len(PAIR_LETTERS):
        raise ValueError(f"pairs: 2 to {len(PAIR_LETTERS)} (one pair is today's lab), not {pairs}")
    if layout != "cable":
        raise ValueError(f"pairs are cabled as the 'cable' lab, not {layout!r}")
    if n_hosts is not None and n_hosts != 2 * pairs:
        raise ValueError(f"{pairs} pairs are {2 * pairs} guests, not {n_hosts}")


def nics(layout: str, n_hosts: int, idx: int, pairs: int = 0) -> list[Nic]:
    """The fabric NICs of guest ``idx`` (1: the head, rank 0) of a lab of ``n_hosts``; with
    ``pairs``, of a lab of that many pairs (each pair's cable its own two segments)."""
    if layout not in LAYOUTS:
        raise ValueError(f"fabric layout {layout!r}: one of {', '.join(LAYOUTS)}")
    if pairs:
        check_pairs(pairs, layout, n_hosts)
        p, _ = pair_of(idx)
        return [
            Nic(NETDEVS[1, f], RDMA[1, f], SLOTS[1, f], tap_name(idx, 1, f), cable_bridge(p, f))
            for f in (0, 1)
        ]
    if layout == "single":
        return [Nic(NETDEVS[1, 0], "rxe0", SLOTS[1, 0], f"g{idx}f", SINGLE_BRIDGE)]
    if layout == "cable" and n_hosts != 2:
        raise ValueError("fabric layout 'cable' is a pair's: two guests")
    if n_hosts == 2:  # the pair's cable in port 1 of each, both functions
        return [
            Nic(NETDEVS[1, f], RDMA[1, f], SLOTS[1, f], tap_name(idx, 1, f), cable_bridge(0, f))
            for f in (0, 1)
        ]
    rank = idx - 1
    out = []
    for port in (0, 1):
        cable = rank if port == 0 else (rank - 1) % n_hosts  # port 0 of i to port 1 of i+1
        for f in (0, 1):
            out.append(
                Nic(
                    NETDEVS[port, f],
                    RDMA[port, f],
                    SLOTS[port, f],
                    tap_name(idx, port, f),
                    cable_bridge(cable, f),
                )
            )
    return out


def bridges(layout: str, n_hosts: int, pairs: int = 0) -> list[str]:
    """Every fabric segment of the lab, in a stable order."""
    seen: dict[str, None] = {}
    for idx in range(1, n_hosts + 1):
        for nic in nics(layout, n_hosts, idx, pairs):
            seen.setdefault(nic.bridge)
    return list(seen)


def rxe_arg(layout: str, n_hosts: int, idx: int, pairs: int = 0) -> str:
    """The guest's kernel command line word for lab-rxe ("" in the single layout: its default,
    rxe0 on enp1s0f1np1)."""
    if layout == "single":
        return ""
    devices = ",".join(f"{n.rdma}:{n.netdev}" for n in nics(layout, n_hosts, idx, pairs))
    return f"sparkrig.rxe={devices}"


def first_address(layout: str, n_hosts: int, idx: int, pairs: int = 0) -> str:
    """The guest's first fabric address as the deploy's plan gives it (docs/rings.md: cable e's
    primary functions on 198.18.<2e>.0/24 of the default fabric_cidr, the port-0 end .1, the
    port-1 end .2; a pair's one cable .1 at the head), or today's 10.200.0.<idx>/24 (single, and
    the primary function of ``cable``); with ``pairs``, pair p's 10.<200+2p>.0.<1|2>/24."""
    if pairs:
        check_pairs(pairs, layout, n_hosts)
        p, own = pair_of(idx)
        return f"{PAIR_SUBNET.format(200 + 2 * p)}.{own}/24"
    if layout in ("single", "cable"):
        return f"10.200.0.{idx}/24"
    if n_hosts == 2:
        return f"198.18.0.{idx}/24"
    return f"198.18.{2 * (idx - 1)}.1/24"  # its port 0 end of the cable to the next rank
