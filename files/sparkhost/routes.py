"""``sparkhost routes``: per-uplink policy routing for the weights fetch, idempotent.

For each uplink N: table ``<table-base>+N`` holds ``default via <gw> dev <if>`` and the uplink's
own subnet on the link, and a rule ``from <the uplink's IPv4> lookup <table>`` at pref
``<pref-base>+N``, so a socket bound to that source leaves through that uplink. The subnet route
matters beyond the fetch: the rule catches every packet from that address, the answers of the
host's SSH and API to a LAN neighbour included; without it they go to the gateway, which need not
send them back onto the LAN they came from (the lab's does not: issue 35's stranger).
``--check`` only reports. The fetch's ``--install-routes`` runs the same plan before it starts."""

from __future__ import annotations

import argparse
import ipaddress
import json
import subprocess
import time
from typing import Any

from sparkhost.common import EXIT_FAILED, EXIT_OK

_addr_cache: dict[str, tuple[float, str | None]] = {}


def iface_ipv4(iface: str) -> str | None:
    """First IPv4 address of iface, from `ip -j addr show dev X` (cached 30 s)."""
    now = time.monotonic()
    hit = _addr_cache.get(iface)
    if hit and now - hit[0] < 30:
        return hit[1]
    addr = None
    try:
        out = subprocess.run(
            ["ip", "-j", "addr", "show", "dev", iface],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout
        for link in json.loads(out or "[]"):
            for a in link.get("addr_info", []):
                if a.get("family") == "inet" and a.get("local"):
                    addr = a["local"]
                    break
            if addr:
                break
    except (OSError, ValueError, subprocess.SubprocessError):
        addr = None
    _addr_cache[iface] = (now, addr)
    return addr


def ip_json(*argv: str, missing_ok: bool = False) -> Any:
    r = subprocess.run(["ip", "-j", *argv], capture_output=True, text=True, check=False)
    if r.returncode:
        if missing_ok:  # e.g. "FIB table does not exist" before the first route goes in
            return []
        raise RuntimeError(f"ip -j {' '.join(argv)}: {r.stderr.strip()}")
    out = r.stdout.strip()
    return json.loads(out) if out.startswith("[") else []


def plan_routes(
    uplinks: list[str], table_base: int, pref_base: int, gateways: dict[str, str]
) -> tuple[list[list[str]], list[dict[str, Any]]]:
    """Commands to make `from <ip> lookup 10N` + `default via gw dev if table 10N` hold."""
    cmds: list[list[str]] = []
    info = []
    rules = ip_json("rule", "show")
    for n, iface in enumerate(uplinks, 1):
        table, pref = table_base + n, pref_base + n
        src, subnet = None, ""
        for link in ip_json("addr", "show", "dev", iface):
            for a in link.get("addr_info", []):
                if a.get("family") == "inet" and src is None:
                    src = a.get("local")
                    cidr = f"{src}/{a.get('prefixlen', 32)}"
                    subnet = str(ipaddress.ip_interface(cidr).network)
        gw = gateways.get(iface)
        if gw is None:
            for r in ip_json("route", "show", "default", "dev", iface):
                if r.get("gateway"):
                    gw = r["gateway"]
                    break
        info.append({"iface": iface, "src": src, "gateway": gw, "table": table, "pref": pref})
        if src is None:
            raise RuntimeError(f"{iface}: no IPv4 address")
        want_route = ["default"] + (["via", gw] if gw else []) + ["dev", iface]
        have = ip_json("route", "show", "table", str(table), missing_ok=True)
        if (
            not any(
                r.get("dst") == "default" and r.get("dev") == iface and r.get("gateway") == gw
                for r in have
            )
            or len([r for r in have if r.get("dst") == "default"]) != 1
        ):
            cmds.append(["ip", "route", "replace", *want_route, "table", str(table)])
        on_link = [r for r in have if r.get("dst") == subnet and r.get("dev") == iface]
        if subnet and (not on_link or on_link[0].get("prefsrc") != src):
            cmds.append(["ip", "route", "replace", subnet, "dev", iface, "scope", "link",
                         "src", src, "table", str(table)])  # fmt: skip
        mine = [r for r in rules if r.get("priority") == pref]
        good = [
            r
            for r in mine
            if r.get("src") == src
            and r.get("srclen", 32) == 32
            and str(r.get("table")) == str(table)
        ]
        if not good or len(mine) != 1:
            for _ in mine:
                cmds.append(["ip", "rule", "del", "pref", str(pref)])
            cmds.append(["ip", "rule", "add", "from", src, "lookup", str(table), "pref", str(pref)])
    return cmds, info


def installed(uplinks: int, pref_base: int) -> bool:
    """Whether a fetch left any of its rules (pref_base+1..+uplinks) on this host."""
    prefs = {pref_base + n for n in range(1, uplinks + 1)}
    return any(r.get("priority") in prefs for r in ip_json("rule", "show"))


def cmd_routes(args: argparse.Namespace) -> int:
    gws = dict(g.split("=", 1) for g in args.gateway or [])
    try:
        cmds, info = plan_routes(args.uplink, args.table_base, args.pref_base, gws)
        if args.repair and not installed(len(args.uplink), args.pref_base):
            cmds = []  # no fetch put its rules here: nothing to repair
    except (RuntimeError, subprocess.CalledProcessError, ValueError) as e:
        print(json.dumps({"ok": False, "error": str(e)}))
        return EXIT_FAILED
    if not args.check:
        for c in cmds:
            subprocess.run(c, check=True)
    print(
        json.dumps(
            {
                "ok": True,
                "changed": bool(cmds),
                "applied": not args.check,
                "commands": [" ".join(c) for c in cmds],
                "uplinks": info,
            },
            sort_keys=True,
        )
    )
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    r = argparse.ArgumentParser(prog="sparkhost routes", description=__doc__.split("\n")[0])
    r.add_argument("--uplink", action="append", required=True)
    r.add_argument("--gateway", action="append", help="IF=GW when the main table has none")
    r.add_argument("--table-base", type=int, default=100)
    r.add_argument("--pref-base", type=int, default=1000)
    r.add_argument("--check", action="store_true", help="report only")
    r.add_argument("--repair", action="store_true",
                   help="only where a fetch's rules are in place already (an upgrade)")  # fmt: skip
    return r


def main(argv: list[str] | None = None) -> int:
    return cmd_routes(build_parser().parse_args(argv))
