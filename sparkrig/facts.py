"""Custom pyinfra facts: read-only, exit 0 always, typed, failing only their host on bad output."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import Any

from pyinfra.api import FactBase, QuoteString, StringCommand
from pyinfra.api.exceptions import FactProcessError

END = "##SPARKRIG-END##"

# ---------------------------------------------------------------------------------------------
# RoCE GID table
# ---------------------------------------------------------------------------------------------

_GID_LINE = re.compile(
    r"^/sys/class/infiniband/(?P<dev>[^/]+)/ports/(?P<port>\d+)/"
    r"(?P<kind>gids|gid_attrs/types|gid_attrs/ndevs)/(?P<idx>\d+):(?P<value>.*)$"
)
ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"


@dataclass(frozen=True)
class GidEntry:
    device: str
    port: int
    index: int
    gid: str
    type: str
    netdev: str

    def row(self) -> str:
        return (
            f"{self.device:<14} {self.port:>4} {self.index:>5}  {self.gid}  "
            f"{self.type:<11} {self.netdev}"
        )


def parse_gid_lines(lines: list[str]) -> list[GidEntry]:
    """Parse ``grep -H . gids/* gid_attrs/{types,ndevs}/*`` output into populated GID entries."""
    table: dict[tuple[str, int, int], dict[str, str]] = {}
    for line in lines:
        if not line or line == END:
            continue
        m = _GID_LINE.match(line)
        if not m:
            raise FactProcessError(f"unexpected line in the RoCE GID table: {line!r}")
        key = (m["dev"], int(m["port"]), int(m["idx"]))
        table.setdefault(key, {})[m["kind"]] = m["value"].strip()
    entries = []
    for (dev, port, idx), attrs in sorted(table.items()):
        gid = attrs.get("gids", "").lower()
        if not gid or gid == ZERO_GID:
            continue
        entries.append(
            GidEntry(
                device=dev,
                port=port,
                index=idx,
                gid=gid,
                type=attrs.get("gid_attrs/types", ""),
                netdev=attrs.get("gid_attrs/ndevs", ""),
            )
        )
    return entries


class RoceGids(FactBase[list[GidEntry]]):
    """
    Every populated RoCE GID of every RDMA device and port, from sysfs
    (``/sys/class/infiniband/<dev>/ports/<p>/{gids,gid_attrs/types,gid_attrs/ndevs}/<i>``),
    in one remote command. Empty when the host has no RDMA device.
    """

    default = list

    def command(self) -> str:
        base = "/sys/class/infiniband/*/ports/*"
        return (
            f"grep -H . {base}/gids/* {base}/gid_attrs/types/* {base}/gid_attrs/ndevs/* "
            f"2>/dev/null; echo '{END}'"
        )

    def process(self, output: list[str]) -> list[GidEntry]:
        return parse_gid_lines(output)


def ipv4_mapped_gid(ip: str) -> str:
    """``::ffff:a.b.c.d`` spelled the way sysfs prints GIDs."""
    a, b, c, d = (int(x) for x in ip.split("."))
    return f"0000:0000:0000:0000:0000:ffff:{a:02x}{b:02x}:{c:02x}{d:02x}"


class GidNotFound(Exception):
    pass


def select_gid(
    entries: list[GidEntry], ip: str, netdev: str, device: str | None = None, port: int = 1
) -> GidEntry:
    """The RoCE v2 entry whose GID is ::ffff:<ip> on ``netdev`` (and ``device``, when given).

    Never picks by number: rxe lists IPv4 at index 1, a ConnectX-7 usually at 3, and the index
    moves after reboots and firmware updates. Raises GidNotFound with the table when nothing fits.
    """
    want = ipv4_mapped_gid(ip)
    for e in entries:
        if (
            e.gid == want
            and e.port == port
            and e.type.lower() == "roce v2"
            and e.netdev in (netdev, "")
            and (device is None or e.device == device)
        ):
            return e
    scope = f"device {device}" if device else f"netdev {netdev}"
    table = "\n".join(e.row() for e in entries) or "(no RDMA device or no populated GID)"
    raise GidNotFound(
        f"no RoCE v2 GID {want} (::ffff:{ip}) on {scope} port {port}; GID table:\n"
        f"device         port index  gid                                      type        netdev\n"
        f"{table}"
    )


# ---------------------------------------------------------------------------------------------
# Node report: everything preflight and the host/fabric phases read, in one command
# ---------------------------------------------------------------------------------------------

_NODE_SCRIPT = r"""
d={weights}; while [ ! -d "$d" ]; do d=$(dirname "$d"); done
echo "arch=$(uname -m)"
echo "kernel=$(uname -r)"
if command -v nvidia-smi >/dev/null 2>&1; then
  q=name,compute_cap,driver_version
  echo "gpu=$(nvidia-smi --query-gpu=$q --format=csv,noheader 2>/dev/null | head -n1)"
fi
echo "docker=$(command -v docker || true)"
echo "disk_free=$(df -P -B1 "$d" 2>/dev/null | awk 'NR==2 {{print $4}}')"
echo "memfree_kb=$(awk '/^MemFree:/ {{print $2}}' /proc/meminfo)"
echo "swappiness=$(cat /proc/sys/vm/swappiness)"
echo "min_free_kbytes=$(cat /proc/sys/vm/min_free_kbytes)"
n=/sys/class/net/{iface}
if [ -d "$n" ]; then
  echo "link_present=1"
  echo "operstate=$(cat $n/operstate 2>/dev/null)"
  echo "carrier=$(cat $n/carrier 2>/dev/null || echo 0)"
  echo "mtu=$(cat $n/mtu)"
  echo "ipv4=$(ip -o -4 addr show dev {iface} 2>/dev/null | awk '{{print $4}}' | paste -sd, -)"
else
  echo "link_present=0"
fi
echo "networkmanager=$(systemctl is-active NetworkManager 2>/dev/null)"
for f in /lib/netplan/*.yaml /etc/netplan/*.yaml /run/netplan/*.yaml; do
  [ -f "$f" ] && [ "$f" != {ours} ] || continue
  grep -qE {netplan_re} "$f" && echo "netplan_claim=$f"
done
mac=$(cat $n/address 2>/dev/null); mac=${{mac:-none}}
for f in /etc/NetworkManager/system-connections/* /run/NetworkManager/system-connections/*; do
  [ -f "$f" ] || continue
  case ${{f##*/}} in netplan-*) continue ;; esac
  if grep -qixE "interface-name={iface_re}|mac-address=$mac" "$f"; then
    echo "nm_claim=$f|$(sed -n 's/^id=//p' "$f" | head -n1)"
  fi
done
echo '{end}'
"""


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
    swappiness: int = -1
    min_free_kbytes: int = -1
    link_present: bool = False
    operstate: str = ""
    carrier: bool = False
    mtu: int = 0
    ipv4: tuple[str, ...] = ()
    networkmanager: str = ""  # systemctl is-active NetworkManager
    # other configurations of the fabric NIC: netplan files naming it (not ours), and NM keyfile
    # profiles bound to it by interface-name or MAC (netplan's own netplan-* profiles excluded)
    netplan_claims: tuple[str, ...] = ()
    nm_claims: tuple[NmProfile, ...] = ()

    @property
    def driver(self) -> str:
        parts = [p.strip() for p in self.gpu.split(",")]
        return parts[2] if len(parts) >= 3 else ""


def parse_key_values(lines: list[str], what: str) -> dict[str, str]:
    """``key=value`` lines of a fact script that ends with the END marker (else it was cut)."""
    if END not in lines:
        raise FactProcessError(f"{what} ended early (no end marker)")
    raw: dict[str, str] = {}
    for line in lines:
        if "=" in line:
            key, _, value = line.partition("=")
            raw[key.strip()] = value.strip()
    return raw


def parse_node_report(lines: list[str]) -> NodeReport:
    raw = parse_key_values(lines, "node report")
    ints = ("disk_free", "memfree_kb", "swappiness", "min_free_kbytes", "mtu")
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
    values["ipv4"] = tuple(a for a in raw.get("ipv4", "").split(",") if a)
    values["networkmanager"] = raw.get("networkmanager", "")
    claims = ("netplan_claim=", "nm_claim=")
    listed = [line.partition("=") for line in lines if line.startswith(claims)]
    values["netplan_claims"] = tuple(v for k, _, v in listed if k == "netplan_claim")
    values["nm_claims"] = tuple(
        NmProfile(*v.partition("|")[::2]) for k, _, v in listed if k == "nm_claim"
    )
    return NodeReport(**values)


class Node(FactBase[NodeReport]):
    """
    One-command report of a node: architecture, GPU and driver, docker, free disk where weights
    land, MemFree, live vm sysctls, the fabric NIC's link, MTU and IPv4 addresses, whether
    NetworkManager runs, and which other netplan files or NM profiles claim the fabric NIC.
    """

    default = NodeReport

    def command(self, weights_dir: str, fabric_interface: str, netplan_file: str) -> StringCommand:
        iface_re = fabric_interface.replace(".", "\\.")
        q = "[\"']?"
        netplan_re = (
            rf"^[[:space:]]*({q}{iface_re}{q}:|(set-)?name:[[:space:]]*{q}{iface_re}{q}"
            r"[[:space:]]*(#.*)?$)"
        )
        script = _NODE_SCRIPT.format(
            weights=shlex.quote(weights_dir),
            iface=shlex.quote(fabric_interface),
            iface_re=iface_re,
            ours=shlex.quote(netplan_file),
            netplan_re=shlex.quote(netplan_re),
            end=END,
        )
        return StringCommand("sh", "-c", QuoteString(script))

    def process(self, output: list[str]) -> NodeReport:
        return parse_node_report(output)


# ---------------------------------------------------------------------------------------------
# Weights on disk, judged against a lockfile
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WeightsReport:
    ok: bool = False
    error: str = ""
    commit: str = ""  # of the lockfile on the host
    total_files: int = 0
    total_bytes: int = 0
    verified: int = 0
    unverified: int = 0  # right size, no valid stamp: hashed before deciding
    missing: int = 0
    partial: int = 0
    mismatched: int = 0
    files_to_fetch: int = -1
    bytes_to_fetch: int = 0
    fetch_state: str = ""

    @property
    def complete(self) -> bool:
        return self.ok and self.files_to_fetch == 0

    def summary(self) -> str:
        if not self.ok:
            return f"state unknown ({self.error or 'no answer'})"
        return (
            f"fetch {self.files_to_fetch} of {self.total_files} files, "
            f"{self.bytes_to_fetch / 1024**3:.2f} GiB ({self.verified} verified, "
            f"{self.unverified} to re-hash, {self.missing} missing, {self.partial} partial, "
            f"{self.mismatched} mismatched)"
        )


_NO_WEIGHTS_STATE = '{"ok": false, "error": "fetcher or lockfile not installed"}'


class WeightsState(FactBase[WeightsReport]):
    """
    What is on disk against the lockfile (the fetcher's ``state``: stamps, sizes, partials),
    in one read-only command; "unknown" before the fetcher and lockfile are installed.
    """

    default = WeightsReport

    def command(self, fetcher: str, lock: str, dest: str) -> StringCommand:
        return StringCommand(
            "test -x", QuoteString(fetcher), "&& test -f", QuoteString(lock), "&&",
            QuoteString(fetcher), "state --lock", QuoteString(lock), "--dest", QuoteString(dest),
            "2>/dev/null || echo", QuoteString(_NO_WEIGHTS_STATE),
        )  # fmt: skip

    def process(self, output: list[str]) -> WeightsReport:
        import json

        try:
            raw = json.loads("\n".join(output))
        except json.JSONDecodeError as err:
            raise FactProcessError(f"weights state is not JSON: {err}") from None
        fields = {k: raw[k] for k in WeightsReport.__dataclass_fields__ if k in raw}
        fields["fetch_state"] = str((raw.get("fetch") or {}).get("state") or "")
        return WeightsReport(**fields)


# ---------------------------------------------------------------------------------------------
# The pair's shared secret, as installed on a rank
# ---------------------------------------------------------------------------------------------


class PairSecretFile(FactBase[str]):
    """
    A one-line secret installed on this rank (stripped), "" when there is none: the agents'
    shared secret, the head's API key. Read so a secret lives with the pair: a control machine
    without it takes the pair's (sparkrig/pairsecret.py).
    """

    default = str

    def command(self, path: str) -> StringCommand:
        return StringCommand("cat", QuoteString(path), "2>/dev/null;", "echo", QuoteString(END))

    def process(self, output: list[str]) -> str:
        if END not in output:
            raise FactProcessError("secret read ended early (no end marker)")
        lines = [line for line in output[: output.index(END)] if line.strip()]
        if len(lines) > 1:
            raise FactProcessError("the installed secret is not a single line")
        return lines[0].strip() if lines else ""
