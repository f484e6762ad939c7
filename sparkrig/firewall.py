"""The firewall the deploy owns (knob ``firewall``, docs/firewall.md): one nftables table of its
own, ``inet sparkrig``, rendered per rank into ``<config_dir>/firewall.nft`` and loaded by
``sparkrig-firewall.service`` at every boot, beside docker's chains and touching nothing else.

On every rank the fabric netdev (every one of the plan in fabric_layout "ports") accepts only the
other ranks' fabric addresses; the rank's fabric address reached through any other interface is
dropped (the weak host model would answer it), and
so are the pair's ports (the rendezvous, the beacon, agent, supervisor and copy servers) on every
other interface, since torch's TCPStore listens on the wildcard (on a triangle or a ring, the
head's rendezvous ports are accepted from the other ranks' LAN addresses: they meet there). On
the head, ``api_port`` is accepted only from ``api_allow`` and loopback, and the engine behind
the API front only from loopback. Every drop rule counts (``status.py`` shows the counters).

The pair fails closed: the rank and the helpers that listen on the LAN or the fabric require the
unit and start after it (a drop-in beside each: ``requires_dropins``), so a table that failed to
load at boot starts none of them; the unit's stop deletes nothing (docs/firewall.md, "Fail
closed").

This module renders the ruleset, the unit and the drop-ins, reads the table's state (a part of
the state read) and its counters (status); the operations are in tasks/firewall.py."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Any

from pyinfra.api import FactBase, QuoteString, StringCommand

from sparkrig.config.model import Settings
from sparkrig.factlines import parse_key_values, script_command
from sparkrig.hardening import unit_hardening
from sparkrig.owned import apt_installed_command, dropin_path
from sparkrig.render import base_context, render
from sparkrig.stateread import Part, Values

TABLE = "inet sparkrig"
UNIT = "sparkrig-firewall"
UNIT_FILE = f"/etc/systemd/system/{UNIT}.service"
NFT = "/usr/sbin/nft"
# The nft binary only: nftables.service stays disabled (its stop and its default
# /etc/nftables.conf flush the whole ruleset, docker's rules included: docs/firewall.md).
INSTALL = apt_installed_command("nftables")
# Linux's default net.ipv4.ip_local_port_range (Ubuntu's and DGX OS's): where a socket bound to
# port 0 listens, as NCCL's and gloo's bootstrap do
EPHEMERAL_PORTS = "32768-60999"


def ruleset_path(s: Settings) -> str:
    """Where the rendered ruleset lives on a rank (owned whole)."""
    return f"{s.knobs.config_dir}/firewall.nft"


def fabric_ports(s: Settings) -> dict[int, str]:
    """port -> what listens there, for every port of the pair's (any rank's: one ruleset shape):
    the rendezvous and the smoke test's, the beacon, the agent (the head's supervisor), the
    weights and image copy servers. NCCL's, gloo's and vLLM's ZMQ listeners take ephemeral ports
    on the fabric address: the fabric-address rule covers them."""
    k = s.knobs
    return {
        k.master_port: "master_port (torch rendezvous)",
        k.master_port + 1: "master_port + 1 (the NCCL smoke test's rendezvous)",
        k.pair_port: "pair_port (beacon)",
        k.agent_port: "agent_port (worker agent, head supervisor)",
        k.copy_port: "copy_port (weights copy server)",
        k.image_copy_port: "image_copy_port (image copy server)",
        **(
            {s.stack.master_port: "the stack's own rendezvous (e.g. TensorFold's 29551)"}
            if s.stack.master_port
            else {}
        ),
    }


def engine_port(s: Settings) -> int | None:
    """The engine's port behind the API front (knob ``engine_port``): loopback only."""
    return s.knobs.engine_port


def api_networks(s: Settings) -> tuple[list[str], list[str]]:
    """``api_allow`` split into its IPv4 and IPv6 networks (settings made each canonical)."""
    nets = [ipaddress.ip_network(n) for n in s.knobs.api_allow]
    return (
        [str(n) for n in nets if n.version == 4],
        [str(n) for n in nets if n.version == 6],
    )


def fabric_sides(s: Settings) -> tuple[list[str], list[str], list[str]]:
    """The rank's fabric netdevs, its own fabric addresses and its peers' addresses facing them:
    one netdev and one address per rank (fabric_layout "single"), or every function of the
    plan (fabric_layout "ports": a pair's peer answers on both functions of the cable)."""
    part, plan = s.fabric_rank, s.fabric_plan
    if part is None or plan is None:
        return [s.me.fabric_interface], [s.me.ip], [r.ip for r in s.others]
    # every address of every other rank: a ring of four relays the ranks without a cable between
    # them, so their packets arrive from their own addresses through a neighbour
    peers = sorted({ipaddress.IPv4Address(ip) for r in s.others for ip in s.fabric_ips(r)})
    return list(part.netdevs), list(s.fabric_ips(s.me)), [str(p) for p in peers]


def nft_set(values: list[str], quoted: bool = False) -> str:
    """One value as itself, several as an anonymous nft set (``{ a, b }``)."""
    shown = [f'"{v}"' if quoted else v for v in values]
    return shown[0] if len(shown) == 1 else "{ " + ", ".join(shown) + " }"


def rendezvous_on_lan(s: Settings) -> tuple[list[int], list[str]]:
    """On the head of a triangle or a ring, the rendezvous ports (the engine's, the NCCL smoke
    test's) and the other ranks' LAN addresses they are accepted from: the ranks meet at the
    head's LAN address there (``Settings.rendezvous_ip``); elsewhere none."""
    if not (s.relayed and s.me.is_head):
        return [], []
    k = s.knobs
    ports = {
        k.master_port,
        k.master_port + 1,
        *([s.stack.master_port] if s.stack.master_port else []),
    }
    return sorted(ports), [str(r.lan_address) for r in s.others if r.lan_address is not None]


def lan_ranks(s: Settings) -> list[str]:
    """In a triangle or a ring, every other rank's LAN address: NCCL's and gloo's bootstrap
    sockets are on the LAN there (NCCL_SOCKET_IFNAME excludes the fabric: sparkrig/topology.py),
    each rank's reached by every other; elsewhere none (the bootstrap is on the fabric)."""
    if not s.relayed:
        return []
    return [str(r.lan_address) for r in s.others if r.lan_address is not None]


def ruleset_context(s: Settings) -> dict[str, Any]:
    v4, v6 = api_networks(s)
    netdevs, own, peers = fabric_sides(s)
    lan_ports, lan_peers = rendezvous_on_lan(s)
    return {
        **base_context(s),
        "peers": peers,
        "lan_ports": lan_ports,
        "lan_peers": lan_peers,
        "lan_ranks": lan_ranks(s),
        "fabric_iif": nft_set(netdevs, quoted=True),
        "fabric_own": nft_set(own),
        "fabric_ports": sorted(fabric_ports(s)),
        "ephemeral": EPHEMERAL_PORTS,
        "api_port": s.knobs.api_port if s.me.is_head else None,
        "engine_port": engine_port(s),
        "api_allow4": v4,
        "api_allow6": v6,
    }


def ruleset(s: Settings) -> str:
    """The rank's ruleset, the file ``nft -f`` loads (templates/sparkrig-firewall.nft.j2)."""
    return render("sparkrig-firewall.nft.j2", **ruleset_context(s))


def unit(s: Settings) -> str:
    """The oneshot unit that loads the ruleset (templates/sparkrig-firewall.service.j2)."""
    return render(
        "sparkrig-firewall.service.j2",
        nft=NFT,
        rules=ruleset_path(s),
        hardening=unit_hardening(s, "firewall"),
    )


def requiring_units(s: Settings) -> list[str]:
    """The units of this rank that listen on the LAN or the fabric, each required to start after
    the firewall: the rank (torch's TCPStore listens on the wildcard), the stop-together watch
    (the beacon), and the head's supervisor or a worker's agent. The watchdog listens on
    nothing; the copy servers run only inside a deploy, after the firewall phase."""
    helper = "sparkrig-supervisor" if s.me.is_head else "sparkrig-agent"
    return [f"{s.unit_name}.service", "sparkrig-pair.service", f"{helper}.service"]


def requires_dropins(s: Settings) -> list[str]:
    """The drop-in beside each of ``requiring_units`` (owned whole; removed while firewall is
    off). A drop-in, not a line of the units' templates: the knob going on or off then changes
    no rank unit, so it restarts no rank and makes no release change."""
    return [dropin_path(u, UNIT) for u in requiring_units(s)]


def requires_text() -> str:
    """Each drop-in: ``Requires=`` and ``After=`` the firewall unit
    (templates/sparkrig-firewall-requires.conf.j2)."""
    return render("sparkrig-firewall-requires.conf.j2", firewall_unit=f"{UNIT}.service")


# ---------------------------------------------------------------------------------------------
# The table's state (a part of the state read) and its counters (status)
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FirewallReport:
    nft: bool = False  # the nft binary is installed
    loaded: bool = False  # the table inet sparkrig is in the live ruleset


class FirewallState(FactBase[FirewallReport]):
    """
    Whether ``nft`` is installed and the table ``inet sparkrig`` is loaded now.
    """

    default = FirewallReport

    def command(self) -> StringCommand:
        return script_command("firewall", *TABLE.split())

    def process(self, output: list[str]) -> FirewallReport:
        raw = parse_key_values(output, "firewall")
        return FirewallReport(nft=raw.get("nft") == "yes", loaded=raw.get("table") == "loaded")


def firewall_part() -> Part:
    """The state read's part of the firewall table."""
    return Part("firewall", FirewallState)


def firewall_of(values: Values) -> FirewallReport:
    return values.get("firewall", FirewallState)


_COUNTER = re.compile(r'counter packets (\d+) bytes (\d+) .*comment "([^"]*)"')


@dataclass(frozen=True)
class DropCounter:
    rule: str  # the rule's comment
    packets: int
    bytes: int


def parse_counters(lines: list[str]) -> list[DropCounter] | None:
    """The drop rules' counters in ``nft list table inet sparkrig``; None: no table loaded."""
    if "table=absent" in lines:
        return None
    return [
        DropCounter(m.group(3), int(m.group(1)), int(m.group(2)))
        for m in (_COUNTER.search(line) for line in lines)
        if m
    ]


class FirewallCounters(FactBase[list[DropCounter] | None]):
    """
    The drop rules' counters of the table ``inet sparkrig`` (None when it is not loaded).
    """

    def command(self) -> StringCommand:
        return StringCommand(
            "sh", "-c", QuoteString(f"nft list table {TABLE} 2>/dev/null || echo table=absent")
        )

    def process(self, output: list[str]) -> list[DropCounter] | None:
        return parse_counters(output)


def counters_line(enabled: bool, counters: list[DropCounter] | None) -> str:
    """status.py's line: what each drop rule dropped since the table was loaded."""
    if counters is None:
        return "firewall: table inet sparkrig NOT loaded" if enabled else "firewall: off"
    dropped = ", ".join(f"{c.rule} {c.packets}" for c in counters)
    return f"firewall: loaded; dropped packets: {dropped or 'no counters'}"


def counter_problems(enabled: bool, counters: list[DropCounter] | None) -> list[str]:
    if enabled and counters is None:
        return [
            "firewall: the table inet sparkrig is not loaded (sudo systemctl start "
            "sparkrig-firewall, or re-run the deploy)"
        ]
    return []
