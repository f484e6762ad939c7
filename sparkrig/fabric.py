"""The fabric: the QSFP netdevs' addresses and MTU, their RoCE v2 GIDs, and the proof that every
pair of ranks reaches each other at full MTU, for every fabric_layout (tasks/fabric.py).

The plan's verdicts on what the hosts say (``ports_verdict``, ``cabling_verdict``,
``judged_plan``), the files the phase owns (netplan, forwarding, the relay unit, the rank env
and a ring's graph files) and its operations: move other configurations of the fabric NIC aside
(``fabric_claims_displaced``), remove stray fabric addresses, bring a link or a RoCE device back,
prove the MTU end to end (``fabric_path_proven``, ``fabric_functions_proven``), write the rank's
env file (``rank_env_written``: a GID index that moved alone is recorded without restarting the
pair). The facts: sparkrig/fabricfacts.py."""

from __future__ import annotations

import hashlib
import ipaddress
import shlex
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pyinfra import host, logger
from pyinfra.api import operation
from pyinfra.facts.server import Command
from sparkhost import rankenv
from sparkhost.gid import GidEntry, GidNotFound, select_gid

from sparkrig.cabling import (
    Probe,
    check_cabling,
    ports_problems,
    unchecked_cables,
)
from sparkrig.config.model import Settings
from sparkrig.engines import engine_of
from sparkrig.fabricenv import GRAPH_FILE, RING_GRAPHS, fabric_env
from sparkrig.fabricfacts import (
    LinkState,
    RoceGids,
    df_ping,
)
from sparkrig.failing import fail_host
from sparkrig.hardening import unit_hardening
from sparkrig.owned import file_present, owned_of
from sparkrig.render import base_context, render
from sparkrig.stateread import read_here
from sparkrig.topology import Plan, Port, judge_links, with_siblings

# where fabric_takeover moves other claims on the fabric NIC (their original path kept below it)
DISPLACED_DIR = "/var/lib/sparkrig/displaced"
# fabric_layout "ports": a relaying rank's forwarding and rp_filter per fabric netdev (sysctl.d)
FORWARDING_FILE = "/etc/sysctl.d/91-sparkrig-fabric.conf"
RELAY_UNIT = "sparkrig-relay"  # docker's DOCKER-USER accepts the relay (a ring of four)
RELAY_UNIT_FILE = f"/etc/systemd/system/{RELAY_UNIT}.service"
IPTABLES = "/usr/sbin/iptables"  # docker's own (iptables-nft on DGX OS)


def ports_verdict(s: Settings, found: Mapping[int, Port]) -> tuple[list[str], list[str]]:
    """The rank's ports as the plan has them (the inventory's names, else DGX OS's) against
    those its sysfs shows (``FabricPorts``): (problems that refuse the run, notes). A host that
    shows no PCI function with a PCIe twin at all (Soft-RoCE, a driver not loaded) is not
    checked, and said so: its netdevs' absence is refused elsewhere."""
    if not found:
        return [], [
            "port discovery: no RDMA device on a PCI function with a PCIe twin (sysfs): the "
            "inventory's fabric netdev and RDMA device names are not checked against the host"
        ]
    problems = ports_problems(s.me.ports, found)
    return [f"{p} (what sysfs shows: docs/rings.md)" for p in problems], []


def lan_problems(s: Settings, held: Sequence[tuple[str, str]]) -> list[str]:
    """A triangle's or a ring's rank whose lan_address is none of its own (``held``: the
    LanAddresses fact): the ranks' rendezvous at the head's LAN address would never meet."""
    if s.me.lan_address is None:
        return []
    if any(address.partition("/")[0] == str(s.me.lan_address) for _, address in held):
        return []
    have = ", ".join(f"{address} on {dev}" for dev, address in held) or "none"
    return [
        f"lan_address {s.me.lan_address} is not an address of this host (its IPv4 addresses: "
        f"{have}); a ring's ranks meet at the head's LAN address: set lan_address to the "
        "rank's own, on the uplink the others reach it by"
    ]


def cabling_verdict(
    s: Settings, probes: Sequence[Mapping[str, Probe] | None]
) -> tuple[list[str], list[str]]:
    """(problems, notes) of the cables as every rank's probe (``probes[rank]``; None: the rank
    is out of this run, and never reached) hears them against ``s``'s plan: each problem names
    the cable to move (``cabling.check_cabling``); a cable an end could not ask on, or whose
    other end was not read, is a note (``cabling.unchecked_cables``)."""
    plan = s.fabric_plan
    assert plan is not None
    ports = [with_siblings(r.ports) for r in s.ranks]
    names = [r.name for r in s.ranks]
    heard = [p if p is not None else {} for p in probes]
    unread = [rank for rank, p in enumerate(probes) if p is None]
    return (
        check_cabling(plan, ports, heard, names),
        unchecked_cables(plan, ports, heard, names, unread),
    )


def judged_plan(
    s: Settings, links: Sequence[Mapping[str, LinkState]]
) -> tuple[Plan, list[str], set[tuple[int, int]]]:
    """The plan after knob ``fabric_link_silent`` judged every link whose two ends are up, at
    the plan's MTU and already hold their planned address (``links[rank]``: that rank's
    FabricLinks), the lines naming each silent link (refusals for "refuse", notes for "omit"),
    and the links judged (cable, function). A link not yet addressed at both ends is proven by
    the pings after the netplan is applied (``fabric_functions_proven``). A cable with neither
    function left: PlanError."""
    plan = s.fabric_plan
    assert plan is not None
    addressed: set[tuple[int, int]] = set()
    for link in plan.links:
        ends = []
        for end in (link.cable.a, link.cable.b):
            iface = next(
                i for i in plan.ranks[end.rank].ifaces
                if i.cable == link.cable.index and i.function == link.function
            )  # fmt: skip
            have = links[end.rank].get(iface.netdev) if end.rank < len(links) else None
            # an administratively down end is the fabric phase's to bring up (fabric_link_raised),
            # and an end off the plan's MTU (a firmware update resets it) the netplan's to set
            # again: neither is the cable's, so its link is proven by the pings after the
            # netplan, like a new one
            ends.append(
                have is not None
                and have.admin_up
                and have.mtu == s.knobs.fabric_mtu
                and str(iface.address) in have.ipv4
            )
        if all(ends):
            addressed.add((link.cable.index, link.function))
    failed: dict[int, list[str]] = {}
    for part in plan.ranks:
        for i in part.ifaces:
            have = links[part.rank].get(i.netdev) if part.rank < len(links) else None
            if (i.cable, i.function) in addressed and not (have and have.df_ok):
                failed.setdefault(part.rank, []).append(i.netdev)
    names = [r.name for r in s.ranks]
    kept, lines = judge_links(plan, failed, s.knobs.fabric_link_silent, names)
    return kept, lines, addressed


def claims_displaced_args(s: Settings, node: Any) -> dict[str, Any]:
    """``fabric_claims_displaced``'s arguments: the other netplan files and NM profiles the node
    report (``node.NodeReport``) found on the fabric NIC, only while fabric_takeover is set
    (preflight refused them otherwise)."""
    take = s.knobs.fabric_takeover
    return {
        "netplan_files": list(node.netplan_claims) if take else [],
        "nm_profiles": [p.path for p in node.nm_claims] if take else [],
        "dest_dir": DISPLACED_DIR,
    }


def env_context(s: Settings, plan: Plan | None = None) -> dict[str, Any]:
    """The rank env file's template context (rank.env.j2): fabric MTU, RoCE port, subnet and
    the NCCL environment; ``rank_env_written`` adds the HCA and GID index read on the host.
    ``plan``: fabric_layout "ports" after ``judged_plan`` (default: the whole plan)."""
    k = s.knobs
    context = {
        **base_context(s),
        "mtu": k.fabric_mtu,
        "port": k.roce_port,
        "subnet": str(s.fabric_network),
        "stack": s.stack.name,
        "stack_env": list(s.stack.env.items()),
        "extra": sorted(k.nccl_env.items()),
    }
    plan = plan or s.fabric_plan
    if plan is not None:  # fabric_layout "ports": rank-ports.env.j2 (docs/rings.md)
        uplinks = s.me.uplink_interfaces
        context["fabric_env"] = fabric_env(plan, s.me.rank, k.roce_port, uplinks)
    return context


def graph_paths(s: Settings) -> dict[str, str]:
    """container path -> host path of a ring rank's NCCL graph files (fabric_layout "ports"; {}
    otherwise): whole files under the rank's config_dir, mounted read-only at the paths the env
    names (``topology.GRAPH_FILE``, ``topology.RING_GRAPHS``), e.g. /etc/sparkrig/nccl-graph.xml
    at /nccl-graph.xml. Listed whether or not the plan has them (removed where it has none)."""
    if s.fabric_plan is None:
        return {}
    base = s.knobs.config_dir.rstrip("/")
    return {c: f"{base}/{c.lstrip('/')}" for c in (GRAPH_FILE, *RING_GRAPHS)}


def graph_texts(s: Settings, plan: Plan | None = None) -> dict[str, str]:
    """host path -> content of this rank's NCCL graph files, from ``plan`` (fabric_layout "ports"
    after ``judged_plan``; default the whole plan): a ring of four and more only, whose env names
    them (``topology.fabric_env``); {} for a pair or a triangle. Built by the stack's engine
    (``graph_files``: the engine's NCCL reads them)."""
    plan = plan or s.fabric_plan
    if plan is None or not plan.relays:
        return {}
    files = engine_of(s.stack).graph_files(plan, s.me.rank)
    return {host: files[container] for container, host in graph_paths(s).items()}


def graph_volumes(s: Settings) -> list[str]:
    """``docker run`` options mounting the ring's graph files read-only where the env names
    them; [] where the plan relays nothing (no graph file in the env)."""
    plan = s.fabric_plan
    if plan is None or not plan.relays:
        return []
    return [w for c, h in graph_paths(s).items() for w in ("--volume", f"{h}:{c}:ro")]


@dataclass(frozen=True)
class Netdev:
    """One fabric netdev of this rank, whatever the layout: its RDMA device (None: the one sysfs
    has on it) and its planned address ("10.0.0.1/24")."""

    netdev: str
    rdma: str | None
    address: str


def rank_netdevs(s: Settings) -> list[Netdev]:
    """This rank's fabric netdevs: every one of its plan (fabric_layout "ports"), or the one
    netdev of "single" (the plan's one-netdev case on a switch, with no cable to check)."""
    part = s.fabric_rank
    if part is None:
        me = s.me
        return [Netdev(me.fabric_interface, me.roce_device, me.fabric_address.with_prefixlen)]
    return [Netdev(i.netdev, i.rdma, i.address.with_prefixlen) for i in part.ifaces]


def owned_subnet(s: Settings) -> str:
    """The range sparkrig owns on every fabric netdev (an address of it the plan does not give
    goes): the plan's, or the single layout's fabric subnet."""
    plan = s.fabric_plan
    return str(s.fabric_network if plan is None else plan.cidr)


def single_link(netdev: str, node: Any) -> LinkState:
    """The one netdev of fabric_layout "single" as the node report has it, in the shape the
    plan's FabricLinks gives each netdev (its pings are proven by ``fabric_path_proven``)."""
    return LinkState(
        netdev=netdev,
        present=node.link_present,
        admin_up=node.admin_up,
        mtu=node.mtu,
        ipv4=tuple(node.ipv4),
    )


def env_template(s: Settings) -> str:
    """The rank env file's template: one netdev (rank.env.j2) or the plan's (rank-ports.env.j2)."""
    return "rank.env.j2" if s.fabric_plan is None else "rank-ports.env.j2"


def netplan_text(s: Settings) -> str:
    """The fabric's netplan file: the single netdev's, or every netdev of the rank's plan with
    its address, MTU and routes (fabric_layout "ports")."""
    part, plan = s.fabric_rank, s.fabric_plan
    if part is None or plan is None:
        address = s.me.fabric_address.with_prefixlen
        return render(
            "netplan-fabric.yaml.j2", **base_context(s), address=address, mtu=s.knobs.fabric_mtu
        )
    return render(
        "netplan-fabric-ports.yaml.j2",
        **base_context(s),
        cidr=str(plan.cidr),
        ifaces=part.ifaces,
        routes=part.routes,
        mtu=s.knobs.fabric_mtu,
    )


def forwarding_text(s: Settings) -> str | None:
    """The sysctl.d file of a rank that relays (a ring of four and more): forwarding on and
    rp_filter off on each fabric netdev; None where the plan relays nothing."""
    part = s.fabric_rank
    if part is None or not part.forwarding:
        return None
    return render("sysctl-fabric.conf.j2", **base_context(s), forwarding=part.forwarding)


def relay_rules(s: Settings) -> list[str]:
    """The DOCKER-USER rules of a rank that relays (docker's FORWARD policy drops the relay
    otherwise): accept from each relaying netdev to the same function on the other port, the
    only way a route of the plan goes through a rank; none where the plan relays nothing."""
    part = s.fabric_rank
    if part is None:
        return []
    ifaces = [i for i in part.ifaces if i.netdev in part.forwarding]
    return [
        f"-i {a.netdev} -o {b.netdev} -m comment --comment sparkrig-relay -j ACCEPT"
        for a in ifaces
        for b in ifaces
        if a.function == b.function and a.port != b.port
    ]


def relay_unit_text(s: Settings) -> str | None:
    """The unit that puts ``relay_rules`` in DOCKER-USER after every docker start
    (templates/sparkrig-relay.service.j2); None where the plan relays nothing."""
    rules = relay_rules(s)
    if not rules:
        return None
    return render(
        "sparkrig-relay.service.j2",
        **base_context(s),
        rules=rules,
        iptables=IPTABLES,
        hardening=unit_hardening(s, "relay"),
    )


# ---------------------------------------------------------------------------------------------
# Operations
# ---------------------------------------------------------------------------------------------


@operation()
def fabric_claims_displaced(
    netplan_files: list[str], nm_profiles: list[str], dest_dir: str
) -> Generator[Any, None, None]:
    """
    Move other configurations of the fabric NIC aside (kept under ``dest_dir`` at their original
    path, to be moved back by hand), so the fabric has one owner.

    + netplan_files: other netplan files naming the fabric NIC
    + nm_profiles: NetworkManager keyfile profiles bound to it (NM forgets them on reload)
    + dest_dir: where they go; nothing under it is read by netplan or NetworkManager
    """
    paths = [*netplan_files, *nm_profiles]
    if not paths:
        host.noop("no other netplan file or NetworkManager profile configures the fabric NIC")
        return
    moves = []
    for path in paths:
        logger.info(f"{host.print_prefix}Will move {path} to {dest_dir}{path}")
        target = shlex.quote(f"{dest_dir}{path}")
        moves.append(f"install -d -m 700 $(dirname {target}) && mv -f {shlex.quote(path)} {target}")
    if nm_profiles:
        moves.append("nmcli connection reload")
    yield " && ".join(moves)


def stray_addresses(held: Sequence[str], planned: str, subnets: Sequence[str]) -> list[str]:
    """The IPv4 addresses of ``held`` (``ip -o -4 addr`` order, "a.b.c.d/len") in one of the
    fabric's ``subnets`` that are not ``planned``: the kernel sources a rank's fabric traffic from
    the subnet's primary address, the first added, and the peers' firewall accepts the plan's
    alone. Addresses outside the fabric's subnets (link-local, another network) are left alone."""
    nets = [ipaddress.IPv4Network(n, strict=False) for n in subnets]
    stray = []
    for text in held:
        try:
            have = ipaddress.IPv4Interface(text)
        except ValueError:
            continue
        if text != planned and any(have.ip in n for n in nets):
            stray.append(text)
    return stray


def strays_removed_command(interface: str, stray: Sequence[str]) -> str:
    """Each stray address deleted where the netdev still holds it (deleting a primary address
    deletes its secondaries too, unless promote_secondaries is set)."""
    dev = shlex.quote(interface)
    return "; ".join(
        f"if ip -o -4 addr show dev {dev} | awk '{{print $4}}' | grep -qxF {shlex.quote(a)}; "
        f"then ip -4 addr del {shlex.quote(a)} dev {dev} || exit 1; fi"
        for a in stray
    )


@operation()
def fabric_addresses_owned(
    interface: str, held: list[str], planned: str, subnets: list[str]
) -> Generator[Any, None, None]:
    """
    Remove every address of the fabric's subnets that the plan does not give this netdev (one
    added by hand, a DHCP lease, an earlier plan's): with one ordered before the plan's, the
    rank's traffic leaves from it and the peers' firewall drops it as not a peer. The plan's
    own address is (re)applied with the fabric's netplan after.

    + interface: the fabric netdev
    + held: its IPv4 addresses now, in the kernel's order
    + planned: the plan's address for it ("a.b.c.d/len")
    + subnets: the fabric's subnets (an address elsewhere is left alone)
    """
    stray = stray_addresses(held, planned, subnets)
    if not stray:
        host.noop(f"{interface} holds no fabric address but {planned}")
        return
    logger.warning(
        f"{host.print_prefix}{interface}: removing {', '.join(stray)}: in the fabric's subnet "
        f"but not the plan's {planned} (the rank's traffic would leave from it, and the peers' "
        "firewall drops it as not a peer)"
    )
    yield strays_removed_command(interface, stray)


def ping_command(interface: str, peers: list[str], mtu: int) -> str:
    """Every peer pinged at once (each ping in the background, then each waited for): the
    check takes one peer's time whatever the number of nodes; it fails if any peer fails.
    ``-i 0.2`` is the shortest interval iputils' ping allows without root."""
    started = "; ".join(
        f"ping -M do -s {mtu - 28} -c 2 -i 0.2 -W 2 -I {interface} {peer} >/dev/null & p{i}=$!"
        for i, peer in enumerate(peers)
    )
    return f"{started}; " + " && ".join(f"wait $p{i}" for i in range(len(peers)))


def roce_device_wait_command(interface: str, timeout_s: int = 60) -> str:
    """Wait until some RDMA device's GID table lists ``interface`` (a driver makes its device
    asynchronously), failing after ``timeout_s``."""
    ndevs = "/sys/class/infiniband/*/ports/*/gid_attrs/ndevs/*"
    wait = f"until grep -qsxF {shlex.quote(interface)} {ndevs}; do sleep 1; done"
    return f"timeout {timeout_s} sh -c {shlex.quote(wait)}"


def carrier_wait_command(interface: str, wait_s: int) -> str:
    """Wait up to ``wait_s`` for carrier on ``interface``; fail naming the cable."""
    carrier = shlex.quote(f"/sys/class/net/{interface}/carrier")
    why = (
        f"{interface} is up but has no carrier after {wait_s} s: check the QSFP cable at both "
        "ends and that the peer Spark is powered on"
    )
    return (
        f'i=0; until [ "$(cat {carrier} 2>/dev/null)" = 1 ]; do i=$((i + 1)); '
        f"if [ $i -gt {wait_s} ]; then echo {shlex.quote(why)} >&2; exit 1; fi; sleep 1; done"
    )


@operation()
def fabric_link_raised(
    interface: str, admin_up: bool, wait_s: int = 60
) -> Generator[Any, None, None]:
    """
    Bring an administratively down fabric netdev up (``ip link set down``, ``nmcli device
    disconnect`` or a driver reset left it so; sparkrig owns the link's configuration), then wait
    for its carrier: an up netdev without carrier is the cable's, refused by name.

    + interface: the fabric netdev
    + admin_up: whether it has IFF_UP now (the node report's ``flags``)
    + wait_s: how long the carrier may take after the link comes up (link training)
    """
    if admin_up:
        host.noop(f"{interface} is up")
        return
    logger.info(f"{host.print_prefix}{interface} is administratively down: bringing it up")
    yield f"ip link set dev {shlex.quote(interface)} up"
    yield carrier_wait_command(interface, wait_s)


@operation()
def roce_device_present(
    interface: str, commands: list[str], roce_device: str | None = None
) -> Generator[Any, None, None]:
    """
    Bring the fabric NIC's RoCE device back when the GID table has none on it (its driver
    unloaded, or the device deleted): run the platform's commands, then wait for the device.

    + interface: the fabric netdev
    + commands: shell commands that make the device (knob ``roce_device_restore``)
    + roce_device: the RDMA device expected on it (None: any)
    """
    entries: list[GidEntry] = read_here("gids").get("gids", RoceGids)
    on_nic = [
        e for e in entries
        if e.netdev in (interface, "") and (roce_device is None or e.device == roce_device)
    ]  # fmt: skip
    if on_nic:
        host.noop(f"{on_nic[0].device} is the RoCE device on {interface}")
        return
    logger.info(f"{host.print_prefix}no RoCE device on {interface}: {'; '.join(commands)}")
    yield from commands
    yield roce_device_wait_command(interface)


@operation()
def fabric_path_proven(interface: str, peers: list[str], mtu: int) -> Generator[Any, None, None]:
    """
    Prove every peer answers full-size do-not-fragment pings over the fabric (MTU end to end).

    + interface: the fabric netdev to ping from
    + peers: fabric IPv4 addresses to reach
    + mtu: the fabric MTU; the payload is MTU - 28
    """
    command = ping_command(interface, peers, mtu)
    output = host.get_fact(Command, command=f"{command} 2>&1; echo rc=$?")
    if output and output.rstrip().endswith("rc=0"):
        host.noop(f"{', '.join(peers)} answer {mtu - 28}-byte do-not-fragment pings")
        return
    yield command


GID_INDEX_LINE = f"{rankenv.GID_INDEX}="
GID_TABLE_LEN = 256  # the most GID entries a port's sysfs table has (ConnectX: 255 or 256)


def moved_gid_index(text: str, index: str, have_sha256: str | None) -> int | None:
    """The GID index the file on the host names when it is ``text`` but for its
    ``NCCL_IB_GID_INDEX`` line (a reboot or a firmware update renumbered the table), else None.
    Decided from the state read's sha256 alone: no extra remote command."""
    line = f"\n{GID_INDEX_LINE}{index}\n"
    if have_sha256 is None or line not in text:
        return None
    for other in range(GID_TABLE_LEN):
        candidate = text.replace(line, f"\n{GID_INDEX_LINE}{other}\n")
        if str(other) != index and hashlib.sha256(candidate.encode()).hexdigest() == have_sha256:
            return other
    return None


@operation()
def rank_env_written(
    dest: str,
    template: str,
    context: Mapping[str, Any],
    fabric_ip: str,
    fabric_interface: str,
    roce_device: str | None = None,
    roce_port: int = 1,
    moved_gid_only: bool = False,
) -> Generator[Any, None, None]:
    """
    Write the rank's env file with the RoCE v2 GID index read from sysfs at this moment.

    On a first run the fabric address is only applied earlier in the same run, so at prepare the
    GID may not exist yet: the diff then shows a placeholder, and the real index is read again
    when the operation executes. No matching GID at execution fails this host with the table.

    A file that differs only in its GID index is written by the ``moved_gid_only`` call alone,
    which is no pair-restart trigger: every rank start resolves the live index again
    (``sparkhost prep``) and the container gets that one, so a running rank already has it.

    + dest: env file path (its directory must exist)
    + template: template under templates/ rendered with ``context`` plus hca and gid_index
    + context: template variables
    + fabric_ip: the rank's fabric IPv4 address
    + fabric_interface: the fabric netdev the GID must belong to
    + roce_device: RDMA device to use; ``None`` detects it from the GID table
    + roce_port: HCA port
    + moved_gid_only: write only a file whose GID index alone moved (else the other way round)
    """
    entries: list[GidEntry] = read_here("gids").get("gids", RoceGids)
    try:
        entry = select_gid(entries, fabric_ip, fabric_interface, roce_device, roce_port)
        hca, index = entry.device, str(entry.index)
    except GidNotFound as err:
        if host.state.is_executing:
            yield fail_host(str(err))
            return
        logger.warning(
            f"{host.print_prefix}no RoCE v2 GID for ::ffff:{fabric_ip} yet; it is read again "
            "after the fabric address is applied"
        )
        hca = roce_device or "<detected after the fabric address is applied>"
        index = "<detected after the fabric address is applied>"
    text = render(template, **context, hca=hca, gid_index=index)
    have = owned_of(read_here("paths")).file(dest)
    moved = moved_gid_index(text, index, have.sha256 if have is not None else None)
    if moved is not None and not moved_gid_only:
        host.noop(f"{dest}: only the RoCE GID index moved ({moved} -> {index}), recorded next")
    elif moved is None and moved_gid_only:
        host.noop(f"{dest}: its RoCE GID index did not move alone")
    else:
        yield from file_present._inner(text=text, dest=dest, mode="644")


@operation()
def fabric_functions_proven(
    pings: list[tuple[str, str, str]], mtu: int, proven: bool, omit: bool
) -> Generator[Any, None, None]:
    """
    Prove each fabric function this rank uses with a full-MTU don't-fragment ping to the peer
    function it faces (fabric_layout "ports"; the peer pings back from its end): a function
    that fails is named, and fails this host.

    + pings: (netdev, peer address, the link's name) of every function kept in the plan
    + mtu: the fabric MTU; the payload is MTU - 28
    + proven: every one of them answered when the state was read (nothing to do)
    + omit: knob fabric_link_silent is "omit" (a re-run leaves a link that fails out)
    """
    if proven:
        host.noop(f"every fabric function answers {mtu - 28}-byte do-not-fragment pings")
        return
    then = (
        "a re-run leaves it out (fabric_link_silent = 'omit')"
        if omit
        else "fabric_link_silent = 'omit' leaves it out"
    )
    checks = []
    for netdev, peer, name in pings:
        why = shlex.quote(f"{name} does not answer a full-MTU don't-fragment ping ({then})")
        checks.append(
            f"{df_ping(netdev, peer, mtu)} >/dev/null 2>&1 || {{ echo {why} >&2; rc=1; }}"
        )
    yield "rc=0; " + "; ".join(checks) + "; exit $rc"
