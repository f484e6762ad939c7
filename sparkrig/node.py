"""The host itself: what a node is and has (architecture, GPU and driver, docker, free disk,
MemFree, the live vm sysctls, the fabric NIC's link and who else configures it), read in one
command (``Node``, sparkrig/facts/node.sh), and the sysctl.d file sparkrig owns. Preflight
judges the report (sparkrig/preflight.py); the host phase (tasks/host.py) writes the file and
applies it."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from pyinfra.api import FactBase, StringCommand
from pyinfra.api.exceptions import FactProcessError
from sparkhost.pairmac import WINDOW_S

from sparkrig.config.model import Rank, Settings
from sparkrig.factlines import parse_key_values, script_command
from sparkrig.stateread import Part

SYSCTL_FILE = "/etc/sysctl.d/90-sparkrig.conf"  # owned whole: vm.swappiness, vm.min_free_kbytes


@dataclass(frozen=True)
class NmProfile:
    path: str
    name: str


@dataclass(frozen=True)
class NodeReport:
    arch: str = ""
    kernel: str = ""
    gpu: str = ""
    docker: str = ""
    disk_free: int = 0
    memfree_kb: int = 0
    memtotal_kb: int = 0  # 0: not read
    swappiness: int = -1
    min_free_kbytes: int = -1
    link_present: bool = False
    operstate: str = ""
    admin_up: bool = False  # IFF_UP in /sys/class/net/<iface>/flags: `ip link set up`, not carrier
    carrier: bool = False
    mtu: int = 0
    ipv4: tuple[str, ...] = ()
    networkmanager: str = ""  # systemctl is-active NetworkManager
    # other configurations of the fabric NIC: netplan files naming it (not ours), and NM keyfile
    # profiles bound to it by interface-name or MAC (netplan's own netplan-* profiles excluded)
    netplan_claims: tuple[str, ...] = ()
    nm_claims: tuple[NmProfile, ...] = ()
    # when the fabric NIC is missing: every netdev of the host as (name, operstate)
    netdevs: tuple[tuple[str, str], ...] = ()

    @property
    def driver(self) -> str:
        parts = [p.strip() for p in self.gpu.split(",")]
        return parts[2] if len(parts) >= 3 else ""


def parse_node_report(lines: list[str]) -> NodeReport:
    raw = parse_key_values(lines, "node report")
    ints = ("disk_free", "memfree_kb", "memtotal_kb", "swappiness", "min_free_kbytes", "mtu")
    values: dict[str, Any] = {}
    try:
        for key in ints:
            if raw.get(key):
                values[key] = int(raw[key])
    except ValueError as err:
        raise FactProcessError(f"node report: {err}") from None
    for key in ("arch", "kernel", "gpu", "docker", "operstate"):
        values[key] = raw.get(key, "")
    values["link_present"] = raw.get("link_present") == "1"
    values["carrier"] = raw.get("carrier") == "1"
    try:
        values["admin_up"] = bool(int(raw.get("flags") or "0", 16) & 0x1)  # IFF_UP
    except ValueError:
        raise FactProcessError(f"node report: flags={raw.get('flags')!r} is not hex") from None
    values["ipv4"] = tuple(a for a in raw.get("ipv4", "").split(",") if a)
    values["networkmanager"] = raw.get("networkmanager", "")
    claims = ("netplan_claim=", "nm_claim=")
    listed = [line.partition("=") for line in lines if line.startswith(claims)]
    values["netplan_claims"] = tuple(v for k, _, v in listed if k == "netplan_claim")
    values["nm_claims"] = tuple(
        NmProfile(*v.partition("|")[::2]) for k, _, v in listed if k == "nm_claim"
    )
    values["netdevs"] = tuple(
        tuple(d.partition(":")[::2]) for d in raw.get("netdevs", "").split(",") if d
    )
    return NodeReport(**values)


class Node(FactBase[NodeReport]):
    """
    One-command report of a node: architecture, GPU and driver, docker, free disk where weights
    land, MemFree, live vm sysctls, the fabric NIC's link, MTU and IPv4 addresses, whether
    NetworkManager runs, and which other netplan files or NM profiles claim the fabric NIC.
    """

    default = NodeReport

    def command(
        self,
        weights_dir: str,
        fabric_interface: str,
        netplan_file: str,
        claimed_netdevs: tuple[str, ...] = (),
    ) -> StringCommand:
        """``claimed_netdevs``: every fabric netdev whose claims by other netplan files and NM
        profiles are listed (fabric_layout "ports"); default the fabric interface alone."""
        netdevs = claimed_netdevs or (fabric_interface,)
        iface_re = "|".join(d.replace(".", "\\.") for d in netdevs)
        if len(netdevs) > 1:
            iface_re = f"({iface_re})"
        q = "[\"']?"
        netplan_re = (
            rf"^[[:space:]]*({q}{iface_re}{q}:|(set-)?name:[[:space:]]*{q}{iface_re}{q}"
            r"[[:space:]]*(#.*)?$)"
        )
        args = (weights_dir, fabric_interface, netplan_file, iface_re, netplan_re, *netdevs)
        return script_command("node", *args)

    def process(self, output: list[str]) -> NodeReport:
        return parse_node_report(output)


def node_args(s: Settings, rank: Rank | None = None) -> dict[str, Any]:
    """Arguments of the Node fact for ``rank`` (default: this host): a part of its state read
    (sparkrig/stateread.py; pyinfra 3.10 caches no fact, so it is read there once per host)."""
    rank = rank or s.me
    args: dict[str, Any] = {
        "weights_dir": s.knobs.weights_dir,
        "fabric_interface": rank.fabric_interface,
        "netplan_file": s.knobs.fabric_netplan_file,
    }
    plan = s.fabric_plan
    if plan is not None:  # fabric_layout "ports": every netdev of the rank's plan
        args["claimed_netdevs"] = plan.ranks[rank.rank].netdevs
    return args


def node_part(s: Settings) -> Part:
    """The state read's part of this host's node report."""
    return Part("node", Node, tuple(sorted(node_args(s).items())))


# ---------------------------------------------------------------------------------------------
# The host's clock: the helpers' signed calls carry the signer's time (files/sparkhost/pairmac.py)
# ---------------------------------------------------------------------------------------------

# Two ranks further apart than half the helpers' window: a signed call between them has half its
# window left at best (the transit and a retry take the rest), so an ordered restart may be refused.
CLOCK_SKEW_MAX_S = WINDOW_S / 2


class Clock(FactBase["float | None"]):
    """
    The host's clock against the control machine's: seconds the host is ahead (negative:
    behind), read as the last part of the state read, so the time the output takes to arrive
    (SSH's latency, well under a second) is the error. None: the host printed no time.
    """

    def command(self) -> str:
        return "date +%s.%N"

    def process(self, output: list[str]) -> float | None:
        now = time.time()
        try:
            return float(output[-1].strip()) - now
        except (IndexError, ValueError):
            raise FactProcessError(f"clock: {output[-1:]!r} is not a time") from None


def clock_part() -> Part:
    """The state read's part of the host's clock (sparkrig/hoststate.py puts it last)."""
    return Part("clock", Clock)


def clock_problems(offsets: dict[str, float | None]) -> list[str]:
    """Every two ranks whose clocks (``offsets``: seconds ahead of the control machine, by rank
    name; None: not read) are more than ``CLOCK_SKEW_MAX_S`` apart, each named with the fix."""
    read = {name: off for name, off in offsets.items() if off is not None}
    out = []
    names = list(read)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            skew = read[b] - read[a]
            if abs(skew) <= CLOCK_SKEW_MAX_S:
                continue
            ahead, behind = (b, a) if skew > 0 else (a, b)
            out.append(
                f"clocks: {ahead} is {abs(skew):.0f} s ahead of {behind} (more than "
                f"{CLOCK_SKEW_MAX_S:.0f} s, half the {WINDOW_S:.0f} s the helpers accept a signed "
                "call in: an ordered restart of the pair would be refused); run `sudo timedatectl "
                f"set-ntp true` on both, and check `timedatectl` says `System clock synchronized: "
                "yes`"
            )
    return out
