"""The firewall (sparkrig/firewall.py): the ruleset rendered per rank, checked by the real nft,
and, in network namespaces, what it drops: a stranger on the uplink reaches neither the fabric
address nor the pair's ports, a peer on the fabric reaches everything, api_port only from
api_allow, and anything the ruleset does not name is left open (policy accept)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyinfra.api.exceptions import DeployError

from sparkrig import firewall
from sparkrig.config.inventory import build
from sparkrig.config.model import Settings
from tests.unit.conftest import cluster

HAVE_NFT = shutil.which("nft") is not None
ROOT_NETNS = os.geteuid() == 0 and shutil.which("ip") is not None and HAVE_NFT


def ranks(n: int = 2, **knobs: Any) -> list[Settings]:
    return list(build(cluster(n, **knobs)).values())


def test_head_ruleset_names_the_peer_the_ports_and_api_allow() -> None:
    head = ranks()[0]
    text = firewall.ruleset(head)
    assert text.startswith("#!/usr/sbin/nft -f")
    assert "table inet sparkrig {}\ndelete table inet sparkrig\ntable inet sparkrig {" in text
    assert "elements = { 192.168.100.11 }" in text
    assert 'iifname "enp1s0f1np1" ip saddr @fabric_peers accept' in text
    assert 'ip daddr 192.168.100.10 counter drop comment "fabric address off the fabric"' in text
    assert "tcp dport { 29521, 29522, 29600, 29601, 29700, 29701 } counter drop" in text
    assert "elements = { 10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16, 127.0.0.0/8 }" in text
    assert "tcp dport 8000 ip saddr @api_allow4 accept" in text
    assert "tcp dport 8000 ip6 saddr @api_allow6 accept" in text
    assert 'tcp dport 8000 counter drop comment "api_port outside api_allow"' in text
    assert "policy accept;" in text
    # every drop counts (status.py reads the counters by their comments)
    drops = [line for line in text.splitlines() if line.strip().endswith('"') and " drop " in line]
    assert len(drops) == 6 and all("counter drop comment" in d for d in drops)
    assert 'tcp dport 8001 counter drop comment "engine port off loopback"' in text


def test_worker_ruleset_has_no_api_rules_and_its_own_address() -> None:
    worker = ranks()[1]
    text = firewall.ruleset(worker)
    assert "8000" not in text and "api_allow" not in text
    assert "elements = { 192.168.100.10 }" in text
    assert "ip daddr 192.168.100.11 counter drop" in text


def test_four_ranks_each_accept_every_other_rank() -> None:
    for s in ranks(4):
        others = [f"192.168.100.{10 + i}" for i in range(4) if i != s.me.rank]
        assert f"elements = {{ {', '.join(others)} }}" in firewall.ruleset(s)


def test_api_allow_v6_only_and_empty() -> None:
    v6 = firewall.ruleset(ranks(api_allow=["fd00::/8"])[0])
    assert "api_allow4" not in v6 and "elements = { fd00::/8 }" in v6
    closed = firewall.ruleset(ranks(api_allow=[])[0])
    assert "saddr @api_allow" not in closed
    assert 'tcp dport 8000 counter drop comment "api_port outside api_allow"' in closed


def test_engine_port_rule_follows_the_knob_when_it_exists() -> None:
    head = ranks()[0]
    if "engine_port" in type(head.knobs).model_fields:  # the API front's knob (merged)
        assert f"tcp dport {head.knobs.engine_port} counter drop" in firewall.ruleset(head)
    else:
        assert firewall.engine_port(head) is None
        assert "engine port" not in firewall.ruleset(head)


@pytest.mark.parametrize(
    "value, message",
    [
        (["10.0.0.1/8"], "has host bits set"),
        (["not-a-net"], "not a CIDR network"),
        (["10.0.0.0/33"], "not a CIDR network"),
    ],
)
def test_api_allow_refuses_what_is_not_a_network(value: list[str], message: str) -> None:
    with pytest.raises(DeployError) as err:
        ranks(api_allow=value)
    assert "api_allow" in str(err.value) and message in str(err.value)


def test_api_allow_from_the_command_line_is_a_comma_list() -> None:
    assert ranks(api_allow="10.1.0.0/16, fd00::/8")[0].knobs.api_allow == [
        "10.1.0.0/16",
        "fd00::/8",
    ]


def test_api_allow_is_made_canonical() -> None:
    assert ranks(api_allow=["10.1.0.0/16", "FD00::/8", "192.0.2.7"])[0].knobs.api_allow == [
        "10.1.0.0/16",
        "fd00::/8",
        "192.0.2.7/32",
    ]


def test_unit_loads_and_checks_only_its_table_and_its_stop_opens_nothing() -> None:
    text = firewall.unit(ranks()[0])
    assert "ExecStart=/usr/sbin/nft -f /etc/sparkrig/firewall.nft" in text
    assert "ExecStartPre=/usr/sbin/nft -c -f /etc/sparkrig/firewall.nft" in text
    assert "ExecReload=/usr/sbin/nft -c -f /etc/sparkrig/firewall.nft" in text
    assert "Before=network-pre.target" in text and "WantedBy=multi-user.target" in text
    assert "flush ruleset" not in text
    # fail closed: stopping the unit leaves the table (the deploy deletes it when firewall is off)
    assert "ExecStop" not in text and "delete table" not in text


def test_the_rank_and_its_listening_helpers_require_the_firewall_and_start_after_it() -> None:
    head, worker = ranks()
    text = firewall.requires_text()
    lines = [ln for ln in text.splitlines() if ln and not ln.startswith("#")]
    assert lines == [
        "[Unit]",
        "Requires=sparkrig-firewall.service",
        "After=sparkrig-firewall.service",
    ]
    assert firewall.requiring_units(head) == [
        "sparkrig-head.service", "sparkrig-pair.service", "sparkrig-supervisor.service"
    ]  # fmt: skip
    assert firewall.requiring_units(worker) == [
        "sparkrig-worker.service", "sparkrig-pair.service", "sparkrig-agent.service"
    ]  # fmt: skip
    assert firewall.requires_dropins(worker) == [
        f"/etc/systemd/system/{unit}.d/sparkrig-firewall.conf"
        for unit in ("sparkrig-worker.service", "sparkrig-pair.service", "sparkrig-agent.service")
    ]


def test_counters_parsed_from_nft_list() -> None:
    lines = [
        "table inet sparkrig {",
        '\t\tiifname "enp1s0f1np1" counter packets 3 bytes 180 drop comment "fabric: not a peer"',
        '\t\ttcp dport 8000 counter packets 0 bytes 0 drop comment "api_port outside api_allow"',
        "}",
    ]
    counters = firewall.parse_counters(lines)
    assert counters == [
        firewall.DropCounter("fabric: not a peer", 3, 180),
        firewall.DropCounter("api_port outside api_allow", 0, 0),
    ]
    assert "fabric: not a peer 3" in firewall.counters_line(True, counters)
    assert firewall.parse_counters(["table=absent"]) is None
    assert firewall.counter_problems(True, None) and not firewall.counter_problems(False, None)


# ---------------------------------------------------------------------------------------------
# The real nft: the rendered file parses, loads twice (atomic replace) and deletes cleanly
# ---------------------------------------------------------------------------------------------


def netns(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """``argv`` in a fresh network namespace of its own (root here, or an unprivileged user ns)."""
    prefix = ["unshare", "-n"] if os.geteuid() == 0 else ["unshare", "-rn"]
    return subprocess.run([*prefix, *argv], capture_output=True, text=True, check=check)


@pytest.mark.skipif(not HAVE_NFT, reason="nft not installed (scripts/install-deps)")
@pytest.mark.parametrize("n", [2, 4])
def test_every_rank_ruleset_passes_nft_check_and_loads_twice(n: int, tmp_path: Path) -> None:
    for s in ranks(n, api_allow=["10.0.0.0/8", "fd00::/8"]) + ranks(n):
        path = tmp_path / f"rank{s.me.rank}.nft"
        path.write_text(firewall.ruleset(s))
        check = netns("nft", "-c", "-f", str(path), check=False)
        assert check.returncode == 0, check.stderr
        # loaded twice (the second replaces the first in one transaction), then deleted: the
        # other table the namespace holds is untouched throughout
        script = (
            "nft add table ip filter && nft add chain ip filter INPUT '{ type filter hook input "
            f"priority 0; policy accept; }}' && nft -f {path} && nft -f {path} && "
            "nft list table inet sparkrig >/dev/null && nft delete table inet sparkrig && "
            "nft list tables"
        )
        done = netns("sh", "-c", script, check=False)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "table ip filter"


# ---------------------------------------------------------------------------------------------
# What it drops: a rank, its fabric peer and a stranger on the uplink, each a namespace
# ---------------------------------------------------------------------------------------------

LISTEN = r"""
import socket, sys, time
socks = []
for port in map(int, sys.argv[1:]):
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", port)); s.listen(16); socks.append(s)
print("ready", flush=True)
time.sleep(600)
"""
CONNECT = r"""
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=1.5).close()
    print("open")
except OSError as err:
    print(f"closed {err}")
"""
RANK_UPLINK = "192.0.2.1"
STRANGER = "192.0.2.250"


def sh(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=True)


class Lan:
    """rank ns: enp1s0f1np1 192.168.100.10/24 (fabric, to the peer ns at .11) and up0
    192.0.2.1/24 (uplink, to the stranger ns at .250, which routes the fabric subnet via it)."""

    def __init__(self) -> None:
        tag = str(os.getpid() % 100000)
        self.rank, self.peer, self.stranger = (f"sfw{tag}{x}" for x in "rps")
        self.listener: subprocess.Popen[str] | None = None

    def __enter__(self) -> Lan:
        for ns in (self.rank, self.peer, self.stranger):
            sh("ip", "netns", "add", ns)
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        sh("ip", "link", "add", "sfwa", "netns", self.rank, "type", "veth",
           "peer", "name", "sfwb", "netns", self.peer)  # fmt: skip
        sh("ip", "-n", self.rank, "link", "set", "sfwa", "name", "enp1s0f1np1")
        sh("ip", "link", "add", "sfwc", "netns", self.rank, "type", "veth",
           "peer", "name", "sfwd", "netns", self.stranger)  # fmt: skip
        for ns, dev, addr in (
            (self.rank, "enp1s0f1np1", "192.168.100.10/24"),
            (self.peer, "sfwb", "192.168.100.11/24"),
            (self.rank, "sfwc", f"{RANK_UPLINK}/24"),
            (self.stranger, "sfwd", f"{STRANGER}/24"),
        ):
            sh("ip", "-n", ns, "addr", "add", addr, "dev", dev)
            sh("ip", "-n", ns, "link", "set", dev, "up")
        sh("ip", "-n", self.stranger, "route", "add", "192.168.100.0/24", "via", RANK_UPLINK)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.listener is not None:
            self.listener.kill()
            self.listener.wait()
        for ns in (self.rank, self.peer, self.stranger):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)

    def listen(self, ports: list[int]) -> None:
        self.listener = subprocess.Popen(
            ["ip", "netns", "exec", self.rank, sys.executable, "-c", LISTEN, *map(str, ports)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.listener.stdout is not None and self.listener.stdout.readline() == "ready\n"

    def load(self, text: str, tmp: Path) -> None:
        path = tmp / "firewall.nft"
        path.write_text(text)
        sh("ip", "netns", "exec", self.rank, "nft", "-f", str(path))

    def reaches(self, ns: str, ip: str, port: int) -> bool:
        out = sh("ip", "netns", "exec", ns, sys.executable, "-c", CONNECT, ip, str(port)).stdout
        return out.startswith("open")


@pytest.fixture
def lan() -> Iterator[Lan]:
    if not ROOT_NETNS:
        pytest.skip("needs root, iproute2 and nft")
    with Lan() as topology:
        yield topology


def test_stranger_is_dropped_peer_is_served(lan: Lan, tmp_path: Path) -> None:
    head = ranks(api_allow=["10.0.0.0/8"])[0]
    lan.listen([29521, 29600, 29601, 29700, 8000, 2222])
    # without the firewall the weak host model answers the stranger on the fabric address
    assert lan.reaches(lan.stranger, "192.168.100.10", 29600)
    lan.load(firewall.ruleset(head), tmp_path)
    for port in (29521, 29600, 29601, 29700):
        assert lan.reaches(lan.peer, "192.168.100.10", port), port
        assert not lan.reaches(lan.stranger, "192.168.100.10", port), port
        assert not lan.reaches(lan.stranger, RANK_UPLINK, port), port  # wildcard listener
    assert not lan.reaches(lan.stranger, RANK_UPLINK, 8000)  # 192.0.2.250 not in api_allow
    assert lan.reaches(lan.stranger, RANK_UPLINK, 2222)  # not named: left open
    counters = firewall.parse_counters(
        sh(
            "ip", "netns", "exec", lan.rank, "nft", "list", "table", "inet", "sparkrig"
        ).stdout.splitlines()
    )
    assert counters is not None
    dropped = {c.rule: c.packets for c in counters}
    assert dropped["fabric address off the fabric"] > 0
    assert dropped["pair ports off the fabric"] > 0
    assert dropped["api_port outside api_allow"] > 0


def test_api_allow_admits_its_networks(lan: Lan, tmp_path: Path) -> None:
    lan.listen([8000])
    lan.load(firewall.ruleset(ranks(api_allow=["192.0.2.0/24"])[0]), tmp_path)
    assert lan.reaches(lan.stranger, RANK_UPLINK, 8000)
    lan.load(firewall.ruleset(ranks(api_allow=[])[0]), tmp_path)  # reloaded in place
    assert not lan.reaches(lan.stranger, RANK_UPLINK, 8000)


LISTEN6 = r"""
import socket, sys, time
s = socket.socket(socket.AF_INET6); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
s.bind(("::", int(sys.argv[1]))); s.listen(16)
print("ready", flush=True)
time.sleep(600)
"""


def test_a_bootstrap_socket_on_an_ephemeral_port_answers_the_ranks_only(lan: Lan, tmp_path: Path):
    """NCCL's and gloo's bootstrap listen on ephemeral ports on any address ([::] here, which
    IPv4 reaches too): the peer reaches it over the fabric, a stranger on the LAN does not, and
    this host's own connections out (to the stranger's port 40001) still get their replies."""
    listener = subprocess.Popen(
        ["ip", "netns", "exec", lan.rank, sys.executable, "-c", LISTEN6, "40000"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    out = subprocess.Popen(
        ["ip", "netns", "exec", lan.stranger, sys.executable, "-c", LISTEN, "40001"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert listener.stdout is not None and listener.stdout.readline() == "ready\n"
        assert out.stdout is not None and out.stdout.readline() == "ready\n"
        assert lan.reaches(lan.stranger, RANK_UPLINK, 40000)  # no firewall: open to the LAN
        lan.load(firewall.ruleset(ranks()[0]), tmp_path)
        assert not lan.reaches(lan.stranger, RANK_UPLINK, 40000)
        assert lan.reaches(lan.peer, "192.168.100.10", 40000)
        assert lan.reaches(lan.rank, STRANGER, 40001)  # its reply lands on an ephemeral port
    finally:
        for proc in (listener, out):
            proc.kill()
            proc.wait()
