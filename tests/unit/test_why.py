"""``sparkhost why`` (files/sparkhost/why.py): what explains a pair that cannot start, read on a
rank. In network namespaces with the real nft: a peer whose fabric NIC holds another address of
the fabric subnet before the plan's is dropped as not a peer, and why names that address."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path

from sparkhost import why

from sparkrig import firewall
from sparkrig.bringup import explained, why_command
from tests.unit.test_firewall import Lan, lan, ranks, sh  # noqa: F401 (lan: the fixture)

SET_LISTING = """table inet sparkrig {
	set fabric_dropped {
		type ipv4_addr
		size 64
		flags dynamic,timeout
		timeout 1h
		elements = { 192.168.100.222 expires 59m58s, 10.0.0.9 expires 1m }
	}
}"""


def test_dropped_sources_are_read_from_the_sets_elements():
    assert why.dropped_sources(SET_LISTING) == ["192.168.100.222", "10.0.0.9"]
    assert why.dropped_sources("table inet sparkrig {\n set fabric_dropped {\n }\n}") == []


def test_a_table_not_loaded_and_nothing_dropped_are_said_so():
    assert why.firewall_lines(["10.0.0.2"], run=lambda argv: "") == [
        "firewall: the table inet sparkrig is not loaded"
    ]
    table = 'iifname "x" counter packets 0 bytes 0 drop comment "fabric: not a peer"'
    assert why.firewall_lines(["10.0.0.2"], run=lambda argv: table if "table" in argv else "") == [
        "firewall: nothing dropped on the fabric"
    ]


def in_ns(ns: str):
    def run(argv: Sequence[str]) -> str:
        done = subprocess.run(["ip", "netns", "exec", ns, *argv], capture_output=True, text=True)
        return done.stdout if done.returncode == 0 else ""

    return run


def test_a_peer_sourcing_from_a_second_fabric_address_is_named_by_why(
    lan: Lan,  # noqa: F811
    tmp_path: Path,
) -> None:
    """Issue 47: the peer's NIC holds .222 before its plan address .11 (flushed, then both
    added in that order): its traffic leaves from .222, the head's table drops it, and why says
    which address it dropped."""
    head = ranks()[0]
    lan.listen([29521])
    lan.load(firewall.ruleset(head), tmp_path)
    assert lan.reaches(lan.peer, "192.168.100.10", 29521)
    sh("ip", "-n", lan.peer, "addr", "flush", "dev", "sfwb")
    sh("ip", "-n", lan.peer, "addr", "add", "192.168.100.222/24", "dev", "sfwb")
    sh("ip", "-n", lan.peer, "addr", "add", "192.168.100.11/24", "dev", "sfwb")
    assert not lan.reaches(lan.peer, "192.168.100.10", 29521)
    said = why.firewall_lines(["192.168.100.11"], run=in_ns(lan.rank))
    assert len(said) == 1 and "dropped fabric traffic from 192.168.100.222 (" in said[0], said
    assert "the peers: 192.168.100.11" in said[0]
    held = why.address_lines("sfwb", run=in_ns(lan.peer))
    assert held == ["fabric: sfwb holds 192.168.100.222/24, 192.168.100.11/24 (in this order)"]


def test_a_failed_wait_is_followed_by_why_and_keeps_its_exit_status():
    """The head's boot wait and rendezvous wait (sparkrig/bringup.py): on failure the findings
    follow the wait's own lines, and the run still fails with the wait's status."""
    failing = explained(["sh", "-c", "echo container not running; exit 3"], ["echo", "why: x"])
    done = subprocess.run(failing.get_raw_value(), shell=True, capture_output=True, text=True)
    assert (done.returncode, done.stdout) == (3, "container not running\nwhy: x\n")
    passing = explained(["true"], ["echo", "why: x"])
    done = subprocess.run(passing.get_raw_value(), shell=True, capture_output=True, text=True)
    assert (done.returncode, done.stdout) == (0, "")


def test_the_heads_waits_explain_with_its_own_unit_interface_and_peers():
    head = ranks()[0]
    argv = why_command(head)
    port = str(head.knobs.pair_port)
    assert argv[-9:] == ["why", "--unit", "sparkrig-head.service", "--interface", "enp1s0f1np1",
                         "--peers", "192.168.100.11", "--port", port]  # fmt: skip
