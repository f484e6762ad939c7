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


def nics(layout: str, n_hosts: int, idx: int) -> list[Nic]:
    """The fabric NICs of guest ``idx`` (1: the head, rank 0) of a lab of ``n_hosts``."""
    if layout not in LAYOUTS:
        raise ValueError(f"fabric layout {layout!r}: one of {', '.join(LAYOUTS)}")
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


def bridges(layout: str, n_hosts: int) -> list[str]:
    """Every fabric segment of the lab, in a stable order."""
    seen: dict[str, None] = {}
    for idx in range(1, n_hosts + 1):
        for nic in nics(layout, n_hosts, idx):
            seen.setdefault(nic.bridge)
    return list(seen)


def rxe_arg(layout: str, n_hosts: int, idx: int) -> str:
    """The guest's kernel command line word for lab-rxe ("" in the single layout: its default,
    rxe0 on enp1s0f1np1)."""
    if layout == "single":
        return ""
    pairs = ",".join(f"{n.rdma}:{n.netdev}" for n in nics(layout, n_hosts, idx))
    return f"sparkrig.rxe={pairs}"


def first_address(layout: str, n_hosts: int, idx: int) -> str:
    """The guest's first fabric address as the deploy's plan gives it (docs/rings.md: cable e's
    primary functions on 198.18.<2e>.0/24 of the default fabric_cidr, the port-0 end .1, the
    port-1 end .2; a pair's one cable .1 at the head), or today's 10.200.0.<idx>/24 (single, and
    the primary function of ``cable``)."""
    if layout in ("single", "cable"):
        return f"10.200.0.{idx}/24"
    if n_hosts == 2:
        return f"198.18.0.{idx}/24"
    return f"198.18.{2 * (idx - 1)}.1/24"  # its port 0 end of the cable to the next rank
