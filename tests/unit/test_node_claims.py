"""The node report's claims (sparkrig/node.py) run for real: in a network namespace with a
ports-layout pair rank's two fabric netdevs (veths under DGX OS's names) and a mount
namespace with empty netplan and NetworkManager directories, another netplan file naming the
twin and an NM profile bound to the twin's MAC are both found; the single layout's command
still looks at its one netdev."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from sparkrig.config.inventory import build
from sparkrig.factlines import END
from sparkrig.node import Node, node_args, parse_node_report
from tests.unit.test_rings import ports_cluster

READY = os.geteuid() == 0 and all(shutil.which(t) for t in ("ip", "unshare", "mount"))
pytestmark = pytest.mark.skipif(not READY, reason="needs root, ip, unshare and mount")
DIRS = ("/etc/netplan", "/lib/netplan", "/run/netplan", "/etc/NetworkManager/system-connections",
        "/run/NetworkManager/system-connections")  # fmt: skip
TWIN_MAC = "02:00:00:00:01:01"


def report(netdevs: dict[str, str], files: dict[str, str], **args: object) -> list[str]:
    ns = f"srnode{os.getpid() % 10000}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        for n, (dev, mac) in enumerate(netdevs.items()):  # veths: no dummy module here
            subprocess.run(["ip", "-n", ns, "link", "add", dev, "address", mac, "type", "veth",
                            "peer", "name", f"far{n}"], check=True)  # fmt: skip
        setup = "".join(f"mkdir -p {d}; mount -t tmpfs none {d}; " for d in DIRS)
        for path, text in files.items():
            setup += f"printf '{text}' > {path}; "  # (no % in the texts)
        command = Node().command(**args).get_raw_value()
        out = subprocess.run(
            ["ip", "netns", "exec", ns, "unshare", "-m", "sh", "-c", setup + command],
            capture_output=True, text=True, timeout=60, check=True,
        ).stdout  # fmt: skip
        return out.splitlines()
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def test_claims_on_the_twin_are_found_in_the_ports_layout():
    s = build(ports_cluster(2))["spark-1"]
    primary, twin = s.fabric_rank.netdevs
    netplan = f"network:\\n  ethernets:\\n    {twin}:\\n      dhcp4: true\\n"
    profile = f"[connection]\\nid=cx7-twin\\ntype=ethernet\\n[ethernet]\\nmac-address={TWIN_MAC}\\n"
    files = {"/etc/netplan/40-cx7.yaml": netplan,
             "/etc/NetworkManager/system-connections/cx7-twin.nmconnection": profile}  # fmt: skip
    lines = report({primary: "02:00:00:00:01:00", twin: TWIN_MAC}, files, **node_args(s))
    assert lines[-1] == END
    node = parse_node_report(lines)
    assert node.netplan_claims == ("/etc/netplan/40-cx7.yaml",)
    assert [p.name for p in node.nm_claims] == ["cx7-twin"]
    # the single layout's one netdev: the same files claim nothing of it
    single = {**node_args(s), "claimed_netdevs": ()}
    node = parse_node_report(report({primary: "02:00:00:00:01:00", twin: TWIN_MAC}, files,
                                    **single))  # fmt: skip
    assert node.netplan_claims == () and node.nm_claims == ()
