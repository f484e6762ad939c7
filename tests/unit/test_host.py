"""The node report's script, run by a real shell on this machine (the loopback NIC stands in for
the fabric NIC): every value it reports is the one the kernel gives."""

from __future__ import annotations

import platform
import subprocess
from pathlib import Path

from sparkrig.node import Node


def node_report(tmp_path: Path, interface: str = "lo"):
    fact = Node()
    command = fact.command(
        weights_dir=str(tmp_path / "not" / "yet" / "there"),
        fabric_interface=interface,
        netplan_file="/etc/netplan/40-sparkrig-fabric.yaml",
    )
    done = subprocess.run(
        ["sh", "-c", command.get_raw_value()], capture_output=True, text=True, check=True
    )
    return fact.process(done.stdout.splitlines())


def test_the_node_report_is_what_the_kernel_says(tmp_path):
    report = node_report(tmp_path)
    assert report.arch == platform.machine() and report.kernel == platform.release()
    assert report.memfree_kb > 0 and report.disk_free > 0  # the nearest existing parent
    assert report.swappiness == int(Path("/proc/sys/vm/swappiness").read_text())
    assert report.min_free_kbytes == int(Path("/proc/sys/vm/min_free_kbytes").read_text())
    assert report.link_present and report.carrier
    assert report.mtu == int(Path("/sys/class/net/lo/mtu").read_text())
    assert report.operstate == Path("/sys/class/net/lo/operstate").read_text().strip()
    assert "127.0.0.1/8" in report.ipv4


def test_a_missing_fabric_nic_is_reported_absent(tmp_path):
    report = node_report(tmp_path, interface="sparkrig-none0")
    assert not report.link_present and not report.carrier and report.mtu == 0
    assert report.memfree_kb > 0  # the rest of the report is still read
    # what the operator may have meant: every netdev of the host, with its operstate
    lo = Path("/sys/class/net/lo/operstate").read_text().strip()
    assert ("lo", lo) in report.netdevs
    assert {n for n, _ in report.netdevs} == {p.name for p in Path("/sys/class/net").iterdir()}
