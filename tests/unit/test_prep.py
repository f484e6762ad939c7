"""The start gate (files/sparkhost/prep.py) on a fake sysfs/proc tree: every exit path."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
from sparkhost import prep, rankenv

IFACE, HCA, IP = "enp1s0f1np1", "rocep1s0f1", "192.168.100.11"
WANT = "0000:0000:0000:0000:0000:ffff:c0a8:640b"
FE80 = "fe80:0000:0000:0000:5054:00ff:fe5a:0202"
ENV = f"""# rank env as the deploy writes it
SPARKRIG_FABRIC_INTERFACE={IFACE}
SPARKRIG_FABRIC_IP={IP}
SPARKRIG_FABRIC_MTU=9000
SPARKRIG_ROCE_PORT=1
NCCL_IB_HCA={HCA}
NCCL_IB_GID_INDEX=3
"""


class Tree:
    """A fake /sys and /proc: the fabric netdev, its RDMA device's GID table and meminfo."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.sys, self.proc = root / "sys", root / "proc"
        (self.proc / "sys/vm").mkdir(parents=True)
        self.net = self.sys / "class/net" / IFACE
        self.net.mkdir(parents=True)
        self.port = self.sys / "class/infiniband" / HCA / "ports/1"
        self.env = root / "rank.env"
        self.env.write_text(ENV)
        self.gid_env = root / "run/gid.env"
        self.link(carrier=True, mtu=9000)
        self.memfree(100)

    def link(self, carrier: bool, mtu: int) -> None:
        (self.net / "carrier").write_text("1\n" if carrier else "0\n")
        (self.net / "mtu").write_text(f"{mtu}\n")

    def gid(self, index: int, gid: str, kind: str = "RoCE v2", ndev: str = IFACE) -> None:
        for sub in ("gids", "gid_attrs/types", "gid_attrs/ndevs"):
            (self.port / sub).mkdir(parents=True, exist_ok=True)
        (self.port / "gids" / str(index)).write_text(gid + "\n")
        (self.port / "gid_attrs/types" / str(index)).write_text(kind + "\n")
        (self.port / "gid_attrs/ndevs" / str(index)).write_text(ndev + "\n")

    def memfree(self, gib: float) -> None:
        kb = int(gib * 1024 * 1024)
        (self.proc / "meminfo").write_text(
            f"MemTotal:       {kb * 2} kB\nMemFree:        {kb} kB\nMemAvailable:   {kb} kB\n"
        )

    def run(self, *extra: str) -> int:
        return int(
            prep.main(
                ["--env", str(self.env), "--memfree-min-gib", "8", "--wait", "0",
                 "--gid-env", str(self.gid_env), *extra]
            )
        )  # fmt: skip


@pytest.fixture
def tree(tmp_path, monkeypatch) -> Tree:
    t = Tree(tmp_path)
    monkeypatch.setattr(prep, "SYS", str(t.sys))
    monkeypatch.setattr(prep, "PROC", str(t.proc))
    monkeypatch.setattr(prep.os, "sync", lambda: None)
    t.bin = tmp_path / "bin"  # fake docker / nvidia-smi: a quiet node unless a test says otherwise
    t.bin.mkdir()
    tool(t.bin, "docker", "")
    monkeypatch.setenv("PATH", f"{t.bin}:{os.environ['PATH']}")
    return t


def tool(bindir: Path, name: str, stdout: str) -> None:
    path = bindir / name
    path.write_text(f"#!/bin/sh\nprintf '%s' '{stdout}'\n")
    path.chmod(0o755)


def handed_over(tree: Tree) -> str:
    return tree.gid_env.read_text().splitlines()[-1]


def test_ready_fabric_and_memory_start_with_the_live_index(tree, capsys):
    tree.gid(0, FE80, "IB/RoCE v1")
    tree.gid(1, FE80)
    tree.gid(2, WANT, "IB/RoCE v1")
    tree.gid(3, WANT)
    assert tree.run("--fabric-wait", "5") == 0
    assert handed_over(tree) == "SPARKRIG_GID_INDEX=3"
    assert "MemFree 100.0 GiB >= 8.0 GiB" in capsys.readouterr().out
    assert (tree.proc / "sys/vm/drop_caches").read_text() == "3"


def test_a_moved_index_is_handed_over_not_refused(tree, capsys):
    tree.gid(1, FE80)
    tree.gid(5, WANT)  # the deploy saw 3
    assert tree.run("--fabric-wait", "5") == 0
    assert handed_over(tree) == "SPARKRIG_GID_INDEX=5"
    assert "is 5 now (the deploy saw 3); the container gets 5" in capsys.readouterr().out


def test_an_entry_of_another_netdev_or_roce_v1_is_not_taken(tree, capsys):
    tree.gid(3, WANT, "IB/RoCE v1")
    tree.gid(4, WANT, ndev="fab77")
    assert tree.run("--fabric-wait", "0") == 2
    assert not tree.gid_env.exists()


def test_wrong_mtu_refuses_with_exit_2(tree, capsys):
    tree.gid(3, WANT)
    tree.link(carrier=True, mtu=1500)
    assert tree.run("--fabric-wait", "5") == 2
    err = capsys.readouterr().err
    assert f"{IFACE} MTU is 1500, expected 9000" in err
    assert not tree.gid_env.exists()


def test_a_gid_that_never_appears_refuses_with_exit_2_and_the_table(tree, capsys):
    tree.gid(0, FE80, "IB/RoCE v1")
    tree.gid(1, FE80)
    tree.gid_env.parent.mkdir(parents=True)
    tree.gid_env.write_text("SPARKRIG_GID_INDEX=3\n")  # a stale hand-over from the last start
    assert tree.run("--fabric-wait", "1") == 2
    err = capsys.readouterr().err
    assert f"no the RoCE v2 GID ::ffff:{IP} on {IFACE}" in err
    assert f"GID table of {HCA} port 1:" in err
    assert f"     1  {FE80}  RoCE v2     {IFACE}" in err
    assert not tree.gid_env.exists(), "a stale index must never reach the container"


def test_no_carrier_and_no_device_are_named(tree, capsys):
    tree.link(carrier=False, mtu=9000)
    assert tree.run("--fabric-wait", "0") == 2
    err = capsys.readouterr().err
    assert f"carrier on {IFACE}" in err and f"RDMA device {HCA} port 1" in err


def test_a_gid_that_appears_after_a_delay_starts_with_the_new_index(tree, capsys):
    # after a reboot: no carrier (the peer is still off), so no address and no GID; they come
    tree.link(carrier=False, mtu=1500)
    tree.gid(1, FE80)

    def peer_comes_back() -> None:
        tree.link(carrier=True, mtu=9000)
        tree.gid(4, WANT)

    timer = threading.Timer(1.5, peer_comes_back)
    timer.start()
    try:
        assert tree.run("--fabric-wait", "60") == 0
    finally:
        timer.cancel()
    assert handed_over(tree) == "SPARKRIG_GID_INDEX=4"
    out = capsys.readouterr().out
    assert "waiting up to 60 s for carrier on" in out
    assert "fabric ready after" in out


def test_low_memfree_refuses_with_exit_3_and_lists_consumers(tree, capsys):
    tree.gid(3, WANT)
    tree.memfree(2)
    assert tree.run("--fabric-wait", "5") == 3
    err = capsys.readouterr().err
    assert "MemFree 2.0 GiB < 8.0 GiB" in err and "top consumers" in err
    # what to change: the knobs that set the floor (the deploy shows these journal lines)
    assert "refusing to start: free that memory, or lower the floor (memfree_min_gib = " in err
    assert "in group_data/all.py and run the deploy again" in err


def test_another_container_or_gpu_process_refuses_with_exit_4_and_lists_them(tree, capsys):
    tree.gid(3, WANT)
    tool(tree.bin, "docker", "sparkrig-worker (img)\nvllm_glm53 (vllm/vllm-openai)\n")
    tool(tree.bin, "nvidia-smi", "4242, python3, 61440 MiB\n")
    assert tree.run("--fabric-wait", "5", "--container", "sparkrig-worker") == 4
    err = capsys.readouterr().err
    assert "container vllm_glm53 (vllm/vllm-openai)" in err
    assert "GPU process 4242, python3, 61440 MiB" in err
    assert "sparkrig-worker" not in err  # its own (stale) container is not foreign
    tool(tree.bin, "docker", "sparkrig-worker (img)\n")
    (tree.bin / "nvidia-smi").unlink()  # no nvidia-smi: containers only
    assert tree.run("--fabric-wait", "5", "--container", "sparkrig-worker") == 0


def test_the_floor_follows_vllms_start_check_unless_pinned(tree, capsys):
    """No --memfree-min-gib: ceil(MemTotal x utilization) + margin (MemTotal 200 GiB here)."""
    tree.gid(3, WANT)
    base = ["--env", str(tree.env), "--wait", "0", "--gid-env", str(tree.gid_env)]
    assert prep.main([*base, "--gpu-memory-utilization", "0.85"]) == 3  # needs 171.5 GiB
    assert "MemFree 100.0 GiB < 171.5 GiB" in capsys.readouterr().err
    assert prep.main([*base, "--gpu-memory-utilization", "0.45", "--memfree-margin-gib", "2"]) == 0
    assert "MemFree 100.0 GiB >= 92.0 GiB" in capsys.readouterr().out
    assert prep.main([*base, "--memfree-min-gib", "99"]) == 0  # the knob pins it


def script(bindir: Path, name: str, body: str) -> None:
    path = bindir / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)


def test_a_crash_leftover_is_removed_and_its_memory_awaited_before_the_gates_decide(tree, capsys):
    """The rank's own container outlived its engine's unit: removed by its name; its engine's GPU
    process and memory go a moment later, and the start gate waits for that instead of
    refusing (exit 4) or failing the MemFree floor (exit 3)."""
    tree.gid(3, WANT)
    tree.memfree(2)
    gone = tree.root / "engine-gone"
    script(tree.bin, "docker",
           f'case "$*" in\n'
           f'  "ps --all"*) printf "sparkrig-worker running\\n" ;;\n'
           f'  rm*) echo "$@" >> {tree.root}/docker-rm.log ;;\n'
           f'esac\n')  # fmt: skip
    script(tree.bin, "nvidia-smi", f'[ -e {gone} ] || echo "4242, VLLM::EngineCore, 90000 MiB"\n')

    def engine_exits() -> None:
        gone.write_text("")
        tree.memfree(100)

    timer = threading.Timer(1.5, engine_exits)
    timer.start()
    try:
        assert tree.run("--fabric-wait", "5", "--container", "sparkrig-worker", "--wait", "60") == 0
    finally:
        timer.cancel()
    out = capsys.readouterr().out
    assert "removing this rank's stale container sparkrig-worker (running)" in out
    assert (tree.root / "docker-rm.log").read_text() == "rm --force sparkrig-worker\n"
    assert "waiting up to 60 s for the memory a dead engine held to come back" in out
    assert "GPU processes left: 4242, VLLM::EngineCore, 90000 MiB" in out
    assert "memory back after" in out


def test_the_wait_for_a_dead_engines_memory_is_bounded_then_the_gates_decide(tree, capsys):
    tree.gid(3, WANT)
    script(tree.bin, "nvidia-smi", 'echo "4242, python3, 61440 MiB"\n')  # never goes
    assert tree.run("--fabric-wait", "5", "--container", "sparkrig-worker", "--wait", "2") == 4
    captured = capsys.readouterr()
    assert "waiting up to 2 s for the memory a dead engine held" in captured.out
    assert "after 2 s MemFree is 100.0 GiB; the checks below decide" in captured.out
    assert "GPU process 4242, python3, 61440 MiB" in captured.err


def test_the_memory_advice_names_the_knobs_that_set_the_floor():
    assert "(memfree_min_gib = 8 pins it)" in prep.memory_advice(8.0, 1.5)
    derived = prep.memory_advice(None, 1.5)
    assert "gpu-memory-utilization + memfree_margin_gib = 1.5, or memfree_min_gib when set" in (
        derived
    )


def test_a_stacks_memory_measure_used_is_a_ceiling_and_available_a_floor(tree, capsys):
    """--memory-measure (a stack's MemoryGate): `used` = MemTotal - MemAvailable must stay at or
    below the pinned GiB (Entrpi's 6 GB preflight), `available` = MemAvailable must reach it."""
    tree.gid(3, WANT)
    kb = 1024 * 1024
    (tree.proc / "meminfo").write_text(  # 120 GiB total, 5 GiB used, 1 GiB MemFree
        f"MemTotal:       {120 * kb} kB\nMemFree:        {1 * kb} kB\n"
        f"MemAvailable:   {115 * kb} kB\n"
    )
    base = ["--env", str(tree.env), "--wait", "0", "--gid-env", str(tree.gid_env)]
    assert prep.main([*base, "--memory-measure", "used", "--memfree-min-gib", "6"]) == 0
    assert "used memory 5.0 GiB <= 6.0 GiB" in capsys.readouterr().out
    assert prep.main([*base, "--memory-measure", "used", "--memfree-min-gib", "4"]) == 3
    assert "used memory 5.0 GiB > 4.0 GiB" in capsys.readouterr().err
    assert prep.main([*base, "--memory-measure", "available", "--memfree-min-gib", "110"]) == 0
    assert "MemAvailable 115.0 GiB >= 110.0 GiB" in capsys.readouterr().out
    assert prep.main([*base, "--memfree-min-gib", "6"]) == 3  # MemFree 1 GiB: the default
    with pytest.raises(SystemExit):  # a measure other than MemFree needs its floor pinned
        prep.main([*base, "--memory-measure", "used"])


# --- fabric_layout "ports": every function the env lists (docs/rings.md) ---------------------

TWIN, TWIN_HCA, TWIN_IP = "enP2p1s0f1np1", "roceP2p1s0f1", "198.18.1.2"
TWIN_WANT = "0000:0000:0000:0000:0000:ffff:c612:0102"
PORTS_ENV = f"""# rank env as the deploy writes it in fabric_layout "ports" (a pair)
SPARKRIG_FABRIC_INTERFACE={IFACE}
SPARKRIG_FABRIC_IP={IP}
SPARKRIG_FABRIC_MTU=9000
SPARKRIG_ROCE_DEVICE={HCA}
SPARKRIG_ROCE_PORT=1
SPARKRIG_FABRIC_LAYOUT=ports
SPARKRIG_FABRIC_NETDEVS={IFACE},{TWIN}
SPARKRIG_ROCE_DEVICES={HCA},{TWIN_HCA}
SPARKRIG_FABRIC_ADDRESSES={IP},{TWIN_IP}
NCCL_IB_HCA==${HCA}:1,{TWIN_HCA}:1
"""


def twin(tree: Tree, carrier: bool = True, mtu: int = 9000, gid: bool = True) -> None:
    """The pair's second function: its netdev and RDMA device, its GID at index 5."""
    tree.env.write_text(PORTS_ENV.replace("$", ""))
    net = tree.sys / "class/net" / TWIN
    net.mkdir(parents=True, exist_ok=True)
    (net / "carrier").write_text("1\n" if carrier else "0\n")
    (net / "mtu").write_text(f"{mtu}\n")
    port = tree.sys / "class/infiniband" / TWIN_HCA / "ports/1"
    for sub in ("gids", "gid_attrs/types", "gid_attrs/ndevs"):
        (port / sub).mkdir(parents=True, exist_ok=True)
    if gid:
        (port / "gids/5").write_text(TWIN_WANT + "\n")
        (port / "gid_attrs/types/5").write_text("RoCE v2\n")
        (port / "gid_attrs/ndevs/5").write_text(TWIN + "\n")


def test_ports_every_function_ready_hands_each_devices_index_over(tree):
    tree.gid(3, WANT)
    twin(tree)
    assert tree.run("--fabric-wait", "0") == 0
    handed = rankenv.parse(tree.gid_env.read_text())
    assert handed[rankenv.HANDED_PER_DEVICE] == f"{HCA}:3,{TWIN_HCA}:5"
    assert rankenv.parse_per_device(handed[rankenv.HANDED_PER_DEVICE]) == {HCA: 3, TWIN_HCA: 5}


def test_ports_each_devices_kernel_index_is_handed_over(tree, monkeypatch):
    tree.gid(3, WANT)
    twin(tree)
    kernel = {HCA: 7, TWIN_HCA: 8}
    monkeypatch.setattr(prep, "device_index", kernel.get)  # as `rdma dev show` answers
    assert tree.run("--fabric-wait", "0") == 0
    handed = rankenv.parse(tree.gid_env.read_text())
    assert rankenv.parse_per_device(handed[rankenv.HANDED_DEVICE_INDEXES]) == kernel
    assert handed[rankenv.HANDED_DEVICE_INDEX] == "7"  # the first function's, as before


@pytest.mark.parametrize(
    ("twin_state", "said"),
    [
        ({"gid": False}, f"no the RoCE v2 GID ::ffff:{TWIN_IP} on {TWIN}"),
        ({"carrier": False}, f"no carrier on {TWIN}"),
        ({"mtu": 1500}, f"{TWIN} MTU is 1500, expected 9000"),
    ],
)
def test_ports_a_twin_not_ready_refuses_naming_it(tree, capsys, twin_state, said):
    tree.gid(3, WANT)
    twin(tree, **twin_state)
    assert tree.run("--fabric-wait", "0") == 2
    assert said in capsys.readouterr().err
    assert not tree.gid_env.exists()
