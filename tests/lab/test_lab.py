"""End to end on the qemu lab: the operator's command against VMs standing in for Sparks.

Ordered: each test builds on the state the previous one left (pytest runs a file top to bottom).
"""

from __future__ import annotations

import json
import re
import time

import pytest

from tests.lab.conftest import Lab, pyinfra

pytestmark = pytest.mark.lab
INV = "lab/inventory.py"
OWNED = ["/etc/sysctl.d/90-sparkrig.conf", "/etc/sparkrig/rank.env"]


def changed_ops(output: str) -> dict[str, list[str]]:
    """Per host, the operations that changed something, from ``pyinfra -y --json``."""
    data = json.loads(output[output.index("{") :])
    changed: dict[str, list[str]] = {}
    for op in data["results"]["operations"]:
        for host in op["success"]:
            changed.setdefault(host, []).append(op["name"])
        assert not op["error"], f"{op['name']} failed on {op['error']}"
    return changed


def sudo_commands_since(lab: Lab, since: int) -> int:
    """How many sudo commands reached the guests since ``since`` (our own check excluded)."""
    total = 0
    for g in lab.guests:
        log = g.sh(f"journalctl _COMM=sudo --since=@{since} --no-pager -o cat || true")
        total += sum(
            1 for line in log.splitlines() if "COMMAND=" in line and "journalctl" not in line
        )
    return total


def gid_index_for(lab_guest, ip: str) -> int:
    a, b, c, d = (int(x) for x in ip.split("."))
    want = f"0000:0000:0000:0000:0000:ffff:{a:02x}{b:02x}:{c:02x}{d:02x}"
    table = lab_guest.sh(
        "for g in /sys/class/infiniband/*/ports/1/gids/*; do "
        'i=${g##*/}; p=${g%/gids/*}; echo "$i $(cat $g) $(cat $p/gid_attrs/types/$i 2>/dev/null)"; '
        "done"
    )
    for line in table.splitlines():
        parts = line.split(maxsplit=2)
        if len(parts) == 3 and parts[1] == want and parts[2].strip() == "RoCE v2":
            return int(parts[0])
    raise AssertionError(f"no RoCE v2 GID for {ip} in\n{table}")


def env_value(guest, key: str) -> str:
    m = re.search(rf"^{key}=(.*)$", guest.sh("cat /etc/sparkrig/rank.env"), re.M)
    assert m, f"{key} not in the env file"
    return m.group(1)


def test_bad_inventory_reaches_no_host(lab: Lab):
    since = int(lab.head.sh("date +%s")) + 1
    time.sleep(1.5)
    r = pyinfra("-y", INV, "deploy.py", "--data", "profile=turbo", "--data", "fabric_mtu=100000")
    assert r.rc != 0
    assert "profile: Input should be 'single', 'shared', 'guard' or 'long'" in r.output
    assert "fabric_mtu" in r.output
    assert sudo_commands_since(lab, since) == 0


def test_dry_diff_shows_new_files_and_changes_nothing(lab: Lab):
    r = pyinfra("--dry", "--diff", INV, "deploy.py")
    assert r.rc == 0, r.output
    assert "Will create /etc/netplan/60-sparkrig-fabric.yaml" in r.output
    assert "+ vm.swappiness = 0" in r.output
    assert "Will create /etc/systemd/system/sparkrig-worker.service" in r.output
    for g in lab.guests:
        assert (
            g.sh("ls /etc/sparkrig /etc/netplan/60-sparkrig-fabric.yaml 2>&1 || true").count(
                "No such file"
            )
            == 2
        )


def test_first_converge(lab: Lab):
    r = pyinfra("-y", INV, "deploy.py")
    assert r.rc == 0, r.output[-6000:]


def test_converged_hosts_verify(lab: Lab):
    for g in lab.guests:
        assert g.sh("sysctl -n vm.swappiness").strip() == "0"
        assert "vm.swappiness = 0" in g.sh("cat /etc/sysctl.d/90-sparkrig.conf")
        assert g.sh("stat -c %a /etc/netplan/60-sparkrig-fabric.yaml").strip() == "600"
        assert g.sh(f"cat /sys/class/net/{g.fabric_interface}/mtu").strip() == "9000"
        assert env_value(g, "NCCL_IB_GID_INDEX") == str(gid_index_for(g, g.ip))
        unit = "sparkrig-head" if g.role == "head" else "sparkrig-worker"
        assert g.sh(f"systemctl is-enabled {unit}").strip() == "enabled"
        assert g.sh(f"systemctl is-active {unit} sparkrig-pair").split() == ["active", "active"]
    for w in lab.workers:
        lab.head.sh(f"ping -M do -s 8972 -c 2 -W 3 -I {lab.head.fabric_interface} {w.ip}")
        w.sh(f"ping -M do -s 8972 -c 2 -W 3 -I {w.fabric_interface} {lab.head.ip}")
    # order: every worker's unit became active before the head's (monotonic clocks differ per VM,
    # so compare through the head's start gate, which waited for the workers' beacons)
    log = lab.head.sh("journalctl -u sparkrig-head --no-pager -o cat")
    assert "every peer is up" in log


def test_second_run_changes_nothing_and_restarts_nothing(lab: Lab):
    before = {g.name: g.unit_started("sparkrig-head sparkrig-worker") for g in lab.guests}
    r = pyinfra("-y", "--json", INV, "deploy.py")
    assert r.rc == 0, r.output[-4000:]
    assert changed_ops(r.output) == {}
    after = {g.name: g.unit_started("sparkrig-head sparkrig-worker") for g in lab.guests}
    assert after == before


def test_limit_worker_fixes_the_worker_and_leaves_the_head_alone(lab: Lab):
    worker = lab.workers[0]
    worker.sh("rm /etc/sysctl.d/90-sparkrig.conf && sysctl -qw vm.swappiness=60")
    head_state = (
        lab.head.unit_started("sparkrig-head"),
        lab.head.sh(f"stat -c %Y {' '.join(OWNED)}"),
    )
    r = pyinfra("-y", "--json", "--limit", "worker", INV, "deploy.py")
    assert r.rc == 0, r.output[-4000:]
    changed = changed_ops(r.output)
    assert set(changed) <= {w.name for w in lab.workers}
    assert worker.sh("sysctl -n vm.swappiness").strip() == "0"
    assert worker.sh("cat /etc/sysctl.d/90-sparkrig.conf").startswith("# Managed by sparkrig")
    assert (
        lab.head.unit_started("sparkrig-head"),
        lab.head.sh(f"stat -c %Y {' '.join(OWNED)}"),
    ) == head_state


def test_firmware_reset_is_restored_by_one_rerun(lab: Lab):
    worker = lab.workers[0]
    iface = worker.fabric_interface
    old_index = env_value(worker, "NCCL_IB_GID_INDEX")
    started = {g.name: g.unit_started("sparkrig-head sparkrig-worker") for g in lab.guests}
    # what a firmware capsule reboot does: MTU back to 1500, the RDMA device re-created
    worker.sh(
        f"ip link set dev {iface} mtu 1500; rdma link delete rxe0; "
        f"ip -6 addr add fe80::5a/64 dev {iface}; rdma link add rxe0 type rxe netdev {iface}"
    )
    r = pyinfra("-y", "--json", INV, "deploy.py")
    assert r.rc == 0, r.output[-6000:]
    assert worker.sh(f"cat /sys/class/net/{iface}/mtu").strip() == "9000"
    assert env_value(worker, "NCCL_IB_GID_INDEX") == str(gid_index_for(worker, worker.ip))
    print(f"GID index on {worker.name}: {old_index} -> {env_value(worker, 'NCCL_IB_GID_INDEX')}")
    for g in lab.guests:  # both ranks restarted
        assert g.unit_started("sparkrig-head sparkrig-worker") != started[g.name]
    assert "every peer is up" in lab.head.sh("journalctl -u sparkrig-head --no-pager -o cat")


def test_killing_the_worker_container_brings_the_head_down(lab: Lab):
    worker = lab.workers[0]
    worker.sh("docker kill sparkrig-rank1")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if lab.head.sh("systemctl is-active sparkrig-head || true").strip() != "active":
            break
        time.sleep(3)
    assert lab.head.sh("systemctl is-active sparkrig-head || true").strip() != "active"
    r = pyinfra("-y", INV, "deploy.py")  # the ordered restart brings both back
    assert r.rc == 0, r.output[-4000:]
    assert lab.head.sh("systemctl is-active sparkrig-head").strip() == "active"
