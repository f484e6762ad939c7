"""``sparkhost why``: what explains a rank that did not start or a rendezvous that timed out, read
on this rank in one go: which source addresses the firewall dropped on the fabric (the table's
set ``fabric_dropped``, templates/sparkrig-firewall.nft.j2), the fabric NIC's addresses in the
kernel's order (the first of a subnet sources the traffic), the RoCE GID index the start gate
handed over, each peer's stop-together beacon, and the rank unit's last journal lines.

One line per finding, each starting ``why:``; always exit 0 (it only explains a failure that is
already said). The deploy runs it after a failed boot wait or rendezvous (sparkrig/serving.py),
status.py for a rank that is not serving.

Stdlib only."""

from __future__ import annotations

import argparse
import re
import subprocess
from collections.abc import Callable, Sequence

from sparkhost import rankenv
from sparkhost.pair import beacon_probe

TABLE = "inet sparkrig"
DROPPED_SET = "fabric_dropped"
_IPV4 = re.compile(r"\b(\d{1,3}(?:\.\d{1,3}){3})\b")
_NOT_A_PEER = re.compile(r'counter packets (\d+) bytes \d+ drop comment "fabric: not a peer"')

Run = Callable[[Sequence[str]], str]


def run(argv: Sequence[str]) -> str:
    """stdout of ``argv`` ('' when it cannot run or fails: a finding is left out, never raised)."""
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout if done.returncode == 0 else ""


def dropped_sources(set_listing: str) -> list[str]:
    """The addresses in ``nft list set inet sparkrig fabric_dropped``'s elements."""
    _, _, elements = set_listing.partition("elements")
    return _IPV4.findall(elements)


def not_a_peer_drops(table_listing: str) -> int | None:
    """Packets the rule "fabric: not a peer" dropped (None: no such rule loaded)."""
    found = _NOT_A_PEER.search(table_listing)
    return int(found[1]) if found else None


def firewall_lines(peers: Sequence[str], run: Run = run) -> list[str]:
    table = run(["nft", "list", "table", *TABLE.split()])
    if not table:
        return ["firewall: the table inet sparkrig is not loaded"]
    drops = not_a_peer_drops(table)
    sources = dropped_sources(run(["nft", "list", "set", *TABLE.split(), DROPPED_SET]))
    if sources:
        return [
            f"firewall: dropped fabric traffic from {', '.join(sources)} ({drops or 0} packets "
            f"since the table loaded): not a peer's address (the peers: {', '.join(peers)}); "
            "a second address of the fabric subnet on that rank's fabric NIC sources its "
            "traffic (`ip -4 addr show` there; one run of the deploy removes it)"
        ]
    if drops:
        return [f"firewall: {drops} packets dropped on the fabric as not a peer's"]
    return ["firewall: nothing dropped on the fabric"]


def address_lines(interface: str, run: Run = run) -> list[str]:
    shown = run(["ip", "-o", "-4", "addr", "show", "dev", interface])
    held = [line.split()[3] for line in shown.splitlines() if len(line.split()) > 3]
    return [f"fabric: {interface} holds {', '.join(held) or 'no IPv4 address'} (in this order)"]


def gid_line(handed_path: str = rankenv.HANDED_PATH) -> str:
    try:
        with open(handed_path, encoding="utf-8") as f:
            text = f.read()
    except OSError:
        return f"gid: nothing handed over at the last start ({handed_path} absent)"
    values = dict(line.partition("=")[::2] for line in text.splitlines() if "=" in line)
    index = values.get(rankenv.HANDED, "?")
    device = values.get(rankenv.HANDED_DEVICE, "?")
    return f"gid: the last start handed over RoCE GID index {index} on {device}"


def beacon_lines(
    peers: Sequence[str], port: int, probe: Callable[[str, int], bool | None]
) -> list[str]:
    said = {True: "up", False: "down (nothing listens)", None: "no answer (dropped or stalled)"}
    return [f"peer {p}: beacon {said[probe(p, port)]}" for p in peers]


def journal_lines(unit: str, lines: int, run: Run = run) -> list[str]:
    text = run(["journalctl", "-u", unit, "-n", str(lines), "--no-pager", "-o", "cat"])
    return [f"journal {unit}: {line}" for line in text.splitlines()[-lines:]]


def findings(args: argparse.Namespace) -> list[str]:
    peers = [p for p in args.peers.split(",") if p]
    out = firewall_lines(peers)
    out += address_lines(args.interface)
    out.append(gid_line())
    out += beacon_lines(peers, args.port, lambda p, port: beacon_probe(p, port, timeout=3))
    out += journal_lines(args.unit, args.lines)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="sparkhost why", description=__doc__.split("\n")[0])
    ap.add_argument("--unit", required=True, help="the rank's unit (sparkrig-head.service)")
    ap.add_argument("--interface", required=True, help="the fabric netdev")
    ap.add_argument("--peers", default="", help="the other ranks' fabric addresses, a,b,...")
    ap.add_argument("--port", type=int, required=True, help="the stop-together beacon's port")
    ap.add_argument("--lines", type=int, default=8, help="journal lines")
    args = ap.parse_args(argv)
    for line in findings(args):
        print(f"why: {line}", flush=True)
    return 0
