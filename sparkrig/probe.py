"""What ``sparkrig init`` learns of a box before any inventory exists: one read-only shell script
over SSH (``script``, sparkrig/facts/probe.sh), its ``key=value`` output parsed into a
``Probe``, and the choices made from two or more probes (the cabled fabric function, the fabric
addresses, the uplinks).

The RDMA netdevs are read from sysfs, as ``ibdev2netdev`` reads them: a PCI device's
``/sys/class/infiniband/<dev>/device/net/<netdev>``, else the netdev of the device's GID 0
(``ports/1/gid_attrs/ndevs/0``, which Soft-RoCE devices have too). The kernel and its KHO state
come from the baseline's own script (sparkrig/baseline.py), so init and preflight judge them
alike."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

from sparkrig import baseline, topology
from sparkrig.factlines import END, parse_key_values, script_inline
from sparkrig.front import ARCHIVE_URI

DEFAULT_FABRIC = ipaddress.IPv4Interface("192.168.100.10/24")  # inventory.py's own example plan
WEIGHTS_PARENT = "/var/lib"  # where the weights land (/var/lib/sparkrig/models)


@dataclass(frozen=True)
class RdmaNetdev:
    """A netdev with an RDMA device: one PCIe function of a QSFP port on a Spark."""

    device: str  # rocep1s0f1
    netdev: str  # enp1s0f1np1
    operstate: str
    carrier: bool
    mtu: int
    pci: str  # 0000:01:00.1 ("" for a virtual device)
    ipv4: tuple[str, ...]

    @property
    def domain(self) -> str:
        return self.pci.partition(":")[0] if self.pci.count(":") == 2 else ""

    @property
    def cabled(self) -> bool:
        return self.carrier and self.operstate in ("up", "unknown")


@dataclass(frozen=True)
class Route:
    dev: str
    gateway: str


@dataclass(frozen=True)
class Probe:
    """One box, as init saw it."""

    hostname: str = ""
    user: str = ""
    sudo: str = ""  # root | nopasswd | password | none
    ntp: bool = False  # timedatectl NTP=yes: a time service is enabled
    ntp_synced: bool = False
    docker: str = ""
    nginx: str = ""  # installed already: the front needs nothing from the package archive
    gpu: str = ""
    disk_free: int = 0  # bytes free under WEIGHTS_PARENT
    rdma: tuple[RdmaNetdev, ...] = ()
    routes: tuple[Route, ...] = ()
    netplan: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (file, the netdev names it holds)
    netplan_unread: tuple[str, ...] = ()  # files only root reads, and sudo asks a password
    archives: tuple[str, ...] = ()  # the package archive apt reads first (front.ARCHIVE_URI)
    base: baseline.BaselineReport = field(default_factory=baseline.BaselineReport)

    def claims_of(self, netdev: str) -> list[str]:
        """The netplan files that name ``netdev`` (NVIDIA's own among them)."""
        return [path for path, names in self.netplan if netdev in names]


def script() -> str:
    """The probe's shell script: init's own reads, then the baseline's (kernel, KHO)."""
    probe = script_inline("probe", WEIGHTS_PARENT) + f'echo "archive=$({ARCHIVE_URI})"\n'
    return probe + baseline.script("lo", None)


def _listed(lines: list[str], key: str) -> list[list[str]]:
    return [line.partition("=")[2].split("|") for line in lines if line.startswith(key + "=")]


def parse(lines: list[str]) -> Probe:
    """The probe's output (``ValueError`` when cut short or malformed)."""
    if END not in lines:
        raise ValueError("the probe ended early (no end marker): was the connection cut?")
    raw = parse_key_values(lines, "probe")
    rdma = []
    for fields in _listed(lines, "rdma"):
        if len(fields) != 7:
            raise ValueError(f"probe: an rdma line has {len(fields)} fields, not 7: {fields}")
        dev, netdev, oper, carrier, mtu, pci, addrs = fields
        rdma.append(RdmaNetdev(dev, netdev, oper, carrier == "1", int(mtu or 0), pci,
                               tuple(a for a in addrs.split(",") if a)))  # fmt: skip
    routes = tuple(Route(*f[:2]) for f in _listed(lines, "route") if len(f) >= 2 and f[0])
    netplan = tuple(
        (f[0], tuple(n for n in f[1].split(",") if n)) for f in _listed(lines, "netplan")
    )
    unread = tuple(line.partition("=")[2] for line in lines if line.startswith("netplan_unread="))
    archives = tuple(x[8:] for x in lines if x.startswith("archive=") and x[8:])
    return Probe(
        hostname=raw.get("hostname", ""),
        user=raw.get("user", ""),
        sudo=raw.get("sudo", ""),
        ntp=raw.get("ntp") == "yes",
        ntp_synced=raw.get("ntp_synced") == "yes",
        docker=raw.get("docker", ""),
        nginx=raw.get("nginx", ""),
        gpu=raw.get("gpu", ""),
        disk_free=int(raw.get("disk_free") or 0),
        rdma=tuple(sorted(rdma, key=lambda r: r.netdev)),
        routes=routes,
        netplan=netplan,
        netplan_unread=unread,
        archives=archives,
        base=baseline.parse_baseline(lines),
    )


def _rank_of_function(r: RdmaNetdev) -> tuple[bool, str, bool, str]:
    # PCIe domain 0 first (DGX OS names its netdevs enp1s0f*; the second function of the same
    # port is on domain 2, enP2p1s0f*); a device sysfs gives no PCI function (Soft-RoCE) by
    # DGX OS's primary name first, then by name
    primary = topology.DGX_OS_PRIMARY.match(r.netdev) is not None
    return (r.domain not in ("", "0000"), r.domain, not primary, r.netdev)


def fabric_choice(probes: list[Probe]) -> tuple[str | None, str]:
    """The fabric netdev every box has cabled (the same function on every box, domain 0 first),
    or None with why none is."""
    cabled = [{r.netdev: r for r in p.rdma if r.cabled} for p in probes]
    common = set(cabled[0]).intersection(*cabled[1:]) if cabled else set()
    if not common:
        each = zip(probes, cabled, strict=True)
        seen = "; ".join(f"{p.hostname}: {', '.join(sorted(c)) or 'none cabled'}" for p, c in each)
        return None, f"no RDMA netdev is cabled (carrier up) on every box under one name ({seen})"
    best = min((cabled[0][n] for n in common), key=_rank_of_function)
    return best.netdev, ""


def second_function(p: Probe, netdev: str) -> RdmaNetdev | None:
    """The other PCIe function of ``netdev``'s port (same bus address, another domain)."""
    first = next((r for r in p.rdma if r.netdev == netdev), None)
    if first is None or not first.pci:
        return None
    bus = first.pci.partition(":")[2]
    return next((r for r in p.rdma if r.pci.partition(":")[2] == bus and r is not first), None)


def fabric_addresses(probes: list[Probe], netdev: str) -> list[str]:
    """Each box's fabric IPv4/prefix: the addresses the boxes already hold on ``netdev`` when
    they share one subnet and differ (a plan the operator made, e.g. NVIDIA's playbook), else
    inventory.py's example plan, 192.168.100.10/24 upwards."""
    held = []
    for p in probes:
        r = next(r for r in p.rdma if r.netdev == netdev)
        held.append(ipaddress.IPv4Interface(r.ipv4[0]) if r.ipv4 else None)
    if all(held) and len({h.network for h in held if h}) == 1 and len(set(held)) == len(held):
        return [str(h) for h in held]
    net, first = DEFAULT_FABRIC.network, int(DEFAULT_FABRIC.ip)
    return [f"{ipaddress.IPv4Address(first + i)}/{net.prefixlen}" for i in range(len(probes))]


def uplinks(p: Probe, fabric: str | None) -> list[str]:
    """The box's default-route interfaces in route order (one download lane each)."""
    return list(dict.fromkeys(r.dev for r in p.routes if r.dev != fabric))
