"""A host's state as the tasks read it: every domain's parts of the one state read, assembled.

Only the tasks import this module. The reading machinery (one remote command per host, read
again only when stale) is sparkrig/stateread.py, which knows no domain; each domain declares its
own parts and a typed reader of them (``host.node_part``, ``owned.owned_of``, ...). Here they
are put together: ``parts_of`` says what a host's read holds, ``HostReport`` reads each part
with its domain's reader."""

from __future__ import annotations

from dataclasses import dataclass

from pyinfra.api.exceptions import FactProcessError
from pyinfra.context import ctx_inventory
from sparkhost.gid import GidEntry

from sparkrig import hostpkg, stateread
from sparkrig.baseline import GRUB_DROPIN, BaselineReport, baseline_of, baseline_part
from sparkrig.cabling import Probe
from sparkrig.config.model import Settings
from sparkrig.fabric import (
    FORWARDING_FILE,
    RELAY_UNIT,
    RELAY_UNIT_FILE,
    graph_paths,
)
from sparkrig.fabricfacts import (
    FabricLinks,
    FabricNeighbours,
    FabricPorts,
    LanAddresses,
    LinkState,
    RoceGids,
    gids_part,
    ports_parts,
)
from sparkrig.firewall import UNIT as FIREWALL_UNIT
from sparkrig.firewall import UNIT_FILE as FIREWALL_UNIT_FILE
from sparkrig.firewall import (
    FirewallReport,
    firewall_of,
    firewall_part,
    requires_dropins,
    ruleset_path,
)
from sparkrig.front import SERVICE as FRONT_SERVICE
from sparkrig.front import archive_of, front_files, front_part
from sparkrig.fronttls import tls_parts
from sparkrig.image import ImageReport, ImageState, image_of, image_part, repo_tags
from sparkrig.node import SYSCTL_FILE, Clock, Node, NodeReport, clock_part, node_part
from sparkrig.owned import OwnedReport, PathState, owned_of, paths_part, units_part
from sparkrig.pairsecret import secret_parts
from sparkrig.paths import paths
from sparkrig.ports import PortsReport, ports_of, ports_part
from sparkrig.release import ReleaseReport, release_part, report_of
from sparkrig.runningrank import rank_part
from sparkrig.secretio import Held, SecretDigest
from sparkrig.stateread import CHECK, Part, StateReadFailed, Values, values_of
from sparkrig.topology import Port
from sparkrig.weights import WeightsReport, artifacts, weights_of, weights_parts


def owned_files(s: Settings) -> list[str]:
    """Every file the deploy writes whole on this host (a new owned file goes here)."""
    k, p = s.knobs, paths(s)
    files = [
        SYSCTL_FILE,
        *hostpkg.remote_files(k.install_dir),
        k.fabric_netplan_file,
        p.env_file,
        *(a.remote_lock for a in artifacts(s)),
        p.token_file,
        p.rank_unit,
        p.pair_unit,
        p.pair_token,
        p.gpu_clock_unit,  # removed again while gpu_clock_max_mhz is None
        *hostpkg.legacy_files(k.install_dir),  # removed once the units use the package
        GRUB_DROPIN,  # kho=off at the next boot (sparkrig/baseline.py), removed when unwanted
        ruleset_path(s),  # the firewall (sparkrig/firewall.py), removed while firewall is off
        FIREWALL_UNIT_FILE,
        *requires_dropins(s),  # the rank and its helpers require the firewall unit, while it is on
    ]
    if s.fabric_plan is not None:  # fabric_layout "ports": removed while the plan relays nothing
        files += [FORWARDING_FILE, RELAY_UNIT_FILE]
        files += graph_paths(s).values()  # a ring's NCCL graph files, removed where it has none
    if s.me.is_head:
        files += [p.restart_script, p.supervisor_unit, p.watchdog_unit]
        files += [p.api_key, p.api_key_env]  # removed again while api_auth is off
        files += front_files(s)  # the API front's site, key include and TLS pair
    else:
        files.append(p.agent_unit)
    return files


def owned_dirs(s: Settings) -> list[str]:
    k = s.knobs
    return [
        k.install_dir,
        paths(s).bin_dir,
        *hostpkg.remote_dirs(k.install_dir),
        k.config_dir,
        k.weights_dir,
        k.cache_dir,
    ]


DOCKER_UNITS = ("docker.socket", "docker.service")  # docker.io and docker-ce name them alike


def units(s: Settings) -> list[str]:
    """Every unit an operation of any host looks at (each host runs the same operations)."""
    names = [s.unit_name, "sparkrig-pair", "sparkrig-agent", "sparkrig-supervisor"]
    own = [
        f"{n}.service" for n in [*names, "sparkrig-watchdog", "sparkrig-gpu-clock", FIREWALL_UNIT]
    ]
    if s.fabric_plan is not None:  # fabric_layout "ports": a ring's relay (tasks/fabric.py)
        own.append(f"{RELAY_UNIT}.service")
    return own + list(DOCKER_UNITS) + [FRONT_SERVICE]


def parts_of(s: Settings) -> tuple[Part, ...]:
    """The parts of ``s``'s host's state read (the same whoever asks), each its domain's."""
    parts = [node_part(s), gids_part()]
    parts.append(image_part(s))  # settings refuse a stack with no image pinned
    parts += weights_parts(s, hostpkg.remote_dir(s.knobs.install_dir))
    parts += secret_parts(s)
    parts.append(release_part(s))
    parts.append(baseline_part(s))
    parts.append(paths_part(owned_files(s), owned_dirs(s)))
    parts.append(units_part(units(s)))
    parts.append(rank_part(s))
    parts.append(ports_part(s))
    parts.append(front_part())
    parts += tls_parts(s)
    parts.append(firewall_part())
    parts += ports_parts(s)  # fabric_layout "ports" only: the cabling probe, every link
    parts.append(clock_part())  # last: its time is the one nearest the output's arrival
    return tuple(parts)


@dataclass(frozen=True)
class HostReport:
    """A host's state as the phases read it: each part through its domain's typed reader (a
    part the read was made without raises KeyError)."""

    values: Values

    def __post_init__(self) -> None:
        owned_of(self.values)  # every owned path asked was said (FactProcessError otherwise)

    @property
    def node(self) -> NodeReport:
        return self.values.get("node", Node)

    @property
    def front_archive(self) -> str:
        """The package archive the head installs nginx from ("" when nginx is installed)."""
        return archive_of(self.values)

    @property
    def clock(self) -> float | None:
        """Seconds this host's clock is ahead of the control machine's (None: not read)."""
        offset: float | None = self.values.get("clock", Clock)
        return offset

    @property
    def gids(self) -> tuple[GidEntry, ...]:
        entries: list[GidEntry] = self.values.get("gids", RoceGids)
        return tuple(entries)

    @property
    def fabric_ports(self) -> dict[int, Port]:
        """The QSFP ports sysfs shows, by index (fabric_layout "ports")."""
        ports: dict[int, Port] = self.values.get("fabric_ports", FabricPorts)
        return ports

    @property
    def fabric_probe(self) -> dict[str, Probe]:
        """Who answers on each netdev of both ports (fabric_layout "ports")."""
        probes: dict[str, Probe] = self.values.get("fabric_probe", FabricNeighbours)
        return probes

    @property
    def fabric_links(self) -> dict[str, LinkState]:
        """Each planned fabric netdev and its don't-fragment ping (fabric_layout "ports")."""
        links: dict[str, LinkState] = self.values.get("fabric_links", FabricLinks)
        return links

    @property
    def lan_addresses(self) -> tuple[tuple[str, str], ...]:
        """The host's global IPv4 addresses (a triangle or a ring: its lan_address is one)."""
        held: tuple[tuple[str, str], ...] = self.values.get("lan", LanAddresses)
        return held

    @property
    def ports(self) -> PortsReport:
        """Who listens on the ports this rank needs (sparkrig/ports.py)."""
        return ports_of(self.values)

    @property
    def firewall(self) -> FirewallReport:
        """nft installed, the table inet sparkrig loaded (sparkrig/firewall.py)."""
        return firewall_of(self.values)

    @property
    def image(self) -> ImageReport:
        return self.values.get("image", ImageState)

    @property
    def release(self) -> ReleaseReport:
        return report_of(self.values)

    @property
    def baseline(self) -> BaselineReport:
        """Kernel, driver, NIC firmware, ... (sparkrig/baseline.py)."""
        return baseline_of(self.values)

    @property
    def pair_secret(self) -> Held:
        """The digest of the agents' secret installed here (sparkrig/pairsecret.py)."""
        return self.values.get("pair_secret", SecretDigest)

    @property
    def api_key(self) -> Held:
        """The head: the digest of the API key installed here (``Held()`` when none is)."""
        return self.values.get("api_key", SecretDigest)

    @property
    def owned(self) -> OwnedReport:
        return owned_of(self.values)

    def file(self, path: str) -> PathState | None:
        return self.owned.file(path)

    def dir(self, path: str) -> PathState | None:
        return self.owned.dir(path)

    def docker_running(self) -> bool:
        """docker.service and its socket both running, as the units part read them."""
        return all(self.unit(u)[0] for u in DOCKER_UNITS)

    def unit(self, service: str) -> tuple[bool, bool]:
        """(running, enabled) of ``service`` (``.service`` added when missing)."""
        return self.owned.unit(service)

    def weights_of(self, lock: str) -> WeightsReport:
        return weights_of(self.values, lock)

    def image_of(self, **args: str) -> ImageReport:
        return image_of(self.values, **args)

    def repo_tags(self, image_repo: str) -> list[str]:
        return repo_tags(self.values, image_repo)


def assemble(parts: tuple[Part, ...], lines: list[str]) -> HostReport:
    """The report from a state read's output: each part parsed by its own fact."""
    return HostReport(values_of(parts, lines))


def values(s: Settings) -> Values:
    """The state read of ``s``'s host (any host of the inventory), read once per generation."""
    got = stateread.read(ctx_inventory.get().get_host(s.me.name), parts_of(s))
    try:
        HostReport(got)  # a read that says nothing of an asked path failed, in one line
    except FactProcessError as err:
        raise StateReadFailed(f"{s.me.name}: {err}; check: {CHECK}") from None
    return got


def read(s: Settings) -> HostReport:
    """The state of ``s``'s host (any host of the inventory), read once per generation."""
    return HostReport(values(s))
