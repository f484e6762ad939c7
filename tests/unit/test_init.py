"""``python3 -m sparkrig init`` (sparkrig/init.py, sparkrig/probe.py): the probe's output read
as the box said it, the fabric chosen the way inventory.py's docstring tells an operator to,
each step left named with its command, host keys pinned (a changed one refused), and an
inventory written that the deploy's own loader reads."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sparkrig import init, probe

ROOT = Path(__file__).resolve().parents[2]
LAB_HEAD = (ROOT / "tests/unit/data/probe-lab-head.txt").read_text().splitlines()  # a lab guest

# A DGX Spark cabled at QSFP port 1, as DGX OS names it (shared/REFERENCE.md "Two functions per
# cable"): each function its own RDMA device and netdev, domain 0 and domain 2; NVIDIA's
# playbook netplan file names both; the 7.0 kernel with kexec handover on by default.
SPARK = """hostname=spark-a1
user=nvidia
sudo=password
ntp=yes
ntp_synced=yes
docker=/usr/bin/docker
nginx=
gpu=NVIDIA GB10
disk_free=3200000000000
rdma=rocep1s0f0|enp1s0f0np0|down|0|1500|0000:01:00.0|
rdma=rocep1s0f1|enp1s0f1np1|up|1|1500|0000:01:00.1|
rdma=roceP2p1s0f0|enP2p1s0f0np0|down|0|1500|0002:01:00.0|
rdma=roceP2p1s0f1|enP2p1s0f1np1|up|1|1500|0002:01:00.1|
route=enP7s7|192.168.1.1
netplan=/etc/netplan/40-cx7.yaml|enP2p1s0f1np1,enp1s0f1np1,ethernets
archive=http://ports.ubuntu.com/ubuntu-ports/
kernel=7.0.0-1019-nvidia
cmdline=BOOT_IMAGE=/boot/vmlinuz-7.0.0-1019-nvidia root=UUID=x ro quiet splash
CONFIG_KEXEC_HANDOVER=y
CONFIG_KEXEC_HANDOVER_ENABLE_DEFAULT=y
##SPARKRIG-END##""".splitlines()


def spark(**swap: str) -> probe.Probe:
    lines = [next((f"{k}={v}" for k, v in swap.items() if line.startswith(k + "=")), line)
             for line in SPARK]  # fmt: skip
    return probe.parse(lines)


def test_a_lab_guests_probe_reads_as_it_said():
    p = probe.parse(LAB_HEAD)
    assert (p.hostname, p.user, p.sudo) == ("lab-head", "spark", "nopasswd")
    assert p.nginx == "/usr/sbin/nginx"
    assert [(r.device, r.netdev, r.cabled, r.ipv4) for r in p.rdma] == [
        ("rxe0", "enp1s0f1np1", True, ("10.200.0.1/24",))
    ]
    assert probe.uplinks(p, "enp1s0f1np1") == ["enP7s7", "enP9s9"]
    assert p.base.kernel.startswith("6.12") and not p.base.kho_active


def test_a_cut_probe_is_an_error_not_a_short_answer():
    with pytest.raises(ValueError, match="ended early"):
        probe.parse(LAB_HEAD[:-1])


def test_the_fabric_is_the_cabled_function_on_domain_0_and_its_twin_is_named():
    a, b = spark(), spark(hostname="spark-b2")
    assert probe.fabric_choice([a, b]) == ("enp1s0f1np1", "")
    twin = probe.second_function(a, "enp1s0f1np1")
    assert twin is not None and twin.netdev == "enP2p1s0f1np1"


def test_without_a_pci_function_the_primary_by_dgx_os_name_is_the_fabric():
    """Soft-RoCE (the default lab: both functions of port 1, no PCI function in sysfs): the
    domain is unknown, so DGX OS's primary name wins over the twin's, which sorts first."""
    soft = [line.replace("|0000:01:00.1|", "||").replace("|0002:01:00.1|", "||")
            for line in SPARK]  # fmt: skip
    boxes = [probe.parse(soft), probe.parse(soft)]
    assert all(r.domain == "" for r in boxes[0].rdma if r.cabled)
    assert probe.fabric_choice(boxes) == ("enp1s0f1np1", "")


def test_boxes_cabled_at_different_ports_have_no_fabric_and_say_which():
    other = [line.replace("|down|0|", "|up|1|") if "s0f0" in line else
             line.replace("|up|1|", "|down|0|") for line in SPARK]  # fmt: skip
    fabric, why = probe.fabric_choice([spark(), probe.parse(other)])
    assert fabric is None
    assert "spark-a1: enP2p1s0f1np1, enp1s0f1np1" in why and "enp1s0f0np0" in why


def test_addresses_the_boxes_already_share_are_kept_else_the_example_plan():
    held = [spark(rdma=f"rocep1s0f1|enp1s0f1np1|up|1|9000|0000:01:00.1|192.168.100.{n}/24")
            for n in (10, 11)]  # fmt: skip
    assert probe.fabric_addresses(held, "enp1s0f1np1") == ["192.168.100.10/24", "192.168.100.11/24"]
    # one box holds none: the example plan for both (never half of each)
    plan = ["192.168.100.10/24", "192.168.100.11/24"]
    assert probe.fabric_addresses([held[0], spark()], "enp1s0f1np1") == plan
    lab = [spark(rdma=f"rxe0|enp1s0f1np1|up|1|9000||10.200.0.{n}/24") for n in (1, 2)]
    assert probe.fabric_addresses(lab, "enp1s0f1np1") == ["10.200.0.1/24", "10.200.0.2/24"]


def test_each_step_left_is_named_with_its_command():
    t = init.Target.parse("nvidia@spark-a.local")
    steps = init.box_todo(t, spark(), "enp1s0f1np1", "/etc/netplan/60-sparkrig-fabric.yaml")
    blocking = [s.text for s in steps if s.blocks]
    advised = [s.text for s in steps if not s.blocks]
    kho = next(s for s in blocking if "kexec handover" in s)
    assert "/etc/default/grub.d/90-sparkrig-kho.cfg" in kho and "update-grub" in kho
    assert "ssh -t -p 22 nvidia@spark-a.local" in kho
    netplan = next(s for s in blocking if "40-cx7.yaml" in s)
    assert "fabric_takeover = True" in netplan
    assert any("NOPASSWD" in s and "sudo password:" in s for s in advised)
    # sparkrig's own netplan file is no claim; a box with NTP on gets no NTP step
    ours = init.box_todo(t, spark(), "enp1s0f1np1", "/etc/netplan/40-cx7.yaml")
    assert not any("40-cx7.yaml" in s.text for s in ours)
    assert not any("timedatectl" in s.text for s in steps)
    assert any("set-ntp true" in s.text for s in init.box_todo(t, spark(ntp="no"), None, None))


@pytest.mark.parametrize("spec", ["spark-a;rm", "-oProxyCommand=x", "a@b@c", "spark:0", "h:99999"])
def test_a_box_that_is_no_user_host_port_is_refused(spec):
    with pytest.raises(ValueError):
        init.Target.parse(spec)


# --- the whole command, against two boxes faked by ssh and ssh-keyscan on PATH -------------

FAKE_SSH = r"""#!/bin/sh
for last; do :; done
case "$last" in
  -s) port=; while [ $# -gt 0 ]; do [ "$1" = -p ] && port=$2; shift; done
      sed "s/^hostname=.*/hostname=box$port/; s|10.200.0.1/24|10.200.0.$((port - 2200))/24|" \
        "$FAKE_PROBE" ;;
  *) for url in $(echo "$last" | grep -oE "https?://[^' \"]+" | sort -u); do
       echo "ok $url 200"; done ;;
esac
"""
FAKE_KEYSCAN = """#!/bin/sh
while [ $# -gt 1 ]; do [ "$1" = -p ] && port=$2; shift; done
echo "[$1]:$port $(cut -d' ' -f1,2 "$FAKE_KEY")"
"""


@pytest.fixture
def boxes(tmp_path, monkeypatch):
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    for name, text in (("ssh", FAKE_SSH), ("ssh-keyscan", FAKE_KEYSCAN)):
        (bin_ / name).write_text(text)
        (bin_ / name).chmod(0o755)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "k")],
                   check=True)  # fmt: skip
    fixture = tmp_path / "probe.txt"
    roomy = ["disk_free=4000000000000" if x.startswith("disk_free=") else x for x in LAB_HEAD]
    fixture.write_text("\n".join(roomy) + "\n")
    env = {**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}", "FAKE_PROBE": str(fixture),
           "FAKE_KEY": str(tmp_path / "k.pub")}  # fmt: skip
    return tmp_path, env


def run_init(tmp: Path, env: dict[str, str], *extra: str) -> subprocess.CompletedProcess[str]:
    from tests.plan.fakehosts import IMAGE

    knobs = [f"base_image={IMAGE}", "lockfile_dir=tests/plan/locks",
             "pair_token_file=tests/plan/pair-token",
             "api_key_file=tests/plan/api-key"]  # fmt: skip
    argv = [sys.executable, "-m", "sparkrig", "init", "127.0.0.1:2201", "127.0.0.1:2202",
            "--known-hosts", str(tmp / "known_hosts"), "--out", str(tmp / "inventory.py"),
            *(a for k in knobs for a in ("--set", k)), *extra]  # fmt: skip
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def test_init_pins_the_keys_and_writes_an_inventory_the_deploy_reads(boxes):
    tmp, env = boxes
    done = run_init(tmp, env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "init: ready" in done.stdout
    known = (tmp / "known_hosts").read_text()
    assert "[127.0.0.1]:2201 ssh-ed25519" in known and "[127.0.0.1]:2202 ssh-ed25519" in known
    check = subprocess.run([sys.executable, "-m", "sparkrig", "check", str(tmp / "inventory.py")],
                           cwd=ROOT, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert check.returncode == 0, check.stderr
    ns: dict[str, object] = {}
    exec((tmp / "inventory.py").read_text(), ns)
    (head_name, head), (worker_name, worker) = ns["head"][0], ns["worker"][0]  # type: ignore[index]
    assert (head_name, worker_name) == ("box2201", "box2202")
    assert head["fabric_interface"] == "enp1s0f1np1" and head["fabric_address"] == "10.200.0.1/24"
    assert worker["fabric_address"] == "10.200.0.2/24"
    assert head["ssh_port"] == 2201 and head["ssh_strict_host_key_checking"] == "yes"
    assert head["uplink_interfaces"] == ["enP7s7", "enP9s9"]
    assert head["lockfile_dir"] == "tests/plan/locks"  # the --set knobs


def test_a_host_key_that_changed_is_refused_and_nothing_is_written(boxes):
    tmp, env = boxes
    assert run_init(tmp, env).returncode == 0
    before = (tmp / "inventory.py").read_text()
    (tmp / "k.pub").unlink()
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp / "k")],
                   input="y\n", text=True, check=True, capture_output=True)  # fmt: skip
    done = run_init(tmp, env, "--set", "fabric_mtu=1500")
    assert done.returncode == 1
    assert "is not the one pinned" in done.stderr
    assert "ssh-keygen -R '[127.0.0.1]:2201'" in done.stderr
    assert (tmp / "inventory.py").read_text() == before
    assert not (tmp / "inventory.py.bak").exists()


def test_an_inventory_written_before_is_kept_beside_the_new_one(boxes):
    tmp, env = boxes
    (tmp / "inventory.py").write_text("# mine\n")
    assert run_init(tmp, env).returncode == 0
    assert (tmp / "inventory.py.bak").read_text() == "# mine\n"


def test_a_box_short_of_disk_for_the_weights_is_named(boxes):
    tmp, env = boxes
    Path(env["FAKE_PROBE"]).write_text("\n".join(LAB_HEAD) + "\n")  # the guest's 10 GiB
    done = run_init(tmp, env)
    assert done.returncode == 1
    assert "box2201: 10.3 GiB free under /var/lib/sparkrig/models, need" in done.stdout


def test_a_misspelled_set_knob_is_named_before_the_deploy(boxes):
    tmp, env = boxes
    done = run_init(tmp, env, "--set", "profil=guard")
    assert done.returncode == 1
    assert "profil: unknown key" in done.stdout
