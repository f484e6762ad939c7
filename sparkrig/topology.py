"""The fabric's addressing plan for N Sparks without a switch (issue 36, docs/rings.md): pure.

From the inventory's rank order, each rank's two QSFP ports (each port two PCIe functions, the
primary on PCIe domain 0 and its twin on domain 2, each with its netdev and RDMA device) and one
network (knob ``fabric_cidr``), ``derive`` computes everything the fabric needs; nothing of it is
typed per host:

- the cables: port 0 of rank i to port 1 of rank i+1, the last back to rank 0 (every source that
  cables a directed ring, docs/rings.md); a pair is the one cable between the ports it names;
- one /24 per function class per cable: cable e carries ``base + 2e`` (primary functions) and
  ``base + 2e + 1`` (twins), as SparkRing's installer lays out ``198.18.0.0/21``; the port-0 end
  of a cable is ``.1``, the port-1 end ``.2`` (a pair: rank 0's end ``.1``);
- per rank: the address of each netdev and the peer it faces; for rings of four and more, one
  route per function class to every cable it is not on, via the neighbour on the shorter side of
  the ring (a tie goes forward, to rank i+1), and the netdevs that forward and need rp_filter 0
  (every fabric netdev of a relaying rank); a pair and a triangle have every peer on a cable of
  its own, so no route and no forwarding.

``check_cabling`` compares who answers on each port with the plan before any address is set;
``probe_command`` / ``parse_probe`` gather that answer on a host with iputils ping and iproute2.
``discover_ports`` reads a host's ports from sysfs; ``fabric_env`` is a rank's fabric env.
"""

from __future__ import annotations

import ipaddress
import re
import shlex
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace

PRIMARY, TWIN = 0, 1
FUNCTION_NAMES = ("primary", "twin")
PORTS = (0, 1)
LINK_PREFIX = 24  # one /24 per function class per cable (SparkRing's installer, docs/rings.md)

# DGX OS's predictable names of a QSFP port's primary function: enp<bus>s<slot>f<fn>np<port>;
# its twin is the same function on PCIe domain 2 (enP2p1s0f1np1), the RDMA devices roce<...>
# (docs/rings.md "Functions per port": rocep1s0f1 / enp1s0f1np1, roceP2p1s0f1 / enP2p1s0f1np1).
DGX_OS_PRIMARY = re.compile(r"^enp(\d+)s(\d+)f(\d+)np([01])$")


class PlanError(ValueError):
    """The inventory cannot make a plan: every problem, one per line."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        super().__init__("; ".join(self.problems))


@dataclass(frozen=True)
class Function:
    """One PCIe function of a QSFP port: its netdev and RDMA device."""

    netdev: str
    rdma: str


@dataclass(frozen=True)
class Port:
    """One QSFP port of a Spark: its primary function and the PCIe twin."""

    index: int
    primary: Function
    twin: Function

    @property
    def functions(self) -> tuple[Function, Function]:
        return (self.primary, self.twin)


def dgx_os_port(primary_netdev: str) -> Port | None:
    """The port a DGX OS primary netdev belongs to, its twin and RDMA devices by DGX OS's names
    (``enp1s0f1np1`` -> port 1: rocep1s0f1, enP2p1s0f1np1, roceP2p1s0f1); None for another name."""
    m = DGX_OS_PRIMARY.match(primary_netdev)
    if not m:
        return None
    bus, slot, fn, port = m.groups()
    pci = f"p{bus}s{slot}f{fn}"
    return Port(
        int(port),
        Function(primary_netdev, f"roce{pci}"),
        Function(f"enP2{pci}np{port}", f"roceP2{pci}"),
    )


def dgx_os_default(index: int) -> Port:
    """Port ``index`` of a DGX Spark under DGX OS's names (``enp1s0f<i>np<i>`` and its twin)."""
    port = dgx_os_port(f"enp1s0f{index}np{index}")
    assert port is not None
    return port


def with_siblings(ports: Mapping[int, Port]) -> dict[int, Port]:
    """``ports`` and, for each port index they lack, DGX OS's name of it when a given primary
    has DGX OS's form (a pair names the one port its cable is in; probing the other too shows a
    cable plugged there: ``check_cabling``)."""
    out = dict(ports)
    for port in ports.values():
        m = DGX_OS_PRIMARY.match(port.primary.netdev)
        if not m:
            continue
        bus, slot, _, _ = m.groups()
        for index in PORTS:
            sibling = dgx_os_port(f"enp{bus}s{slot}f{index}np{index}")
            if index not in out and sibling is not None:
                out[index] = sibling
    return out


@dataclass(frozen=True)
class End:
    """One end of a cable: a rank's port."""

    rank: int
    port: int


@dataclass(frozen=True)
class Cable:
    """One QSFP cable; ``a`` is the port-0 end of a ring cable (``.1`` on both its subnets),
    ``b`` the port-1 end (``.2``). A pair's cable: ``a`` is rank 0's end."""

    index: int
    a: End
    b: End

    def end_of(self, rank: int) -> End:
        return self.a if self.a.rank == rank else self.b

    def other(self, rank: int) -> End:
        return self.b if self.a.rank == rank else self.a

    def touches(self, rank: int) -> bool:
        return rank in (self.a.rank, self.b.rank)


@dataclass(frozen=True)
class Link:
    """One function class of one cable: its own subnet, ``.1`` at ``a``, ``.2`` at ``b``."""

    cable: Cable
    function: int
    subnet: ipaddress.IPv4Network
    # each end's host number in the subnet (``a``'s, ``b``'s): the plan's .1 and .2, or the
    # numbers of a pair's typed fabric_address (its twin keeps them in the buddy subnet)
    hosts: tuple[int, int] = (1, 2)

    def address(self, rank: int) -> ipaddress.IPv4Interface:
        host = self.subnet.network_address + self.hosts[0 if self.cable.a.rank == rank else 1]
        return ipaddress.IPv4Interface(f"{host}/{self.subnet.prefixlen}")


@dataclass(frozen=True)
class Iface:
    """One fabric netdev of one rank in the plan: its address and whom it faces."""

    netdev: str
    rdma: str
    port: int
    function: int
    cable: int
    address: ipaddress.IPv4Interface
    peer: int  # the rank at the cable's other end
    peer_port: int
    peer_netdev: str
    peer_address: ipaddress.IPv4Address

    @property
    def function_name(self) -> str:
        return FUNCTION_NAMES[self.function]


@dataclass(frozen=True)
class Route:
    """A route to a cable's subnet this rank is not on, via a neighbour."""

    to: ipaddress.IPv4Network
    via: ipaddress.IPv4Address
    dev: str
    hop: int  # the neighbour's rank


@dataclass(frozen=True)
class RankPlan:
    """What one rank's fabric is: its netdevs, routes, relaying netdevs and peers' addresses."""

    rank: int
    ifaces: tuple[Iface, ...]
    routes: tuple[Route, ...]
    # netdevs with net.ipv4.conf.<dev>.forwarding=1 and rp_filter=0: a rank that relays
    forwarding: tuple[str, ...]
    # every other rank -> the address this rank reaches it at (its primary function's address on
    # the cable they share, else on the cable nearest to this rank along the route)
    peer_addresses: Mapping[int, ipaddress.IPv4Address] = field(default_factory=dict)

    @property
    def netdevs(self) -> tuple[str, ...]:
        return tuple(i.netdev for i in self.ifaces)

    @property
    def rdma_devices(self) -> tuple[str, ...]:
        """Every RDMA device facing a peer, in netdev order (port, then function)."""
        return tuple(i.rdma for i in self.ifaces)

    @property
    def neighbours(self) -> tuple[int, ...]:
        return tuple(sorted({i.peer for i in self.ifaces}))

    def facing(self, peer: int) -> tuple[Iface, ...]:
        return tuple(i for i in self.ifaces if i.peer == peer)

    def iface(self, netdev: str) -> Iface:
        return next(i for i in self.ifaces if i.netdev == netdev)


@dataclass(frozen=True)
class Plan:
    """The whole fabric: cables, their links (subnets) and every rank's part."""

    nnodes: int
    cidr: ipaddress.IPv4Network
    cables: tuple[Cable, ...]
    links: tuple[Link, ...]
    ranks: tuple[RankPlan, ...]

    @property
    def relays(self) -> bool:
        """Some ranks have no cable between them (a ring of four or more): IP goes via
        neighbours (routes, forwarding, rp_filter 0)."""
        return self.nnodes >= 4

    def link(self, cable: int, function: int) -> Link:
        return self.links[2 * cable + function]


def cables_of(nnodes: int, pair_ports: tuple[int, int] | None = None) -> tuple[Cable, ...]:
    """The cables: a pair's one cable between ``pair_ports`` (rank 0's, rank 1's); for three
    and more, port 0 of rank i to port 1 of rank i+1, the last back to rank 0."""
    if nnodes == 2:
        a, b = pair_ports if pair_ports is not None else (0, 1)
        return (Cable(0, End(0, a), End(1, b)),)
    return tuple(Cable(e, End(e, 0), End((e + 1) % nnodes, 1)) for e in range(nnodes))


def links_needed(nnodes: int) -> int:
    """How many /24 a plan of ``nnodes`` takes (two per cable)."""
    return 2 * len(cables_of(nnodes))


def buddy(subnet: ipaddress.IPv4Network) -> ipaddress.IPv4Network:
    """The other half of ``subnet``'s parent: 10.200.0.0/24 <-> 10.200.1.0/24."""
    flipped = int(subnet.network_address) ^ (1 << (32 - subnet.prefixlen))
    return ipaddress.IPv4Network((flipped, subnet.prefixlen))


def buddy_address(primary: ipaddress.IPv4Interface) -> ipaddress.IPv4Interface:
    """The twin's address of a typed primary address: the same host number on the buddy
    subnet (10.200.0.2/24 -> 10.200.1.2/24), as ``typed_links`` plans it."""
    net = primary.network
    twin = buddy(net).network_address + (int(primary.ip) - int(net.network_address))
    return ipaddress.IPv4Interface(f"{twin}/{net.prefixlen}")


def typed_links(
    cable: Cable, addresses: tuple[ipaddress.IPv4Interface, ipaddress.IPv4Interface]
) -> tuple[Link, Link]:
    """A pair's two links from its typed primary addresses (rank 0's, rank 1's): the primary
    function on their subnet, the twin on its buddy (``buddy``) with the same host numbers, so
    one range (their parent, NCCL_IB_ADDR_RANGE) holds both and neither is routed elsewhere."""
    net = addresses[0].network
    hosts = (
        int(addresses[0].ip) - int(net.network_address),
        int(addresses[1].ip) - int(net.network_address),
    )
    return (Link(cable, PRIMARY, net, hosts), Link(cable, TWIN, buddy(net), hosts))


def typed_problems(
    addresses: tuple[ipaddress.IPv4Interface, ipaddress.IPv4Interface],
) -> list[str]:
    """What a pair's typed primary addresses cannot carry: two subnets, one address, or a
    subnet with no buddy of its size (a prefix of /1 or shorter, or a /31 and /32)."""
    a, b = addresses
    if a.network != b.network:
        return [f"fabric_address: rank 1's {b} is not on rank 0's subnet {a.network}"]
    if a.ip == b.ip:
        return [f"fabric_address: both ranks have {a.ip}"]
    if not 2 <= a.network.prefixlen <= 30:
        return [f"fabric_address: {a} needs a prefix of /2 to /30 (the twin takes its buddy)"]
    return []


def derive(
    ports: Sequence[Mapping[int, Port]],
    cidr: ipaddress.IPv4Network | str,
    pair_ports: tuple[int, int] | None = None,
    typed: tuple[ipaddress.IPv4Interface, ipaddress.IPv4Interface] | None = None,
) -> Plan:
    """The plan for ``len(ports)`` ranks in inventory order (rank i = ``ports[i]``, each rank's
    ports by index). A pair uses the one port each rank's ``pair_ports`` entry names; three and
    more need both ports of every rank. ``typed``: a pair's own primary addresses (its
    inventory's fabric_address), kept, the twin's derived (``typed_links``); the plan's range
    is then their parent, or ``cidr`` when it holds both. Raises PlanError naming every
    problem."""
    net = ipaddress.IPv4Network(cidr)
    n = len(ports)
    problems: list[str] = []
    if n < 2:
        raise PlanError([f"a fabric needs at least 2 ranks, the inventory has {n}"])
    if n == 2 and pair_ports is None:
        problems.append("a pair needs the port each rank's cable is in (pair_ports)")
    if typed is not None:
        problems.extend(
            typed_problems(typed) if n == 2 else ["fabric_address: only a pair's is typed"]
        )
    elif net.prefixlen > LINK_PREFIX:
        problems.append(f"fabric_cidr {net} is smaller than one /{LINK_PREFIX}")
    else:
        have = 2 ** (LINK_PREFIX - net.prefixlen)
        if have < links_needed(n):
            wider = LINK_PREFIX - (links_needed(n) - 1).bit_length()
            problems.append(
                f"fabric_cidr {net} holds {have} /{LINK_PREFIX}; {n} ranks need "
                f"{links_needed(n)} (two per cable): use a /{wider} or larger"
            )
    for rank, by_port in enumerate(ports):
        needed = [pair_ports[rank]] if n == 2 and pair_ports else list(PORTS)
        for p in needed:
            if p not in by_port:
                why = "the pair's cable is in it" if n == 2 else "a ring uses both ports"
                problems.append(f"rank {rank}: port {p} is not named ({why})")
        names = [f.netdev for p in needed if p in by_port for f in by_port[p].functions]
        devices = [f.rdma for p in needed if p in by_port for f in by_port[p].functions]
        for kind, values in (("netdev", names), ("RDMA device", devices)):
            twice = sorted({v for v in values if values.count(v) > 1})
            if twice:
                problems.append(f"rank {rank}: {kind} {', '.join(twice)} named twice")
    if problems:
        raise PlanError(problems)

    cables = cables_of(n, pair_ports)
    base = int(net.network_address)
    links = tuple(
        Link(c, f, ipaddress.IPv4Network((base + (2 * c.index + f) * 256, LINK_PREFIX)))
        for c in cables
        for f in (PRIMARY, TWIN)
    )
    if typed is not None:
        links = typed_links(cables[0], typed)
        if not all(link.subnet.subnet_of(net) for link in links):
            net = links[0].subnet.supernet()

    def link(cable: Cable, function: int) -> Link:
        return links[2 * cable.index + function]

    ranks = []
    for rank in range(n):
        ifaces: list[Iface] = []
        mine = sorted((c for c in cables if c.touches(rank)), key=lambda c: c.end_of(rank).port)
        for cable in mine:
            end, other = cable.end_of(rank), cable.other(rank)
            for f in (PRIMARY, TWIN):
                ifaces.append(
                    Iface(
                        netdev=ports[rank][end.port].functions[f].netdev,
                        rdma=ports[rank][end.port].functions[f].rdma,
                        port=end.port,
                        function=f,
                        cable=cable.index,
                        address=link(cable, f).address(rank),
                        peer=other.rank,
                        peer_port=other.port,
                        peer_netdev=ports[other.rank][other.port].functions[f].netdev,
                        peer_address=link(cable, f).address(other.rank).ip,
                    )
                )
        routes: list[Route] = []
        peers: dict[int, ipaddress.IPv4Address] = {}
        if n >= 4:
            forward, back = (rank + 1) % n, (rank - 1) % n
            for cable in cables:
                if cable.touches(rank):
                    continue
                # cable e joins ranks e and e+1: reach e going forward, e+1 going back
                ahead = (cable.a.rank - rank) % n
                behind = (rank - cable.b.rank) % n
                hop = forward if ahead <= behind else back
                for f in (PRIMARY, TWIN):
                    out = next(i for i in ifaces if i.peer == hop and i.function == f)
                    routes.append(Route(link(cable, f).subnet, out.peer_address, out.netdev, hop))
        for peer in range(n):
            if peer == rank:
                continue
            direct = [i for i in ifaces if i.peer == peer and i.function == PRIMARY]
            if direct:
                peers[peer] = direct[0].peer_address
                continue
            ahead = (peer - rank) % n
            # going forward, the peer's end of the cable from peer-1 (its port 1); else its
            # port 0 end of the cable to peer+1 (the routes above take the same way)
            cable = cables[(peer - 1) % n] if ahead <= n - ahead else cables[peer]
            peers[peer] = link(cable, PRIMARY).address(peer).ip
        ranks.append(
            RankPlan(
                rank=rank,
                ifaces=tuple(ifaces),
                routes=tuple(routes),
                forwarding=tuple(i.netdev for i in ifaces) if n >= 4 else (),
                peer_addresses=peers,
            )
        )
    return Plan(nnodes=n, cidr=net, cables=cables, links=links, ranks=tuple(ranks))


# ---------------------------------------------------------------------------------------------
# Links that fail the don't-fragment ping: named, then left out or refused (fabric_link_silent)
# ---------------------------------------------------------------------------------------------


def df_ping_command(iface: Iface, mtu: int) -> str:
    """One direction of one link: a full-MTU do-not-fragment ping out of ``iface`` to the peer
    function it faces (the proof TensorFold takes before it uses a twin [TF: v1.10, #66])."""
    return (
        f"ping -M do -s {mtu - 28} -c 2 -i 0.2 -W 2 -I {shlex.quote(iface.netdev)} "
        f"{iface.peer_address}"
    )


def silent_links(plan: Plan, failed: Mapping[int, Sequence[str]]) -> list[Link]:
    """The links (a cable's function class) that failed the ping in either direction:
    ``failed[rank]`` lists the netdevs whose ping failed on that rank."""
    out = []
    for link in plan.links:
        for end in (link.cable.a, link.cable.b):
            part = plan.ranks[end.rank]
            dev = next(
                i.netdev
                for i in part.ifaces
                if i.cable == link.cable.index and i.function == link.function
            )
            if dev in failed.get(end.rank, ()):
                out.append(link)
                break
    return out


def without_links(plan: Plan, links: Sequence[Link], names: Sequence[str] | None = None) -> Plan:
    """The plan with ``links`` left out on both of their ends (no address, no RDMA device in
    NCCL_IB_HCA, no route through them). A cable left with no link is a cable down: refused
    (PlanError naming it), as is a route that has no link of its function class to go by."""
    names = list(names or [f"rank {i}" for i in range(plan.nnodes)])
    gone = {(link.cable.index, link.function) for link in links}
    problems = [cable_down(cable, names) for cable in cables_down(plan, links)]
    if problems:
        raise PlanError(problems)
    ranks = []
    for part in plan.ranks:
        ifaces = tuple(i for i in part.ifaces if (i.cable, i.function) not in gone)
        kept = {i.netdev for i in ifaces}
        ranks.append(
            replace(
                part,
                ifaces=ifaces,
                routes=tuple(r for r in part.routes if r.dev in kept),
                forwarding=tuple(d for d in part.forwarding if d in kept),
            )
        )
    for n, part in enumerate(ranks):  # a peer's address on a link that is gone: its twin's
        addresses = dict(part.peer_addresses)
        for peer, address in part.peer_addresses.items():
            if any(i.address.ip == address for i in ranks[peer].ifaces):
                continue
            direct = [i.peer_address for i in part.ifaces if i.peer == peer]
            if direct:
                addresses[peer] = direct[0]
            else:
                addresses.pop(peer)
        ranks[n] = replace(part, peer_addresses=addresses)
    # a route is good while its next hop has the subnet on a netdev or a good route to it
    changed = True
    while changed:
        changed = False
        for n, part in enumerate(ranks):
            good = tuple(
                r
                for r in part.routes
                if any(i.address.network == r.to for i in ranks[r.hop].ifaces)
                or any(x.to == r.to for x in ranks[r.hop].routes)
            )
            if good != part.routes:
                ranks[n] = replace(part, routes=good)
                changed = True
    return replace(plan, ranks=tuple(ranks))


def cables_down(plan: Plan, links: Sequence[Link]) -> list[Cable]:
    """The cables both of whose function classes are among ``links``."""
    gone = {(link.cable.index, link.function) for link in links}
    return [c for c in plan.cables if all((c.index, f) in gone for f in (PRIMARY, TWIN))]


def cable_down(cable: Cable, names: Sequence[str]) -> str:
    """``cable 1 (spark-b port 0 to spark-c port 1): neither function answers ...``."""
    return (
        f"cable {cable.index} ({names[cable.a.rank]} port {cable.a.port} to "
        f"{names[cable.b.rank]} port {cable.b.port}): neither function answers a "
        "don't-fragment ping both ways; check the cable and both ports' MTU"
    )


def link_name(plan: Plan, link: Link, names: Sequence[str]) -> str:
    """``cable 1 twin (spark-b enP2p1s0f0np0 to spark-c enP2p1s0f1np1)``."""
    ends = []
    for end in (link.cable.a, link.cable.b):
        dev = next(
            i.netdev
            for i in plan.ranks[end.rank].ifaces
            if i.cable == link.cable.index and i.function == link.function
        )
        ends.append(f"{names[end.rank]} {dev}")
    return f"cable {link.cable.index} {FUNCTION_NAMES[link.function]} ({ends[0]} to {ends[1]})"


def judge_links(
    plan: Plan,
    failed: Mapping[int, Sequence[str]],
    mode: str,
    names: Sequence[str] | None = None,
) -> tuple[Plan, list[str]]:
    """What knob ``fabric_link_silent`` does with the links that failed the don't-fragment ping
    (``failed[rank]``: the netdevs whose ping failed there): ``"refuse"``: the plan unchanged and
    one problem per link, named; ``"omit"``: the plan without them and one note per link (a
    cable with neither function left is refused either way)."""
    names = list(names or [f"rank {i}" for i in range(plan.nnodes)])
    silent = silent_links(plan, failed)
    said = [
        f"{link_name(plan, link, names)} does not answer a full-MTU don't-fragment ping both ways"
        for link in silent
    ]
    if mode == "refuse":
        # a cable down is named whole: leaving both of its functions out cannot serve either
        down = cables_down(plan, silent)
        whole = {c.index for c in down}
        return plan, [cable_down(c, names) for c in down] + [
            f"{line} (fabric_link_silent = 'omit' leaves it out)"
            for link, line in zip(silent, said, strict=True)
            if link.cable.index not in whole
        ]
    return without_links(plan, silent, names), [f"{line}: left out" for line in said]


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


# ---------------------------------------------------------------------------------------------
# The per-rank environment of the fabric (NCCL and TensorFold), from the plan
# ---------------------------------------------------------------------------------------------

# TensorFold's 4-Spark ring: the per-rank NCCL graph file and the two link graphs, read-only
# mounts at these container paths (docs/rings.md; tensorfold.md "4-Spark ring adds", M2
# scripts/nodes.sh@14a5e91c and config.sh@336811f8)
GRAPH_FILE = "/nccl-graph.xml"
RING_GRAPHS = ("/nccl-link-prev.xml", "/nccl-link-next.xml")


def socket_ifname(plan: Plan, rank: int, uplinks: Sequence[str] = ()) -> str:
    """Where NCCL and gloo bootstrap: a pair over its primary fabric netdev (as today); three
    and more over the LAN (no fabric address reaches every rank directly: TensorFold's TP>2
    rule, docs/rings.md): the first uplink named, else every interface but loopback, docker's
    and the fabric netdevs."""
    part = plan.ranks[rank]
    if plan.nnodes == 2:
        return part.ifaces[0].netdev
    if uplinks:
        return "=" + uplinks[0]
    return "^" + ",".join(["lo", "docker", "veth", *part.netdevs])  # prefixes left out


# two ranks over one cable: both functions, one NIC each, primary to primary and twin to twin
PAIR_ENV = [("NCCL_CROSS_NIC", "0"), ("NCCL_IB_MERGE_NICS", "0")]


def ib_env(
    ifaces: Sequence[Iface], cidr: ipaddress.IPv4Network, roce_port: int, ifname: str
) -> list[tuple[str, str]]:
    """NCCL over RoCE v2 on the RDMA devices of ``ifaces`` (each one's GID by value: in
    NCCL_IB_ADDR_RANGE ``cidr``), bootstrapping on ``ifname`` (NCCL's syntax; gloo gets it too
    unless it is an exclusion list), with sparkrig's own SPARKRIG_* lines first."""
    env = [
        ("SPARKRIG_FABRIC_LAYOUT", "ports"),
        ("SPARKRIG_FABRIC_NETDEVS", ",".join(i.netdev for i in ifaces)),
        ("SPARKRIG_ROCE_DEVICES", ",".join(i.rdma for i in ifaces)),
        ("SPARKRIG_FABRIC_ADDRESSES", ",".join(str(i.address.ip) for i in ifaces)),
        ("NCCL_NET", "IB"),
        ("NCCL_IB_DISABLE", "0"),
        ("NCCL_IB_HCA", "=" + ",".join(f"{i.rdma}:{roce_port}" for i in ifaces)),
        ("NCCL_IB_ROCE_VERSION_NUM", "2"),
        ("NCCL_IB_ADDR_FAMILY", "AF_INET"),
        ("NCCL_IB_ADDR_RANGE", str(cidr)),
        ("NCCL_SOCKET_IFNAME", ifname),
    ]
    if not ifname.startswith("^"):  # gloo takes interface names, not NCCL's exclusions
        env.append(("GLOO_SOCKET_IFNAME", ifname.removeprefix("=")))
    return env


def link_env(plan: Plan, rank: int, cable: int, roce_port: int = 1) -> list[tuple[str, str]]:
    """The env of a two-rank NCCL run over one cable of a triangle or a ring, at ``rank`` (one
    of its ends): a pair's env on that cable's functions (those the plan kept), bootstrapping on
    its first netdev there. What the per-link NCCL smoke test runs with (issue 36: the busbw of
    every link)."""
    ifaces = [i for i in plan.ranks[rank].ifaces if i.cable == cable]
    if not ifaces:
        raise ValueError(f"rank {rank} has no function of cable {cable} in the plan")
    return ib_env(ifaces, plan.cidr, roce_port, "=" + ifaces[0].netdev) + PAIR_ENV


def function_env(plan: Plan, rank: int, function: int, roce_port: int = 1) -> list[tuple[str, str]]:
    """The env of a pair's NCCL run on one function of its cable alone, at ``rank``: the pair's
    env with NCCL_IB_HCA naming that function's device only, bootstrapping where the pair's does.
    What the per-function smoke test runs with (the figure of each function, and which one is
    slow when the pair's is)."""
    if plan.nnodes != 2:
        raise ValueError("one function alone is a pair's test")
    ifaces = [i for i in plan.ranks[rank].ifaces if i.function == function]
    if not ifaces:
        raise ValueError(f"rank {rank} has no {FUNCTION_NAMES[function]} function in the plan")
    return ib_env(ifaces, plan.cidr, roce_port, socket_ifname(plan, rank)) + PAIR_ENV


def fabric_env(
    plan: Plan, rank: int, roce_port: int = 1, uplinks: Sequence[str] = ()
) -> list[tuple[str, str]]:
    """The fabric part of rank ``rank``'s env file (fabric_layout "ports"), in order.

    Every plan: NCCL over RoCE v2 on every RDMA device facing a peer (NCCL_IB_HCA), the GID
    chosen by value per device: NCCL_IB_GID_INDEX is left unset, so NCCL (>= 2.21, default -1)
    takes on each device the RoCE v2 GID whose IPv4 is in NCCL_IB_ADDR_RANGE (fabric_cidr).
    A pair: both functions of its cable, one NIC each (NCCL_IB_MERGE_NICS=0, NCCL_CROSS_NIC=0:
    primary to primary, twin to twin). Three and more, TensorFold's N-rank env (its
    scripts/nodes.sh ``nccl_env_n``): cross-NIC, subnet-aware routing (each peer through the
    device on its subnet), no P2P/SHM, 4 channels, TF_ROCE_HCA the same devices. A ring of four
    and more adds ring-only NCCL (NCCL_ALGO=Ring, no merged NICs), the per-rank graph files
    (NCCL_GRAPH_FILE, TF_NCCL_RING_GRAPHS), TF_NCCL_RING and TF_ROCE_RING (relay through
    neighbours) and NCCL_IB_SUBNET_PREFIX_LEN: /24, each function's own subnet here (TensorFold
    computes a longer one only because its twins share a /24)."""
    part = plan.ranks[rank]
    env = ib_env(part.ifaces, plan.cidr, roce_port, socket_ifname(plan, rank, uplinks))
    if plan.nnodes == 2:
        return env + PAIR_ENV
    env += [
        ("NCCL_CROSS_NIC", "1"),
        ("NCCL_IB_SUBNET_AWARE_ROUTING", "1"),
        ("NCCL_P2P_DISABLE", "1"),
        ("NCCL_SHM_DISABLE", "1"),
        ("NCCL_MIN_NCHANNELS", "4"),
        ("NCCL_MAX_NCHANNELS", "4"),
        ("TF_ROCE_HCA", ",".join(part.rdma_devices)),
    ]
    if plan.relays:
        env += [
            ("NCCL_ALGO", "Ring"),
            ("NCCL_IB_MERGE_NICS", "0"),
            ("NCCL_IB_SUBNET_PREFIX_LEN", str(LINK_PREFIX)),
            ("NCCL_GRAPH_FILE", GRAPH_FILE),
            ("TF_NCCL_RING", "1"),
            ("TF_NCCL_RING_GRAPHS", ",".join(RING_GRAPHS)),
            ("TF_ROCE_RING", "1"),
        ]
    return env
