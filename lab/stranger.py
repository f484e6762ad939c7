"""A stranger on the lab's LAN: a network namespace that is not a rank, on uplink A's
bridge, with a route to the fabric subnet through the head's uplink address, as any host on the
operator's LAN can add. From there it tries what such a host would: the rendezvous, the beacon,
the agent and the supervisor (on the fabric addresses, and on the uplink addresses for the
listeners that take every address) and the API.

    stranger ns  strg-b 172.30.1.250/24 ── veth ── strg-a (in br-a, the lab namespace)
                 route <fabric subnet> via <the head's uplink A address>

Run: python3 -m lab.stranger up | down | try ADDR PORT | http URL [HEADER ...]
(`up` needs a running lab: it reads .lab/state.json.)"""

from __future__ import annotations

import ipaddress
import json
import subprocess
import sys
from typing import Any

from lab import net
from lab.guest import CONTROL_CA, lab_state

NS = "sparkrig-lab-stranger"
HOST = 250  # the stranger's host number in uplink A's subnet
LAB_END, OWN_END = "strg-a", "strg-b"

_CONNECT = r"""
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3])).close()
    print("open")
except OSError as err:
    print(f"closed {err}")
"""

_HTTP = r"""
import json, ssl, sys, urllib.error, urllib.request
cafile, method, url, *headers = sys.argv[1:]
req = urllib.request.Request(url, method=method, headers=dict(h.split(": ", 1) for h in headers))
context = ssl.create_default_context(cafile=cafile)  # a client of the pair: trusts its CA only
try:
    with urllib.request.urlopen(req, timeout=5, context=context) as r:
        print(json.dumps([r.status, dict(r.headers)]))
except urllib.error.HTTPError as err:
    print(json.dumps([err.code, dict(err.headers)]))
except OSError:
    print(json.dumps([0, {}]))
"""


def address() -> str:
    """The stranger's address on uplink A."""
    return f"{net.UPLINKS['a']['prefix']}.{HOST}"


def head_uplink(state: dict[str, Any]) -> str:
    """The head's address on uplink A, the stranger's gateway to the fabric subnet."""
    head = state["hosts"][0]
    return str(head["uplink_addresses"][net.UPLINKS["a"]["interface"]])


def exists() -> bool:
    return subprocess.run(["ip", "netns", "pids", NS], capture_output=True).returncode == 0


def up(state: dict[str, Any] | None = None) -> str:
    """Create the stranger (again: an old one goes first); returns its address."""
    state = state or lab_state()
    down()
    net.sh("ip", "netns", "add", NS)
    net.sh("ip", "-n", NS, "link", "set", "lo", "up")
    net.sh("ip", "link", "add", LAB_END, "netns", net.NS, "type", "veth",
           "peer", "name", OWN_END, "netns", NS)  # fmt: skip
    net.nsip("link", "set", LAB_END, "master", str(net.UPLINKS["a"]["bridge"]))
    net.nsip("link", "set", LAB_END, "up")
    net.sh("ip", "-n", NS, "addr", "add", f"{address()}/24", "dev", OWN_END)
    net.sh("ip", "-n", NS, "link", "set", OWN_END, "up")
    for subnet in fabric_subnets(state):
        net.sh("ip", "-n", NS, "route", "add", subnet, "via", head_uplink(state))
    return address()


def fabric_subnets(state: dict[str, Any]) -> list[str]:
    """The lab's fabric subnets: the one of the single lab, and on the default pair lab the
    twin's buddy too (10.200.1.0/24: the deploy's default addresses both functions)."""
    subnet = str(state["fabric_subnet"])
    if state.get("fabric_layout") == "ports":  # every address derived from fabric_cidr's default
        return ["198.18.0.0/20"]
    if state.get("fabric_layout") != "cable":
        return [subnet]
    from sparkrig.topology import buddy

    return [subnet, str(buddy(ipaddress.IPv4Network(subnet)))]


def down() -> None:
    """Remove the stranger (its veth goes with its namespace)."""
    subprocess.run(["ip", "netns", "del", NS], capture_output=True)
    net.nsip("link", "del", LAB_END, check=False)


def reaches(addr: str, port: int, timeout: float = 3.0) -> bool:
    """Whether a TCP connection from the stranger to addr:port is accepted."""
    out = net.sh("ip", "netns", "exec", NS, sys.executable, "-c", _CONNECT,
                 addr, str(port), str(timeout)).stdout  # fmt: skip
    return out.startswith("open")


def http(url: str, *headers: str, method: str = "GET") -> tuple[int, dict[str, str]]:
    """The HTTP status (0: no answer, a certificate that fails too) and response headers the
    stranger gets for ``url``; an https URL is verified against the pair's CA on the control
    machine, host name included."""
    out = net.sh("ip", "netns", "exec", NS, sys.executable, "-c", _HTTP,
                 str(CONTROL_CA), method, url, *headers).stdout  # fmt: skip
    status, got = json.loads(out or "[0, {}]")
    return int(status), {str(k).lower(): str(v) for k, v in got.items()}


def http_status(url: str, *headers: str, method: str = "GET") -> int:
    """The HTTP status the stranger gets for ``url`` (0: no answer)."""
    return http(url, *headers, method=method)[0]


def main(argv: list[str]) -> int:
    if argv[:1] == ["up"]:
        print(f"stranger {NS} at {up()}")
    elif argv[:1] == ["down"]:
        down()
    elif argv[:1] == ["try"] and len(argv) == 3:
        print("open" if reaches(argv[1], int(argv[2])) else "no answer")
    elif argv[:1] == ["http"] and len(argv) >= 2:
        print(http_status(argv[1], *argv[2:]))
    else:
        print(__doc__.rsplit("Run: ", 1)[1].strip(), file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
