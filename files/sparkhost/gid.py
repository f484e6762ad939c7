"""The RoCE v2 GID of a rank's fabric address: the one reading of the GID table and the one rule
for picking the entry, shared by the start gate (``prep``, from sysfs at every start) and the
control side (sparkrig's GID fact, from the same files read over SSH).

The entry is picked by value, never by number: the RoCE v2 GID ``::ffff:<fabric IPv4>`` on the
fabric netdev. rxe lists IPv4 at index 1, a ConnectX-7 usually at 3, and the index moves after
reboots and firmware updates (docs/sources.md, "Fabric")."""

from __future__ import annotations

import glob
import os
import re
from dataclasses import dataclass

from sparkhost.common import read_text

ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"
KINDS = ("gids", "gid_attrs/types", "gid_attrs/ndevs")
_GID_LINE = re.compile(
    r"^/sys/class/infiniband/(?P<dev>[^/]+)/ports/(?P<port>\d+)/"
    r"(?P<kind>gids|gid_attrs/types|gid_attrs/ndevs)/(?P<idx>\d+):(?P<value>.*)$"
)


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


HEADER = "device         port index  gid                                      type        netdev"


def ipv4_mapped_gid(ip: str) -> str:
    """``::ffff:a.b.c.d`` spelled the way sysfs prints GIDs."""
    a, b, c, d = (int(x) for x in ip.split("."))
    return f"0000:0000:0000:0000:0000:ffff:{a:02x}{b:02x}:{c:02x}{d:02x}"


def entries_of(table: dict[tuple[str, int, int], dict[str, str]]) -> list[GidEntry]:
    """The populated entries of {(device, port, index): {kind: value}}, in that order."""
    entries = []
    for (dev, port, idx), attrs in sorted(table.items()):
        gid = attrs.get("gids", "").strip().lower()
        if not gid or gid == ZERO_GID:
            continue
        entries.append(
            GidEntry(
                device=dev,
                port=port,
                index=idx,
                gid=gid,
                type=attrs.get("gid_attrs/types", "").strip(),
                netdev=attrs.get("gid_attrs/ndevs", "").strip(),
            )
        )
    return entries


def parse_gid_lines(lines: list[str], end: str = "") -> list[GidEntry]:
    """``grep -H . gids/* gid_attrs/{types,ndevs}/*`` output under /sys/class/infiniband as
    entries; ValueError on a line of another shape (``end``, a marker line, is skipped)."""
    table: dict[tuple[str, int, int], dict[str, str]] = {}
    for line in lines:
        if not line or (end and line == end):
            continue
        m = _GID_LINE.match(line)
        if not m:
            raise ValueError(f"unexpected line in the RoCE GID table: {line!r}")
        table.setdefault((m["dev"], int(m["port"]), int(m["idx"])), {})[m["kind"]] = m["value"]
    return entries_of(table)


def read_table(sys_root: str, device: str, port: int) -> list[GidEntry]:
    """The populated entries of ``device`` port ``port`` read from sysfs under ``sys_root``."""
    base = f"{sys_root}/class/infiniband/{device}/ports/{port}"
    table: dict[tuple[str, int, int], dict[str, str]] = {}
    for kind in KINDS:
        for path in glob.glob(f"{base}/{kind}/*"):
            idx = os.path.basename(path)
            if idx.isdigit():
                table.setdefault((device, port, int(idx)), {})[kind] = read_text(path)
    return entries_of(table)


class GidNotFound(Exception):
    pass


def select_gid(
    entries: list[GidEntry], ip: str, netdev: str, device: str | None = None, port: int = 1
) -> GidEntry:
    """The RoCE v2 entry whose GID is ::ffff:<ip> on ``netdev`` (and ``device``, when given; an
    entry without a netdev, from an old kernel, counts as on it). Raises GidNotFound with the
    table when nothing fits."""
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
    raise GidNotFound(
        f"no RoCE v2 GID {want} (::ffff:{ip}) on {scope} port {port}; GID table:\n"
        f"{format_table(entries)}"
    )


def gid_index(
    entries: list[GidEntry], ip: str, netdev: str, device: str | None = None, port: int = 1
) -> int | None:
    """``select_gid``'s entry's index, or None when the table has no such entry (a reader
    that judges the table, where the start gate and the fabric phase refuse it)."""
    try:
        return select_gid(entries, ip, netdev, device, port).index
    except GidNotFound:
        return None


def format_table(entries: list[GidEntry]) -> str:
    rows = "\n".join(e.row() for e in entries) or "(no RDMA device or no populated GID)"
    return f"{HEADER}\n{rows}"
