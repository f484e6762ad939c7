"""sparkrig/topology.py: the addressing plan for 2, 3, 4 and 8 Sparks, the routes, the cabling
rule and its probe's parser (issue 36, docs/rings.md)."""

from __future__ import annotations

import ipaddress
import itertools

import pytest

from sparkrig.cabling import Heard, Probe, check_cabling, parse_probe, probe_command
from sparkrig.topology import (
    PRIMARY,
    TWIN,
    End,
    PlanError,
    derive,
    dgx_os_default,
    dgx_os_port,
)


def ring_ports(n: int) -> list[dict[int, object]]:
    return [{p: dgx_os_default(p) for p in (0, 1)} for _ in range(n)]


def net(text: str) -> ipaddress.IPv4Network:
    return ipaddress.IPv4Network(text)


def test_dgx_os_names_give_the_twin_and_rdma_devices():
    port = dgx_os_port("enp1s0f1np1")
    assert port is not None and port.index == 1
    assert (port.primary.netdev, port.primary.rdma) == ("enp1s0f1np1", "rocep1s0f1")
    assert (port.twin.netdev, port.twin.rdma) == ("enP2p1s0f1np1", "roceP2p1s0f1")
    assert dgx_os_default(0).twin.rdma == "roceP2p1s0f0"
    assert dgx_os_port("eth1") is None and dgx_os_port("enP2p1s0f1np1") is None


def test_a_pair_addresses_both_functions_of_its_one_cable():
    ports = [{1: dgx_os_default(1)}, {1: dgx_os_default(1)}]  # like-port: fine for a pair
    plan = derive(ports, "198.18.0.0/21", pair_ports=(1, 1))
    assert len(plan.cables) == 1 and not plan.relays
    assert [str(link.subnet) for link in plan.links] == ["198.18.0.0/24", "198.18.1.0/24"]
    head, worker = plan.ranks
    assert [(i.netdev, str(i.address), str(i.peer_address)) for i in head.ifaces] == [
        ("enp1s0f1np1", "198.18.0.1/24", "198.18.0.2"),
        ("enP2p1s0f1np1", "198.18.1.1/24", "198.18.1.2"),
    ]
    assert [str(i.address) for i in worker.ifaces] == ["198.18.0.2/24", "198.18.1.2/24"]
    assert head.rdma_devices == ("rocep1s0f1", "roceP2p1s0f1")
    assert head.routes == () and head.forwarding == () and worker.forwarding == ()
    assert {k: str(v) for k, v in worker.peer_addresses.items()} == {0: "198.18.0.1"}


def test_a_triangle_cables_every_pair_and_needs_no_route():
    plan = derive(ring_ports(3), "198.18.0.0/21")
    assert [(c.a, c.b) for c in plan.cables] == [
        (End(0, 0), End(1, 1)),
        (End(1, 0), End(2, 1)),
        (End(2, 0), End(0, 1)),
    ]
    assert [str(link.subnet) for link in plan.links] == [f"198.18.{i}.0/24" for i in range(6)]
    for r in plan.ranks:
        assert len(r.ifaces) == 4 and r.routes == () and r.forwarding == ()
        assert set(r.neighbours) == {0, 1, 2} - {r.rank}  # every other rank is a neighbour
        # each function faces the same function class of its peer, on the same subnet
        for i in r.ifaces:
            peer = plan.ranks[i.peer].iface(i.peer_netdev)
            assert peer.peer == r.rank and peer.function == i.function
            assert peer.address.network == i.address.network
            assert peer.address.ip == i.peer_address
    r2 = plan.ranks[2]
    assert [(i.netdev, str(i.address), i.peer) for i in r2.ifaces] == [
        ("enp1s0f0np0", "198.18.4.1/24", 0),
        ("enP2p1s0f0np0", "198.18.5.1/24", 0),
        ("enp1s0f1np1", "198.18.2.2/24", 1),
        ("enP2p1s0f1np1", "198.18.3.2/24", 1),
    ]


def test_a_ring_of_four_matches_sparkrings_layout_and_routes_via_the_nearer_neighbour():
    plan = derive(ring_ports(4), "198.18.0.0/21")
    assert plan.relays
    r0 = plan.ranks[0]
    # SparkRing installer (docs/rings.md, S4): cable e carries 198.18.(2e).0/24 and (2e+1),
    # and rank 0 has `198.18.4.0/24 via 198.18.6.1 dev enp1s0f1np1`
    routes = [(str(x.to), str(x.via), x.dev, x.hop) for x in r0.routes]
    assert routes == [
        ("198.18.2.0/24", "198.18.0.2", "enp1s0f0np0", 1),
        ("198.18.3.0/24", "198.18.1.2", "enP2p1s0f0np0", 1),
        ("198.18.4.0/24", "198.18.6.1", "enp1s0f1np1", 3),
        ("198.18.5.0/24", "198.18.7.1", "enP2p1s0f1np1", 3),
    ]
    assert r0.forwarding == ("enp1s0f0np0", "enP2p1s0f0np0", "enp1s0f1np1", "enP2p1s0f1np1")
    assert set(r0.neighbours) == {1, 3}
    # the diagonal (rank 2) is reached at an address a route of rank 0 covers, via rank 1
    assert str(r0.peer_addresses[2]) == "198.18.2.2"
    for r in plan.ranks:
        assert len(r.routes) == 4 and len(r.forwarding) == 4
        assert all(x.hop in r.neighbours for x in r.routes)


def hops(plan, src: int, dst: int) -> list[int]:
    """Follow the routes from rank ``src`` to rank ``dst``'s address (at most N hops)."""
    target = plan.ranks[src].peer_addresses[dst]
    path, here = [src], src
    for _ in range(plan.nnodes):
        r = plan.ranks[here]
        if any(i.address.ip == target for i in plan.ranks[dst].ifaces) and any(
            i.address.network == ipaddress.IPv4Network(f"{target}/24", strict=False)
            for i in r.ifaces
        ):
            return [*path, dst] if here != dst else path
        route = next(x for x in r.routes if target in x.to)
        here = route.hop
        path.append(here)
    raise AssertionError(f"no way from {src} to {dst}: {path}")


@pytest.mark.parametrize("n", [4, 5, 8])
def test_every_rank_reaches_every_other_by_the_shorter_side(n):
    plan = derive(ring_ports(n), "198.18.0.0/20")
    for src, dst in itertools.permutations(range(n), 2):
        path = hops(plan, src, dst)
        ring = min((dst - src) % n, (src - dst) % n)
        assert len(path) - 1 == ring, (src, dst, path)


def test_a_ring_of_eight_on_paper():
    plan = derive(ring_ports(8), "198.18.0.0/20")
    assert len(plan.links) == 16
    assert [str(link.subnet) for link in plan.links][-2:] == ["198.18.14.0/24", "198.18.15.0/24"]
    r0 = plan.ranks[0]
    assert len(r0.routes) == 2 * 6  # every cable but its own two, both function classes
    by_hop = {h: [str(x.to) for x in r0.routes if x.hop == h] for h in (1, 7)}
    # cables 1..3 (rank 3 is 3 ahead, rank 4 is 4 behind) via rank 1, cables 4..6 via rank 7
    assert by_hop[1] == [f"198.18.{i}.0/24" for i in range(2, 8)]
    assert by_hop[7] == [f"198.18.{i}.0/24" for i in range(8, 14)]
    # rank 4, the far side, is 4 hops either way: the tie goes forward (via rank 1)
    assert str(r0.peer_addresses[4]) == "198.18.6.2"


@pytest.mark.parametrize(
    ("ports", "cidr", "pair", "message"),
    [
        (ring_ports(4), "198.18.0.0/22", None, "198.18.0.0/22 holds 4 /24; 4 ranks need 8"),
        (ring_ports(8), "198.18.0.0/21", None, "8 ranks need 16 (two per cable): use a /20"),
        (ring_ports(3), "198.18.0.0/25", None, "smaller than one /24"),
        ([{0: dgx_os_default(0)}] * 3, "198.18.0.0/21", None, "rank 0: port 1 is not named"),
        (ring_ports(2), "198.18.0.0/21", None, "a pair needs the port each rank's cable is in"),
        (ring_ports(1), "198.18.0.0/21", None, "at least 2 ranks"),
        (
            [{0: dgx_os_default(0), 1: dgx_os_default(0)}] * 3,
            "198.18.0.0/21",
            None,
            "rank 0: netdev enP2p1s0f0np0, enp1s0f0np0 named twice",
        ),
    ],
)
def test_a_plan_that_cannot_be_made_is_refused_naming_why(ports, cidr, pair, message):
    with pytest.raises(PlanError) as err:
        derive(ports, cidr, pair)
    assert message in str(err.value)


# ---------------------------------------------------------------------------------------------
# The cabling rule
# ---------------------------------------------------------------------------------------------


def mac(rank: int, port: int, function: int) -> str:
    return f"02:00:00:{rank:02x}:{port:02x}:{function:02x}"


def ll(rank: int, port: int, function: int) -> str:
    return f"fe80::{rank + 1:x}:{port}:{function}"


def probes_for(n: int, cables: list[tuple[tuple[int, int], tuple[int, int]]], by_mac=True):
    """What every rank's netdevs hear when ``cables`` ((rank, port), (rank, port)) are plugged:
    both functions of the far port answer on either function of the near one."""
    far: dict[tuple[int, int], tuple[int, int]] = {}
    for x, y in cables:
        far[x], far[y] = y, x
    out = []
    for rank in range(n):
        seen = {}
        for p in (0, 1):
            for f in (PRIMARY, TWIN):
                dev = dgx_os_default(p).functions[f].netdev
                other = far.get((rank, p))
                heard = ()
                if other:
                    heard = tuple(
                        Heard(ll(*other, g), mac(*other, g) if by_mac else None) for g in (0, 1)
                    )
                seen[dev] = Probe(dev, mac(rank, p, f), (ll(rank, p, f),), heard)
        out.append(seen)
    return out


def ring_cables(n: int) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    return [((i, 0), ((i + 1) % n, 1)) for i in range(n)]


NAMES = ["spark-a", "spark-b", "spark-c", "spark-d"]


@pytest.mark.parametrize("n", [3, 4])
@pytest.mark.parametrize("by_mac", [True, False])
def test_a_ring_cabled_by_the_rule_passes(n, by_mac):
    plan = derive(ring_ports(n), "198.18.0.0/21")
    assert check_cabling(plan, ring_ports(n), probes_for(n, ring_cables(n), by_mac), NAMES) == []


def test_a_like_port_cable_is_refused_naming_the_cable_to_move():
    plan = derive(ring_ports(4), "198.18.0.0/21")
    # the ring's cable 1 plugged p0 -> p0 at spark-c (cable 2 left out): one cable to move
    cables = [((0, 0), (1, 1)), ((1, 0), (2, 0)), ((3, 0), (0, 1))]
    problems = check_cabling(plan, ring_ports(4), probes_for(4, cables), NAMES)
    assert problems[0] == (
        "spark-b port 0 reaches spark-c port 0 (like-port cabling, which NCCL cannot use on a "
        "ring: port 0 of each rank goes to port 1 of the next); cable 1 must join spark-b port 0 "
        "and spark-c port 1: move the cable end at spark-c port 0 to spark-c port 1"
    )


@pytest.mark.parametrize("n", [3, 4])
def test_a_ranks_two_cables_swapped_are_named_as_one_swap(n):
    plan = derive(ring_ports(n), "198.18.0.0/21")
    # spark-c's two ports swapped: its p0 takes cable 1 (from spark-b's p0), its p1 cable 2
    cables = [tuple((r, 1 - p) if r == 2 else (r, p) for r, p in c) for c in ring_cables(n)]
    problems = check_cabling(plan, ring_ports(n), probes_for(n, cables), NAMES)
    far = "spark-a" if n == 3 else "spark-d"
    assert problems == [
        f"spark-c's two cables are swapped (port 0 reaches spark-b port 0, port 1 reaches {far} "
        "port 1: like-port cabling, which NCCL cannot use on a ring): swap the two cable ends at "
        "spark-c, so that cable 1 joins spark-b port 0 and spark-c port 1, and cable 2 spark-c "
        f"port 0 and {far} port 1"
    ]


def test_tensorfolds_mirrored_ring_of_four_is_refused():
    # TensorFold's switchless TP4 cables like port to like port (docs/rings.md)
    plan = derive(ring_ports(4), "198.18.0.0/21")
    cables = [((0, 1), (1, 1)), ((1, 0), (2, 0)), ((2, 1), (3, 1)), ((3, 0), (0, 0))]
    problems = check_cabling(plan, ring_ports(4), probes_for(4, cables), NAMES)
    # two swaps mend it: spark-a's two ends and spark-c's
    assert [p.split("'")[0] for p in problems] == ["spark-a", "spark-c"]
    assert all("like-port" in p and "swap the two cable ends" in p for p in problems)


def test_a_wrong_neighbour_is_named():
    plan = derive(ring_ports(4), "198.18.0.0/21")
    # spark-b and spark-c swapped in the inventory's order
    cables = [((0, 0), (2, 1)), ((2, 0), (1, 1)), ((1, 0), (3, 1)), ((3, 0), (0, 1))]
    problems = check_cabling(plan, ring_ports(4), probes_for(4, cables), NAMES)
    assert problems[0] == (
        "spark-a port 0 reaches spark-c port 1 (a wrong neighbour); cable 0 must join spark-a "
        "port 0 and spark-b port 1: move the cable end at spark-c port 1 to spark-b port 1, or "
        "order the inventory as the cables run"
    )


def test_a_missing_cable_and_a_missing_netdev_are_named():
    plan = derive(ring_ports(3), "198.18.0.0/21")
    probes = probes_for(3, ring_cables(3)[:2])
    assert check_cabling(plan, ring_ports(3), probes, NAMES) == [
        "nobody answers on cable 2 (spark-c port 0 to spark-a port 1): plug it in, or bring its "
        "link up"
    ]
    probes = probes_for(3, ring_cables(3))
    probes[1]["enP2p1s0f0np0"] = Probe("enP2p1s0f0np0", None, present=False)
    assert check_cabling(plan, ring_ports(3), probes, NAMES) == [
        "spark-b: enP2p1s0f0np0 (port 0) does not exist on the host: check fabric_ports in the "
        "inventory"
    ]


def test_a_pair_cable_in_the_other_port_is_named():
    ports = ring_ports(2)
    plan = derive(ports, "198.18.0.0/21", pair_ports=(1, 1))
    problems = check_cabling(plan, ports, probes_for(2, [((0, 0), (1, 1))]), NAMES)
    assert problems == [
        "spark-b port 1 reaches spark-a port 0 (the pair's cable is elsewhere than "
        "fabric_interface says); cable 0 must join spark-b port 1 and spark-a port 1: move the "
        "cable end at spark-a port 0 to spark-a port 1"
    ]
    assert check_cabling(plan, ports, probes_for(2, [((0, 1), (1, 1))]), NAMES) == []


def test_a_pairs_other_port_may_lack_its_netdevs_but_its_own_may_not():
    # probed only to see a cable in the wrong port: a host without it (a driver's port left
    # out) still serves the pair on its cabled port
    ports = ring_ports(2)
    plan = derive(ports, "198.18.0.0/21", pair_ports=(1, 1))
    probes = probes_for(2, [((0, 1), (1, 1))])
    for rank in (0, 1):
        for dev in ("enp1s0f0np0", "enP2p1s0f0np0"):
            probes[rank][dev] = Probe(dev, None, present=False)
    assert check_cabling(plan, ports, probes, NAMES) == []
    probes[1]["enP2p1s0f1np1"] = Probe("enP2p1s0f1np1", None, present=False)
    assert check_cabling(plan, ports, probes, NAMES) == [
        "spark-b: enP2p1s0f1np1 (port 1) does not exist on the host: check fabric_ports in the "
        "inventory"
    ]


# ---------------------------------------------------------------------------------------------
# The probe: command and parser
# ---------------------------------------------------------------------------------------------

PROBE_OUTPUT = """\
##netdev enp1s0f0np0
mac 02:00:00:00:00:00
addr 5: enp1s0f0np0    inet6 fe80::1/64 scope link \\       valid_lft forever preferred_lft forever
from fe80::1
from fe80::2
from fe80::3
from fe80::2
neigh fe80::2 lladdr 02:00:00:01:01:00 STALE
neigh fe80::3 lladdr 02:00:00:01:01:01 REACHABLE
neigh fe80::9 FAILED
##netdev enP2p1s0f0np0
absent
##netdev enp1s0f1np1
mac 02:00:00:00:01:00
"""


def test_the_probe_parser_reads_who_answered_by_mac():
    probes = parse_probe(PROBE_OUTPUT.splitlines())
    p0 = probes["enp1s0f0np0"]
    assert p0.mac == "02:00:00:00:00:00" and p0.link_local == ("fe80::1",)
    # our own fe80 (a multicast echo loops back) is no answer; duplicates collapse
    assert p0.heard == (
        Heard("fe80::2", "02:00:00:01:01:00"),
        Heard("fe80::3", "02:00:00:01:01:01"),
    )
    assert not probes["enP2p1s0f0np0"].present
    assert probes["enp1s0f1np1"].heard == () and probes["enp1s0f1np1"].present


def test_the_probe_command_pings_all_nodes_out_of_each_netdev_only():
    command = probe_command(["enp1s0f0np0", "enP2p1s0f0np0"])
    assert command.count("ff02::1") == 2 and "-I enP2p1s0f0np0 ff02::1" in command
    assert "ip -6 neigh show dev enp1s0f0np0" in command
    assert "ip -4" not in command and " addr add" not in command  # it sets nothing


def test_a_responder_is_known_by_its_mac_when_its_link_local_is_not_reported():
    # stable-privacy fe80 addresses, or a peer whose probe did not list them: the MAC decides
    plan = derive(ring_ports(3), "198.18.0.0/21")
    probes = probes_for(3, ring_cables(3))
    for seen in probes:
        for dev, probe in seen.items():
            seen[dev] = Probe(dev, probe.mac, (), probe.heard)
    assert check_cabling(plan, ring_ports(3), probes, NAMES) == []


def test_the_fabric_neighbours_fact_reads_the_probe_to_its_end_mark():
    from sparkrig.fabricfacts import FabricNeighbours
    from sparkrig.factlines import END

    fact = FabricNeighbours()
    command = fact.command(["enp1s0f0np0"])
    assert command.endswith(f"echo '{END}'") and "-I enp1s0f0np0 ff02::1" in command
    probes = fact.process([*PROBE_OUTPUT.splitlines(), END])
    assert probes["enp1s0f0np0"].heard[0] == Heard("fe80::2", "02:00:00:01:01:00")
    assert set(probes) == {"enp1s0f0np0", "enP2p1s0f0np0", "enp1s0f1np1"}


# ---------------------------------------------------------------------------------------------
# Discovery: the ports from sysfs
# ---------------------------------------------------------------------------------------------

SYSFS = """\
rdma rocep1s0f0 pci 0000:01:00.0 netdev enp1s0f0np0
rdma rocep1s0f1 pci 0000:01:00.1 netdev enp1s0f1np1
rdma roceP2p1s0f0 pci 0002:01:00.0 netdev enP2p1s0f0np0
rdma roceP2p1s0f1 pci 0002:01:00.1 netdev enP2p1s0f1np1
rdma rxe0 pci 0000:07:00.0 netdev enP7s7
""".splitlines()


def test_discovery_pairs_each_function_with_its_twin_on_another_pci_domain():
    from sparkrig.cabling import discover_ports, ports_problems

    found = discover_ports(SYSFS)
    assert found == {0: dgx_os_default(0), 1: dgx_os_default(1)}  # no twin: enP7s7 left out
    assert ports_problems({p: dgx_os_default(p) for p in (0, 1)}, found) == []
    # a host whose port 1 twin is gone (one function of the cage lost)
    assert discover_ports(SYSFS[:3]) == {0: dgx_os_default(0)}
    assert ports_problems({1: dgx_os_default(1)}, discover_ports(SYSFS[:3])) == [
        "port 1: no PCI function 1 with a PCIe twin and netdevs on the host"
    ]
    renamed = dgx_os_port("enp1s0f1np1")
    assert renamed is not None
    wrong = {1: type(renamed)(1, renamed.primary, type(renamed.twin)("eth9", "mlx5_9"))}
    assert ports_problems(wrong, found) == [
        "port 1 twin: the inventory says eth9 (mlx5_9), the host has enP2p1s0f1np1 "
        "(roceP2p1s0f1): fix fabric_ports"
    ]


def test_the_fabric_ports_fact_reads_sysfs_lines():
    from sparkrig.fabricfacts import FabricPorts
    from sparkrig.factlines import END

    fact = FabricPorts()
    assert "/sys/class/infiniband/*" in fact.command() and fact.command().endswith(f"'{END}'")
    assert set(fact.process([*SYSFS, END])) == {0, 1}


# ---------------------------------------------------------------------------------------------
# A pair's other port; links that fail the don't-fragment ping
# ---------------------------------------------------------------------------------------------


def test_a_pairs_probe_also_watches_its_other_port():
    from sparkrig.topology import with_siblings

    assert with_siblings({1: dgx_os_default(1)}) == {0: dgx_os_default(0), 1: dgx_os_default(1)}
    other = dgx_os_port("enp1s0f1np1")
    assert other is not None
    odd = {1: type(other)(1, type(other.primary)("eth4", "mlx5_0"), other.twin)}
    assert with_siblings(odd) == odd  # no DGX OS primary: nothing to derive


def test_the_df_ping_goes_out_of_each_function_to_the_function_it_faces():
    from sparkrig.topology import df_ping_command

    plan = derive(ring_ports(3), "198.18.0.0/21")
    twin = plan.ranks[0].ifaces[1]
    assert df_ping_command(twin, 9000) == (
        "ping -M do -s 8972 -c 2 -i 0.2 -W 2 -I enP2p1s0f0np0 198.18.1.2"
    )


def test_a_silent_link_is_refused_or_left_out_on_both_ends():
    from sparkrig.topology import judge_links

    plan = derive(ring_ports(4), "198.18.0.0/21")
    failed = {2: ["enP2p1s0f1np1"]}  # spark-c's twin toward spark-b: cable 1 twin, one way
    same, problems = judge_links(plan, failed, "refuse", NAMES)
    assert same == plan
    assert problems == [
        "cable 1 twin (spark-b enP2p1s0f0np0 to spark-c enP2p1s0f1np1) does not answer a "
        "full-MTU don't-fragment ping both ways (fabric_link_silent = 'omit' leaves it out)"
    ]
    less, notes = judge_links(plan, failed, "omit", NAMES)
    assert notes[0].endswith("both ways: left out")
    b, c = less.ranks[1], less.ranks[2]
    assert "roceP2p1s0f0" not in b.rdma_devices and "roceP2p1s0f1" not in c.rdma_devices
    assert len(b.ifaces) == 3 and len(c.ifaces) == 3 and len(less.ranks[0].ifaces) == 4
    # no route to the gone subnet (198.18.3.0/24) and none out of a gone netdev
    for part in less.ranks:
        assert all(str(r.to) != "198.18.3.0/24" for r in part.routes)
        assert all(r.dev in part.netdevs for r in part.routes)
    # spark-a's twin route to cable 2's twin goes via spark-d: kept
    assert any(str(r.to) == "198.18.5.0/24" and r.hop == 3 for r in less.ranks[0].routes)
    # the primary class is whole: every pair still reaches the other by the shorter side
    for src, dst in itertools.permutations(range(4), 2):
        assert len(hops(less, src, dst)) - 1 == min((dst - src) % 4, (src - dst) % 4)


def test_a_route_whose_later_hop_lost_its_link_is_dropped_too():
    from sparkrig.topology import judge_links

    plan = derive(ring_ports(8), "198.18.0.0/20")
    # cable 1's twin gone: rank 0's twin route to cable 3 (via 1, then 2 over cable 1) has no way
    less, _ = judge_links(plan, {1: ["enP2p1s0f0np0"]}, "omit")
    r0 = {str(r.to) for r in less.ranks[0].routes}
    assert "198.18.7.0/24" not in r0 and "198.18.6.0/24" in r0  # twin lost, primary kept


def test_a_cable_with_neither_function_answering_is_refused_either_way():
    from sparkrig.topology import judge_links

    plan = derive(ring_ports(3), "198.18.0.0/21")
    with pytest.raises(PlanError, match=r"cable 2 \(spark-c port 0 to spark-a port 1\): neither"):
        judge_links(plan, {0: ["enp1s0f1np1", "enP2p1s0f1np1"]}, "omit", NAMES)
    # refused too, named as the cable (leaving out its two functions would not serve either)
    _, problems = judge_links(plan, {0: ["enp1s0f1np1", "enP2p1s0f1np1"]}, "refuse", NAMES)
    assert problems == [
        "cable 2 (spark-c port 0 to spark-a port 1): neither function answers a don't-fragment "
        "ping both ways; check the cable and both ports' MTU"
    ]
