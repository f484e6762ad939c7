"""End to end on the qemu lab: the operator's command against VMs standing in for Sparks.

Ordered: each test builds on the state the previous one left (pytest runs a file top to bottom).
"""

from __future__ import annotations

import json
import re
import subprocess
import time

import pytest

from sparkrig.facts import RoceGids, parse_gid_lines
from tests.lab.conftest import STATE, Lab, pyinfra

pytestmark = pytest.mark.lab
INV = "lab/inventory.py"
OWNED = ["/etc/sysctl.d/90-sparkrig.conf", "/etc/sparkrig/rank.env"]


def lab_state() -> dict:
    return json.loads(STATE.read_text())


def hub_log() -> list[dict]:
    """Every request the Hub stand-in served (it records the client address)."""
    out = subprocess.run(
        ["ip", "netns", "exec", lab_state()["namespace"], "python3", "-c",
         "import urllib.request,sys; sys.stdout.write(urllib.request.urlopen("
         f"'{lab_state()['hub_endpoint']}/_control/log').read().decode())"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return json.loads(out.stdout)


def changed_ops(output: str) -> dict[str, list[str]]:
    """Per host, the operations that changed something, from ``pyinfra -y --json``."""
    data = json.loads(output)
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


def gid_table(guest) -> list:
    """The guest's own GID table, read the way the fact reads it (one grep)."""
    return parse_gid_lines(guest.sh(RoceGids().command()).splitlines())


def gid_index_for(guest, ip: str) -> int:
    """The guest's own RoCE v2 index for ::ffff:<ip>."""
    table = gid_table(guest)
    a, b, c, d = (int(x) for x in ip.split("."))
    want = f"0000:0000:0000:0000:0000:ffff:{a:02x}{b:02x}:{c:02x}{d:02x}"
    found = [e.index for e in table if e.gid == want and e.type == "RoCE v2"]
    assert len(found) == 1, f"RoCE v2 entries for {ip}: {found}\n{table}"
    return found[0]


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


def test_weights_came_once_over_both_uplinks_then_over_the_fabric(lab: Lab):
    fetcher = "/opt/sparkrig/bin/sparkrig-fetch"
    for g in lab.guests:  # every rank holds the checkpoint, re-hashed in full here
        g.sh(
            f"{fetcher} verify --mode full --lock /etc/sparkrig/model.lock.json "
            "--dest /var/lib/sparkrig/models/model"
        )
    clients = {entry["client"] for entry in hub_log() if "/resolve/" in entry["path"]}
    head_uplinks = set(lab_state()["hosts"][0]["uplink_addresses"].values())
    assert clients == head_uplinks, f"hub saw {clients}, head uplinks are {head_uplinks}"


def test_the_four_gates_pass_and_the_head_started_right_after_the_workers(lab: Lab):
    out = lab.head.sh(
        "python3 /opt/sparkrig/sparkrig_gate.py gates --url http://127.0.0.1:8000 "
        "--model glm-5.3-flash"
    )
    gates = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    print("gates:", gates)
    assert [(g["gate"], g["ok"]) for g in gates] == [
        ("health", True),
        ("models", True),
        ("math", True),
        ("tool", True),
    ]
    worker_ready = float(
        lab.workers[0].sh(
            "date -d \"$(docker inspect -f '{{.State.StartedAt}}' sparkrig-rank1)\" +%s.%N"
        )
    )
    head_start = float(
        lab.head.sh(
            'date -d "$(systemctl show -p ActiveEnterTimestamp --value sparkrig-head)" +%s.%N'
        )
    )
    print(f"worker container running -> head unit started: {head_start - worker_ready:.1f} s")
    assert -5 < head_start - worker_ready < 120


def test_second_run_changes_nothing_and_restarts_nothing(lab: Lab):
    before = {g.name: g.unit_started("sparkrig-head sparkrig-worker") for g in lab.guests}
    r = pyinfra("-y", "--json", INV, "deploy.py")
    assert r.rc == 0, r.output[-4000:]
    assert changed_ops(r.stdout) == {}
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
    changed = changed_ops(r.stdout)
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
    # what a firmware capsule reboot does: MTU back to 1500, the RDMA device re-created, and the
    # GID table filled in another order. A VLAN on the fabric NIC (which netplan does not manage,
    # so the re-run leaves it alone) takes the low indices before the fabric IPv4 comes back.
    worker.sh(
        f"ip link set dev {iface} mtu 1500; ip -4 addr flush dev {iface}; "
        f"rdma link delete rxe0; rdma link add rxe0 type rxe netdev {iface}; "
        f"ip link add link {iface} name fab77 type vlan id 77; "
        "ip addr add 10.77.0.2/24 dev fab77; ip link set fab77 up"
    )
    wait_for(
        "the VLAN's GID in the re-created table",
        lambda: any(e.netdev == "fab77" for e in gid_table(worker)),
        30,
    )
    r = pyinfra("-y", "--json", INV, "deploy.py")
    assert r.rc == 0, r.output[-6000:]
    assert worker.sh(f"cat /sys/class/net/{iface}/mtu").strip() == "9000"
    assert env_value(worker, "NCCL_IB_GID_INDEX") == str(gid_index_for(worker, worker.ip))
    new_index = env_value(worker, "NCCL_IB_GID_INDEX")
    print(f"GID index on {worker.name}: {old_index} -> {new_index}")
    assert new_index != old_index, gid_table(worker)
    for g in lab.guests:  # both ranks restarted
        assert g.unit_started("sparkrig-head sparkrig-worker") != started[g.name]
    assert "every peer is up" in lab.head.sh("journalctl -u sparkrig-head --no-pager -o cat")


def wait_for(what: str, check, timeout: float) -> float:
    start = time.monotonic()
    while not check():
        assert time.monotonic() - start < timeout, f"{what}: not within {timeout:.0f} s"
        time.sleep(3)
    took = time.monotonic() - start
    print(f"{what}: {took:.0f} s")
    return took


def test_a_dead_worker_takes_the_head_down_and_the_watchdog_brings_both_back(lab: Lab):
    worker, head = lab.workers[0], lab.head
    before = head.unit_started("sparkrig-head")
    worker.sh("docker kill sparkrig-rank1")
    wait_for(
        "head down after the worker's container died",
        lambda: head.sh("systemctl is-active sparkrig-head || true").strip() != "active",
        120,
    )

    def serving() -> bool:
        out = head.sh(
            "python3 /opt/sparkrig/sparkrig_gate.py probe --url http://127.0.0.1:8000 "
            "--model glm-5.3-flash --timeout 10 >/dev/null 2>&1 && echo ok || true"
        )
        return out.strip() == "ok"

    wait_for("the watchdog restarted the pair and it answers again", serving, 600)
    assert head.unit_started("sparkrig-head") != before
    assert worker.sh("systemctl is-active sparkrig-worker").strip() == "active"
    assert "restarting the pair" in head.sh("journalctl -u sparkrig-watchdog --no-pager -o cat")


def test_stopping_the_head_is_left_alone_and_the_deploy_restarts_the_pair(lab: Lab):
    head = lab.head
    head.sh("systemctl stop sparkrig-head")
    wait_for(
        "worker down after the head was stopped",
        lambda: (
            lab.workers[0].sh("systemctl is-active sparkrig-worker || true").strip() != "active"
        ),
        120,
    )
    time.sleep(30)  # an operator's stop: the watchdog must not undo it
    assert head.sh("systemctl is-active sparkrig-head || true").strip() != "active"
    r = pyinfra("-y", INV, "deploy.py")  # the ordered start brings both back
    assert r.rc == 0, r.output[-4000:]
    assert head.sh("systemctl is-active sparkrig-head").strip() == "active"
