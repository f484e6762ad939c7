"""What a host says of its fabric, as pyinfra facts that fail only their host on bad output:
the RoCE GID table (``RoceGids``), who answers on each netdev of both ports
(``FabricNeighbours``), the ports sysfs has (``FabricPorts``), each planned netdev's link and
its don't-fragment ping (``FabricLinks``) and the host's LAN addresses (``LanAddresses``), and
the parts of the state read they make (``gids_part``, ``ports_parts``)."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pyinfra.api import FactBase
from pyinfra.api.exceptions import FactProcessError
from sparkhost.gid import GidEntry, parse_gid_lines

from sparkrig.cabling import Probe, discover_ports, discovery_command, parse_probe, probe_command
from sparkrig.config.model import Settings
from sparkrig.factlines import END
from sparkrig.stateread import Part
from sparkrig.topology import Port, with_siblings

# ---------------------------------------------------------------------------------------------
# RoCE GID table (the reading and the rule are the host package's: files/sparkhost/gid.py)
# ---------------------------------------------------------------------------------------------


def gid_table_command() -> str:
    """The shell command that prints every device's and port's GID table as
    sparkhost.gid.parse_gid_lines reads it (RoceGids, and the status read)."""
    base = "/sys/class/infiniband/*/ports/*"
    return f"grep -H . {base}/gids/* {base}/gid_attrs/types/* {base}/gid_attrs/ndevs/* 2>/dev/null"


class RoceGids(FactBase[list[GidEntry]]):
    """
    Every populated RoCE GID of every RDMA device and port, from sysfs
    (``/sys/class/infiniband/<dev>/ports/<p>/{gids,gid_attrs/types,gid_attrs/ndevs}/<i>``),
    in one remote command. Empty when the host has no RDMA device.
    """

    default = list

    def command(self) -> str:
        return f"{gid_table_command()}; echo '{END}'"

    def process(self, output: list[str]) -> list[GidEntry]:
        try:
            return parse_gid_lines(output, end=END)
        except ValueError as err:
            raise FactProcessError(str(err)) from None


class FabricNeighbours(FactBase[dict[str, Probe]]):
    """
    Who answers on each of the given fabric netdevs (fabric_layout "ports", docs/rings.md): its
    MAC, its IPv6 link-local addresses and the responders of an all-nodes ping out of it, with
    their MACs (``cabling.probe_command``: iputils ping and iproute2 only, no IPv4 needed).
    ``cabling.check_cabling`` compares every rank's answer with the plan before any address is
    set (tasks/fabric.py).
    """

    default = dict

    def command(self, netdevs: Sequence[str], wait_s: int = 2) -> str:
        return f"{probe_command(netdevs, wait_s)}; echo '{END}'"

    def process(self, output: list[str]) -> dict[str, Probe]:
        return parse_probe([line for line in output if line.strip() != END])


class FabricPorts(FactBase[dict[int, Port]]):
    """
    The host's QSFP ports as sysfs has them (fabric_layout "ports", docs/rings.md): each RDMA
    device's PCI function and netdevs, a port being a function on PCIe domain 0 and its twin on
    another domain (``cabling.discover_ports``). ``cabling.ports_problems`` compares them with
    the inventory's before any address is set (``ports_verdict``).
    """

    default = dict

    def command(self) -> str:
        return f"{discovery_command()}; echo '{END}'"

    def process(self, output: list[str]) -> dict[int, Port]:
        return discover_ports(output)


@dataclass(frozen=True)
class LinkState:
    """One fabric netdev as the host has it, and whether a full-MTU don't-fragment ping out of
    it reached the peer function it faces in the plan."""

    netdev: str
    present: bool = False
    admin_up: bool = False
    carrier: bool = False
    mtu: int = 0
    ipv4: tuple[str, ...] = ()  # "198.18.0.1/24"
    df_ok: bool = False


def links_command(pings: Sequence[tuple[str, str]], mtu: int) -> str:
    """Every (netdev, peer address): the don't-fragment pings at once (each in the background),
    then each netdev's flags, carrier, MTU and IPv4 addresses, from sysfs and iproute2."""
    started = [
        f"( {df_ping(dev, peer, mtu)} >/dev/null 2>&1; echo df {shlex.quote(dev)} $? ) &"
        for dev, peer in pings
    ]
    shown = []
    for dev, _ in pings:
        d = shlex.quote(dev)
        shown.append(
            f"if [ -e /sys/class/net/{d} ]; then echo link {d} "
            f"$(cat /sys/class/net/{d}/flags) $(cat /sys/class/net/{d}/carrier 2>/dev/null || "
            f"echo 0) $(cat /sys/class/net/{d}/mtu); ip -4 -o addr show dev {d} | "
            f"awk '{{print \"addr {dev} \" $4}}'; else echo absent {d}; fi"
        )
    return " ".join(started) + " wait; " + "; ".join(shown)


def df_ping(netdev: str, peer: str, mtu: int) -> str:
    """One direction of one link: a full-MTU do-not-fragment ping out of ``netdev``."""
    return f"ping -M do -s {mtu - 28} -c 2 -i 0.2 -W 2 -I {shlex.quote(netdev)} {peer}"


def parse_links(lines: Sequence[str]) -> dict[str, LinkState]:
    """``links_command``'s output, per netdev."""
    raw: dict[str, dict[str, Any]] = {}
    for line in lines:
        words = line.split()
        if len(words) < 2 or words[0] not in ("df", "link", "addr", "absent"):
            continue
        entry = raw.setdefault(words[1], {"ipv4": []})
        if words[0] == "df" and len(words) == 3:
            entry["df_ok"] = words[2] == "0"
        elif words[0] == "link" and len(words) == 5:
            flags = int(words[2], 16) if words[2].startswith("0x") else 0
            entry.update(present=True, admin_up=bool(flags & 1), carrier=words[3] == "1")
            entry["mtu"] = int(words[4]) if words[4].isdigit() else 0
        elif words[0] == "addr" and len(words) == 3:
            entry["ipv4"].append(words[2])
    return {
        dev: LinkState(dev, **{**entry, "ipv4": tuple(entry["ipv4"])}) for dev, entry in raw.items()
    }


class FabricLinks(FactBase[dict[str, LinkState]]):
    """
    Every fabric netdev of the rank's plan (fabric_layout "ports"): present, administratively
    up, carrier, MTU, IPv4 addresses, and a full-MTU don't-fragment ping out of it to the peer
    function it faces (all pings at once: one ping's time).
    """

    default = dict

    def command(self, pings: tuple[tuple[str, str], ...], mtu: int) -> str:
        return f"{links_command(pings, mtu)}; echo '{END}'"

    def process(self, output: list[str]) -> dict[str, LinkState]:
        return parse_links(output)


class LanAddresses(FactBase[tuple[tuple[str, str], ...]]):
    """
    Every global IPv4 address of the host as (netdev, address/prefix): where a triangle's or a
    ring's LAN address (host data lan_address, the rendezvous's) must be.
    """

    default = tuple

    def command(self) -> str:
        return f"ip -o -4 addr show scope global | awk '{{print $2, $4}}'; echo '{END}'"

    def process(self, output: list[str]) -> tuple[tuple[str, str], ...]:
        out = []
        for line in output:
            if line == END:
                break
            dev, _, address = line.strip().partition(" ")
            if not dev or "/" not in address:
                raise FactProcessError(f"LAN addresses: {line!r} is not 'netdev address/prefix'")
            out.append((dev, address))
        return tuple(out)


def gids_part() -> Part:
    """The state read's part of the RoCE GID table."""
    return Part("gids", RoceGids)


def ports_parts(s: Settings) -> list[Part]:
    """The state read's fabric parts of fabric_layout "ports" (none for "single"): who answers
    on every netdev of both ports (the cabling check), every planned netdev's link with its
    don't-fragment ping, and on a triangle or a ring the host's LAN addresses."""
    part = s.fabric_rank
    if part is None:
        return []
    probed = tuple(f.netdev for p in with_siblings(s.me.ports).values() for f in p.functions)
    pings = tuple((i.netdev, str(i.peer_address)) for i in part.ifaces)
    return [
        Part("fabric_ports", FabricPorts),
        Part("fabric_probe", FabricNeighbours, (("netdevs", probed),)),
        Part("fabric_links", FabricLinks, (("pings", pings), ("mtu", s.knobs.fabric_mtu))),
        *([Part("lan", LanAddresses)] if s.relayed else []),
    ]
