"""The fabric's addressing plan for N Sparks without a switch (docs/rings.md): pure.

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

A link that fails its don't-fragment ping is named and left out or refused (``judge_links``).
Who answers on each port against the plan: sparkrig/cabling.py; a rank's fabric env from the
plan: sparkrig/fabricenv.py."""

from __future__ import annotations

import ipaddress
import re
import shlex
from collections.abc import Mapping, Sequence
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
