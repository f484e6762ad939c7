"""Who is cabled to whom, as the hosts see it, against the fabric's plan (docs/rings.md): pure.

``discover_ports`` reads a host's QSFP ports from sysfs (``discovery_command``);
``probe_command`` / ``parse_probe`` gather who answers on each port's netdevs with iputils ping
and iproute2; ``check_cabling`` compares that with the plan before any address is set, naming
the cable to move, and ``unchecked_cables`` names a cable nobody could ask on."""

from __future__ import annotations

import re
import shlex
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from sparkrig.topology import Cable, End, Function, Plan, Port

# ---------------------------------------------------------------------------------------------
# Discovery: the ports as the host's sysfs has them
# ---------------------------------------------------------------------------------------------

PCI_RE = re.compile(r"^([0-9a-f]{4,}):([0-9a-f]{2}):([0-9a-f]{2})\.([0-7])$")


def discovery_command() -> str:
    """The command that prints every RDMA device with its PCI function and netdevs, from sysfs
    alone (no rdma or ibdev2netdev tool needed): ``rdma <dev> pci <domain:bus:slot.fn> netdev
    <name>``, one line per netdev."""
    return (
        'for d in /sys/class/infiniband/*; do [ -e "$d/device" ] || continue; '
        'pci=$(basename "$(readlink -f "$d/device")"); '
        'for n in "$d"/device/net/*; do if [ -e "$n" ]; then '
        'echo "rdma ${d##*/} pci $pci netdev ${n##*/}"; fi; done; done'
    )


def discover_ports(lines: Sequence[str]) -> dict[int, Port]:
    """The QSFP ports ``discovery_command`` shows, by index: a ConnectX-7 port of a Spark is one
    PCI function on domain 0 (the primary) and the same bus, slot and function on another
    domain (its PCIe twin); the port's index is the function's number (``enp1s0f1np1`` is
    function 1, port 1; docs/rings.md "Functions per port"). Functions without a twin, or with
    no netdev, are left out."""
    by_pci: dict[tuple[str, str, str], dict[int, Function]] = {}
    for line in lines:
        words = line.split()
        if len(words) != 6 or words[0] != "rdma" or words[2] != "pci" or words[4] != "netdev":
            continue
        m = PCI_RE.match(words[3].lower())
        if not m:
            continue
        domain, bus, slot, fn = m.groups()
        functions = by_pci.setdefault((bus, slot, fn), {})
        functions.setdefault(int(domain, 16), Function(words[5], words[1]))
    ports: dict[int, Port] = {}
    for (_, _, fn), functions in sorted(by_pci.items()):
        if 0 in functions and len(functions) == 2:
            twin = next(f for d, f in functions.items() if d != 0)
            ports.setdefault(int(fn), Port(int(fn), functions[0], twin))
    return ports


def ports_problems(wanted: Mapping[int, Port], found: Mapping[int, Port]) -> list[str]:
    """How the inventory's ports (given or DGX OS's names) differ from what the host has."""
    problems = []
    for index, port in sorted(wanted.items()):
        have = found.get(index)
        if have is None:
            problems.append(
                f"port {index}: no PCI function {index} with a PCIe twin and netdevs on the host"
            )
            continue
        for role, want, got in (
            ("primary", port.primary, have.primary),
            ("twin", port.twin, have.twin),
        ):
            if want != got:
                problems.append(
                    f"port {index} {role}: the inventory says {want.netdev} ({want.rdma}), the "
                    f"host has {got.netdev} ({got.rdma}): fix fabric_ports"
                )
    return problems


# ---------------------------------------------------------------------------------------------
# Who answers on each port: the observation and the cabling rule
# ---------------------------------------------------------------------------------------------

PROBE_MARK = "##netdev "


@dataclass(frozen=True)
class Heard:
    """One answer on a netdev: the responder's link-local address and, when the neighbour table
    has it, its MAC."""

    address: str
    mac: str | None = None


@dataclass(frozen=True)
class Probe:
    """What one netdev of a host saw: its own MAC and link-local addresses, and who answered an
    all-nodes ping out of it."""

    netdev: str
    mac: str | None
    link_local: tuple[str, ...] = ()
    heard: tuple[Heard, ...] = ()
    present: bool = True


def probe_command(netdevs: Sequence[str], wait_s: int = 2) -> str:
    """The command that prints, per netdev, its MAC, its IPv6 link-local addresses and who
    answers an echo request to ff02::1 (all nodes on the link) sent out of it, with the
    neighbour table's MAC of each responder.

    Why this: no LLDP daemon is on DGX OS by default and none may be installed before the
    cabling is checked; an IPv6 link-local ping needs no IPv4 address (it runs before any is
    set), reaches only the cable's other end (link scope, never routed) and is answered by the
    kernel of every Linux host with IPv6 on; the peer resolves our address with a neighbour
    solicitation carrying its MAC, which our kernel records (RFC 4861 7.2.3), so `ip -6 neigh`
    names the responder by MAC. iputils ping and iproute2 are on every DGX OS install. Needs the
    kernel's fe80 address on the netdev (an up link, IPv6 not disabled, NetworkManager leaving
    IPv6 to the kernel as sparkrig's netplan profile does: docs/fabric.md)."""
    parts = []
    for dev in netdevs:
        d = shlex.quote(dev)
        parts.append(
            f"echo {shlex.quote(PROBE_MARK + dev)}; "
            f"if [ -e /sys/class/net/{d} ]; then "
            f"echo mac $(cat /sys/class/net/{d}/address); "
            f"ip -6 -o addr show dev {d} scope link | sed 's/^/addr /'; "
            f"ping -6 -n -c 2 -i 0.2 -w {wait_s} -I {d} ff02::1 2>/dev/null "
            "| sed -n 's/^.* from \\([0-9a-fA-F:]*\\).*$/from \\1/p'; "
            f"ip -6 neigh show dev {d} | sed 's/^/neigh /'; "
            "else echo absent; fi"
        )
    return "; ".join(parts)


def parse_probe(lines: Sequence[str]) -> dict[str, Probe]:
    """``probe_command``'s output, per netdev. Our own addresses are not answers; a responder's
    MAC comes from a neighbour entry of the same address (FAILED/INCOMPLETE entries carry none)."""
    out: dict[str, Probe] = {}
    current: str | None = None
    raw: dict[str, dict[str, list[str]]] = {}
    for line in lines:
        line = line.strip()
        if line.startswith(PROBE_MARK):
            current = line[len(PROBE_MARK) :].strip()
            raw[current] = {"mac": [], "addr": [], "from": [], "neigh": [], "absent": []}
            continue
        if current is None or not line:
            continue
        word, _, rest = line.partition(" ")
        if word in raw[current]:
            raw[current][word].append(rest.strip())
    for dev, parts in raw.items():
        mine = set()
        for entry in parts["addr"]:  # "2: enp1s0f0np0    inet6 fe80::1/64 scope link ..."
            m = re.search(r"inet6 ([0-9a-fA-F:]+)/\d+", entry)
            if m:
                mine.add(m[1].lower())
        macs: dict[str, str] = {}
        for entry in parts["neigh"]:  # "fe80::2 lladdr 02:00:00:00:00:02 STALE"
            words = entry.split()
            if len(words) >= 3 and words[1] == "lladdr":
                macs[words[0].lower()] = words[2].lower()
        heard = []
        for addr in dict.fromkeys(a.lower() for a in parts["from"]):
            if addr not in mine:
                heard.append(Heard(addr, macs.get(addr)))
        mac = parts["mac"][0].lower() if parts["mac"] and parts["mac"][0] else None
        out[dev] = Probe(
            netdev=dev,
            mac=mac,
            link_local=tuple(sorted(mine)),
            heard=tuple(heard),
            present=not parts["absent"],
        )
    return out


def _port_name(names: Sequence[str], end: End) -> str:
    return f"{names[end.rank]} port {end.port}"


def observed_cables(
    ports: Sequence[Mapping[int, Port]], probes: Sequence[Mapping[str, Probe]]
) -> set[frozenset[End]]:
    """The cables as the probes see them: a pair of ports where one hears the other. A
    responder is identified by MAC, else by link-local address, against every rank's own
    netdevs; either function of a port answers for the port (both share its wire)."""
    owner: dict[str, End] = {}
    for rank, by_port in enumerate(ports):
        for p, port in by_port.items():
            for f in port.functions:
                probe = probes[rank].get(f.netdev) if rank < len(probes) else None
                for key in (probe.mac, *probe.link_local) if probe else ():
                    if key:
                        owner[key] = End(rank, p)
    seen: set[frozenset[End]] = set()
    for rank, by_port in enumerate(ports):
        for p, port in by_port.items():
            for f in port.functions:
                probe = probes[rank].get(f.netdev) if rank < len(probes) else None
                for h in probe.heard if probe else ():
                    who = owner.get(h.mac or "") or owner.get(h.address)
                    if who is not None and who.rank != rank:
                        seen.add(frozenset((End(rank, p), who)))
    return seen


def blind_ends(
    ports: Sequence[Mapping[int, Port]], probes: Sequence[Mapping[str, Probe]]
) -> set[End]:
    """The ports whose probe cannot hear anyone: no function of the port has an IPv6
    link-local address to ping from (NetworkManager keeps it off on a device it manages but has
    not activated: docs/fabric.md), or the rank was not probed."""
    out = set()
    for rank, by_port in enumerate(ports):
        for p, port in by_port.items():
            seen = (
                [probes[rank].get(f.netdev) for f in port.functions] if rank < len(probes) else []
            )
            if not any(x is not None and x.present and x.link_local for x in seen):
                out.add(End(rank, p))
    return out


def unchecked_cables(
    plan: Plan,
    ports: Sequence[Mapping[int, Port]],
    probes: Sequence[Mapping[str, Probe]],
    names: Sequence[str] | None = None,
    unread: Collection[int] = (),
) -> list[str]:
    """The planned cables nobody was heard on because an end could not ask (``blind_ends``) or
    its rank was not read (``unread``: out of this run, ``--limit``): neither passed nor refused
    by ``check_cabling``; the don't-fragment pings prove them once the addresses are set."""
    names = list(names or [f"rank {i}" for i in range(plan.nnodes)])
    blind = blind_ends(ports, probes)
    seen = observed_cables(ports, probes)
    out = []
    for cable in plan.cables:
        ends = [e for e in (cable.a, cable.b) if e in blind]
        if not ends or frozenset((cable.a, cable.b)) in seen:
            continue
        away = [e for e in ends if e.rank in unread]
        why = (
            f"{' and '.join(names[e.rank] for e in away)} is not in this run"
            if away
            else f"{' and '.join(_port_name(names, e) for e in ends)} has no IPv6 link-local "
            "address to ask from yet"
        )
        out.append(
            f"cable {cable.index} ({_port_name(names, cable.a)} to "
            f"{_port_name(names, cable.b)}) not checked: {why}; the don't-fragment pings "
            "prove it once addressed"
        )
    return out


def swapped_at_one_rank(
    plan: Plan, unplanned: set[frozenset[End]]
) -> list[tuple[int, tuple[End, End], tuple[Cable, Cable]]]:
    """The ranks (three and more) whose two ports hold each other's cable, the likeliest slip
    when cabling a ring: (rank, (what its port 0 and port 1 reach), (the cable each belongs to
    by the plan)). Swapping the two ends at that rank alone puts both right."""
    if plan.nnodes < 3:
        return []
    planned = {frozenset((c.a, c.b)): c for c in plan.cables}
    reach: dict[End, End] = {}
    for edge in unplanned:
        x, y = tuple(edge)
        reach[x], reach[y] = y, x
    out = []
    for rank in range(plan.nnodes):
        at0, at1 = reach.get(End(rank, 0)), reach.get(End(rank, 1))
        if at0 is None or at1 is None:
            continue
        c0 = planned.get(frozenset((End(rank, 1), at0)))
        c1 = planned.get(frozenset((End(rank, 0), at1)))
        if c0 is not None and c1 is not None:
            out.append((rank, (at0, at1), (c0, c1)))
    return out


def check_cabling(
    plan: Plan,
    ports: Sequence[Mapping[int, Port]],
    probes: Sequence[Mapping[str, Probe]],
    names: Sequence[str] | None = None,
) -> list[str]:
    """Every way the cables differ from the plan, each naming the cable to move; [] when every
    planned cable is seen and no other. ``probes[i]``: rank i's ``parse_probe`` of the netdevs of
    every port it has (both, so a cable in the wrong port is seen where it is)."""
    names = list(names or [f"rank {i}" for i in range(plan.nnodes)])
    problems: list[str] = []
    planned = {frozenset((c.a, c.b)): c for c in plan.cables}
    cable_at = {end: c for c in plan.cables for end in (c.a, c.b)}
    for rank, by_port in enumerate(ports):
        for p, port in sorted(by_port.items()):
            if End(rank, p) not in cable_at:
                continue  # probed for a misplaced cable only (a pair's other port): may lack
            gone = [
                f.netdev
                for f in port.functions
                if rank < len(probes) and f.netdev in probes[rank]
                and not probes[rank][f.netdev].present
            ]  # fmt: skip
            if gone:
                problems.append(
                    f"{names[rank]}: {', '.join(gone)} (port {p}) does not exist on the host: "
                    "check fabric_ports in the inventory"
                )
    seen = observed_cables(ports, probes)
    wrong_ends: set[End] = set()
    unplanned = seen - set(planned)
    for rank, (at0, at1), (c0, c1) in swapped_at_one_rank(plan, unplanned):
        unplanned -= {frozenset((End(rank, 0), at0)), frozenset((End(rank, 1), at1))}
        wrong_ends |= {End(rank, 0), End(rank, 1), at0, at1}
        problems.append(
            f"{names[rank]}'s two cables are swapped (port 0 reaches {_port_name(names, at0)}, "
            f"port 1 reaches {_port_name(names, at1)}: like-port cabling, which NCCL cannot use "
            f"on a ring): swap the two cable ends at {names[rank]}, so that cable {c0.index} "
            f"joins {_port_name(names, at0)} and {names[rank]} port 1, and cable {c1.index} "
            f"{names[rank]} port 0 and {_port_name(names, at1)}"
        )
    for edge in sorted(unplanned, key=lambda e: sorted((x.rank, x.port) for x in e)):
        x, y = sorted(edge, key=lambda e: (e.rank, e.port))
        if x not in cable_at:  # x's port is unused by the plan: judge from y
            x, y = y, x
        wrong_ends.update(edge)
        if x not in cable_at:
            continue
        cable = cable_at[x]
        want = cable.other(x.rank)
        if plan.nnodes == 2:
            kind = "the pair's cable is elsewhere than fabric_interface says"
        elif x.port == y.port:
            kind = (
                "like-port cabling, which NCCL cannot use on a ring: port 0 of each rank goes "
                "to port 1 of the next"
            )
        else:
            kind = "a wrong neighbour"
        problems.append(
            f"{_port_name(names, x)} reaches {_port_name(names, y)} ({kind}); cable "
            f"{cable.index} must join {_port_name(names, x)} and {_port_name(names, want)}: "
            f"move the cable end at {_port_name(names, y)} to {_port_name(names, want)}"
            + (", or order the inventory as the cables run" if kind == "a wrong neighbour" else "")
        )
    blind = blind_ends(ports, probes)
    for edge, cable in planned.items():
        if edge in seen or edge & wrong_ends or edge & blind:
            continue  # a blind end proves nothing: unchecked_cables names it
        problems.append(
            f"nobody answers on cable {cable.index} ({_port_name(names, cable.a)} to "
            f"{_port_name(names, cable.b)}): plug it in, or bring its link up"
        )
    return problems
