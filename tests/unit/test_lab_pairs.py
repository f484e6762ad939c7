"""Two pairs behind one endpoint in the lab (issue 52, `python3 -m lab up --pairs 2`): guests 1
and 2 are pair_a (head, worker), 3 and 4 pair_b; each pair cabled as today's two-guest lab
(``cable``: both functions of port 1, each function class its own segment) on segments of its
own; every head's API forwarded to a loopback port of its own; the inventory names each host's
pair, gives each head its LAN address and its own api_url, and makes one group per pair. Without
pairs every one of these is today's lab, the inventory's output byte for byte."""

from __future__ import annotations

import hashlib
import json
import runpy
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from lab import __main__ as labmain
from lab import fabric
from lab.guest import guests
from sparkrig.config.inventory import InventoryView, build
from tests.unit.conftest import knob_defaults
from tests.unit.test_lab_fabric import devices, qemu_argv
from tests.unit.test_lab_stacks import IMAGES, repos, stack_pins, state_json

REPO = Path(__file__).resolve().parents[2]
PAIR_NAMES = [("lab-head", "head", "pair_a"), ("lab-worker1", "worker", "pair_a"),
              ("lab-head2", "head", "pair_b"), ("lab-worker2", "worker", "pair_b")]  # fmt: skip


def test_two_pairs_are_guests_1_and_2_then_3_and_4_the_first_head_todays_lab_head() -> None:
    assert fabric.pair_hosts(2) == PAIR_NAMES
    hosts = labmain.host_records(4, "cable", pairs=2)
    assert [(h["name"], h["role"], h["pair"]) for h in hosts] == PAIR_NAMES
    assert [h["index"] for h in hosts] == [1, 2, 3, 4]
    assert [h["ssh_port"] for h in hosts] == [2221, 2222, 2223, 2224]
    assert [h["mgmt_address"] for h in hosts] == [f"172.30.1.{10 + i}" for i in (1, 2, 3, 4)]
    assert all(h["lab_pairs"] == 2 and h["lab_hosts"] == 4 for h in hosts)
    assert all(h["fabric_layout"] == "cable" for h in hosts)
    # without pairs a host says nothing of them
    assert not {"pair", "lab_pairs"} & {k for h in labmain.host_records(2, "cable") for k in h}


def segments(pairs: int) -> dict[str, list[tuple[int, str]]]:
    """bridge -> the (guest index, netdev) of every NIC on it, in a lab of ``pairs`` pairs."""
    out: dict[str, list[tuple[int, str]]] = {}
    for idx in range(1, 2 * pairs + 1):
        for nic in fabric.nics("cable", 2 * pairs, idx, pairs):
            out.setdefault(nic.bridge, []).append((idx, nic.netdev))
    return out


def test_each_pair_is_todays_cable_lab_on_segments_of_its_own() -> None:
    assert segments(2) == {
        "br-c0f0": [(1, "enp1s0f1np1"), (2, "enp1s0f1np1")],
        "br-c0f1": [(1, "enP2p1s0f1np1"), (2, "enP2p1s0f1np1")],
        "br-c1f0": [(3, "enp1s0f1np1"), (4, "enp1s0f1np1")],
        "br-c1f1": [(3, "enP2p1s0f1np1"), (4, "enP2p1s0f1np1")],
    }
    assert fabric.bridges("cable", 4, 2) == ["br-c0f0", "br-c0f1", "br-c1f0", "br-c1f1"]
    for idx in (1, 2, 3, 4):
        _, own = fabric.pair_of(idx)
        mine, todays = fabric.nics("cable", 4, idx, 2), fabric.nics("cable", 2, own)
        # the same NICs, Soft-RoCE devices and slots as the pair lab's guest in that place
        assert [(n.netdev, n.rdma, n.slot) for n in mine] == [
            (n.netdev, n.rdma, n.slot) for n in todays
        ]
        assert fabric.rxe_arg("cable", 4, idx, 2) == fabric.rxe_arg("cable", 2, own)
        assert [n.tap for n in mine] == [f"g{idx}p1f0", f"g{idx}p1f1"]  # one tap per guest NIC
    # pair_a's fabric is today's pair lab's, bridges and taps alike
    assert fabric.nics("cable", 4, 1, 2) == fabric.nics("cable", 2, 1)
    assert fabric.nics("cable", 4, 2, 2) == fabric.nics("cable", 2, 2)


def test_pair_a_is_addressed_as_todays_cable_lab_pair_b_on_10_202() -> None:
    got = [fabric.first_address("cable", 4, idx, 2) for idx in (1, 2, 3, 4)]
    assert got == ["10.200.0.1/24", "10.200.0.2/24", "10.202.0.1/24", "10.202.0.2/24"]
    assert [h["fabric_address"] for h in labmain.host_records(4, "cable", 2)] == got
    assert (fabric.pair_subnet(0), fabric.pair_subnet(1)) == ("10.200.0.0/24", "10.202.0.0/24")


@pytest.fixture
def no_lab(monkeypatch) -> None:
    """``lab up`` may not go past its argument checks: it would touch the real .lab/."""

    def past_the_checks(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("lab up went past its argument checks")

    monkeypatch.setattr(labmain, "load_state", past_the_checks)
    monkeypatch.setattr(labmain.net, "exists", past_the_checks)
    monkeypatch.setattr(labmain.image, "ensure_base", past_the_checks)


@pytest.mark.parametrize(
    ("pairs", "layout", "n_hosts", "said"),
    [
        (1, "cable", 2, "2 to 4"),
        (5, "cable", 10, "2 to 4"),
        (2, "ports", 4, "not 'ports'"),
        (2, "single", 4, "not 'single'"),
        (2, "cable", 3, "4 guests, not 3"),
    ],
)
def test_pairs_the_lab_cannot_cable_are_refused(no_lab, pairs, layout, n_hosts, said) -> None:
    with pytest.raises(ValueError, match=said):
        fabric.check_pairs(pairs, layout, n_hosts)
    with pytest.raises(SystemExit, match=f"--pairs: .*{said}"):  # before anything is started
        labmain.up(n_hosts, 1, layout, pairs)


def test_without_pairs_the_cable_lab_is_still_a_pairs_only(no_lab) -> None:
    with pytest.raises(ValueError, match="a pair's"):
        fabric.nics("cable", 4, 1)
    with pytest.raises(SystemExit, match="--fabric cable: a pair's one cable"):
        labmain.up(4, 1, "cable")


def test_every_heads_api_has_a_loopback_port_of_its_own() -> None:
    hosts = labmain.host_records(4, "cable", 2)
    assert labmain.api_forward_ports(hosts) == {"lab-head": 28000, "lab-head2": 28001}
    assert labmain.forward_specs(hosts) == [
        "2221=172.30.1.11:22", "2222=172.30.1.12:22", "2223=172.30.1.13:22",
        "2224=172.30.1.14:22", "28000=172.30.1.11:8000", "28001=172.30.1.13:8000",
    ]  # fmt: skip
    # today's lab: the same forwards as ever
    assert labmain.forward_specs(labmain.host_records(2, "cable")) == [
        "2221=172.30.1.11:22", "2222=172.30.1.12:22", "28000=172.30.1.11:8000",
    ]  # fmt: skip


def test_qemu_gets_pair_bs_head_the_pair_labs_nics_on_its_own_taps(monkeypatch, tmp_path) -> None:
    host = labmain.host_records(4, "cable", 2)[2]
    monkeypatch.setattr(labmain.vm, "STATE_DIR", tmp_path)
    spawned: list[list[str]] = []

    def spawn(argv: list[str], *args: Any, **kwargs: Any) -> int:
        spawned.append(list(argv))
        return 1

    monkeypatch.setattr(labmain.vm.subprocess, "run", lambda *a, **k: None)
    monkeypatch.setattr(labmain.vm.net, "spawn", spawn)
    labmain.vm.start(host, tmp_path, "ssh-ed25519 AAAA key", smp=1)
    argv = spawned[0]
    assert [d.rpartition("addr=")[2] for d in devices(argv)] == ["0x07", "0x08", "0x09", "0x0c"]
    assert "tap,id=nf8,ifname=g3p1f0,script=no,downscript=no" in argv
    assert "tap,id=nfc,ifname=g3p1f1,script=no,downscript=no" in argv
    append = argv[argv.index("-append") + 1].split()
    assert "sparkrig.rxe=rocep1s0f1:enp1s0f1np1,roceP2p1s0f1:enP2p1s0f1np1" in append
    assert "sparkrig.host=lab-head2" in append and "sparkrig.idx=3" in append
    # today's pair lab's head gets the same devices as ever
    todays = devices(qemu_argv(monkeypatch, tmp_path, "cable", 2, 1))
    assert [d.rpartition("addr=")[2] for d in todays] == ["0x07", "0x08", "0x09", "0x0c"]


def lab_state(layout: str, n: int, pairs: int = 0, **extra: Any) -> dict[str, Any]:
    """A `lab up` state as the inventory reads it: the hosts `lab up` records, the forwards."""
    state = state_json(**extra)
    hosts = labmain.host_records(n, layout, pairs)
    state["hosts"] = hosts
    state["api_forward_ports"] = labmain.api_forward_ports(hosts)
    if pairs:
        state["pairs"] = pairs
    return state


def load_inventory(tmp_path: Path, state: dict[str, Any]) -> dict[str, Any]:
    """lab/inventory.py as pyinfra loads it over a temporary .lab/state.json: its public names
    (pyinfra's groups: every module-level list without a leading underscore)."""
    (tmp_path / "lab").mkdir(parents=True)
    shutil.copy(REPO / "lab" / "inventory.py", tmp_path / "lab" / "inventory.py")
    (tmp_path / ".lab").mkdir()
    (tmp_path / ".lab" / "state.json").write_text(json.dumps(state))
    names = runpy.run_path(str(tmp_path / "lab" / "inventory.py"))
    return {k: v for k, v in names.items() if not k.startswith("_") and isinstance(v, list)}


def hand_state(layout: str, n: int, **extra: Any) -> dict[str, Any]:
    """A pair-less lab's state written out by hand (not by the code under test), as `lab up`
    wrote it before pairs: the golden inventories below were taken from it."""
    state = state_json(**extra)
    proto = state["hosts"][0]
    state["hosts"] = []
    for i in range(1, n + 1):
        nics = fabric.nics(layout, n, i)
        state["hosts"].append({
            **proto, "name": "lab-head" if i == 1 else f"lab-worker{i - 1}",
            "role": "head" if i == 1 else "worker", "index": i, "ssh_port": 2220 + i,
            "mgmt_address": f"172.30.1.{10 + i}", "fabric_layout": layout, "lab_hosts": n,
            "fabric_interface": nics[0].netdev, "roce_device": nics[0].rdma,
            "fabric_address": fabric.first_address(layout, n, i),
            "uplink_addresses": {"enP7s7": f"172.30.1.{10 + i}", "enP9s9": f"172.30.2.{10 + i}"},
        })  # fmt: skip
    return state


PINS = stack_pins(IMAGES, repos(), repos()["vllm-nvfp4"])
# sha256 (16 hex) of repr() of lab/inventory.py's groups over each canned state, taken with the
# inventory before pairs (e73c4b2): a lab without pairs must keep its inventory byte for byte.
# A deliberate change to the lab's inventory updates these (the failure prints the new one).
GOLDEN = {
    "before the stacks, no API forward": (lambda: {**state_json(), "api_forward_port": None},
                                         "1d2cc6b6fe73ac69"),
    "stacks, hosts without a layout": (lambda: state_json(stack_pins=PINS, stack_images=IMAGES),
                                       "00198391495e907e"),
    "cable, 2 guests": (lambda: hand_state("cable", 2, stack_pins=PINS, stack_images=IMAGES),
                        "092698d985ef6b5e"),
    "single, 3 guests": (lambda: hand_state("single", 3, stack_pins=PINS), "47faaeb3b4447211"),
    "ports, 2 guests": (lambda: hand_state("ports", 2, stack_pins=PINS), "44bf5c689c1560d7"),
    "ports, 4 guests": (lambda: hand_state("ports", 4, stack_pins=PINS), "bec9f6dd8b345286"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(GOLDEN))
def test_without_pairs_the_inventory_is_byte_for_byte_todays(tmp_path, case) -> None:
    make, want = GOLDEN[case]
    state = make()
    if state.get("api_forward_port") is None:
        del state["api_forward_port"]
    groups = load_inventory(tmp_path / "today", state)
    rendered = repr(groups)
    assert hashlib.sha256(rendered.encode()).hexdigest()[:16] == want, rendered
    assert set(groups) == {"head", "worker"}
    # and `lab up` as it is now writes that state's hosts (and the forwards' map) the same way
    if case.startswith(("cable", "single", "ports")):
        layout, n = case.split(", ")[0], int(case.split(", ")[1][0])
        now = {**state, "hosts": labmain.host_records(n, layout)}
        now["api_forward_ports"] = labmain.api_forward_ports(now["hosts"])
        assert repr(load_inventory(tmp_path / "now", now)) == rendered


def pairs_inventory(tmp_path: Path) -> dict[str, Any]:
    return load_inventory(tmp_path, lab_state("cable", 4, 2, stack_pins=PINS, stack_images=IMAGES))


def test_with_pairs_every_host_names_its_pair_and_every_head_its_lan_address_and_api(
    tmp_path,
) -> None:
    groups = pairs_inventory(tmp_path / "pairs")
    assert set(groups) == {"head", "worker", "pair_a", "pair_b"}
    assert [n for n, _ in groups["head"]] == ["lab-head", "lab-head2"]
    assert [n for n, _ in groups["worker"]] == ["lab-worker1", "lab-worker2"]
    assert [n for n, _ in groups["pair_a"]] == ["lab-head", "lab-worker1"]
    assert [n for n, _ in groups["pair_b"]] == ["lab-head2", "lab-worker2"]
    hosts = dict(groups["head"] + groups["worker"])
    assert {n: d["pair"] for n, d in hosts.items()} == {n: p for n, _, p in PAIR_NAMES}
    assert hosts["lab-head"]["lan_address"] == "172.30.1.11"
    assert hosts["lab-head2"]["lan_address"] == "172.30.1.13"
    assert hosts["lab-head"]["api_url"] == "https://127.0.0.1:28000"
    assert hosts["lab-head2"]["api_url"] == "https://127.0.0.1:28001"
    assert hosts["lab-head2"]["api_tls_names"] == ["172.30.1.13", "172.30.2.13"]
    for worker in ("lab-worker1", "lab-worker2"):
        assert not {"lan_address", "api_url", "api_tls_names"} & set(hosts[worker])
    assert hosts["lab-head2"]["fabric_address"] == "10.202.0.1/24"
    assert hosts["lab-worker2"]["fabric_address"] == "10.202.0.2/24"
    # pair_a is today's pair lab's inventory, plus the pair's name and the head's LAN address
    today = load_inventory(
        tmp_path / "today", lab_state("cable", 2, stack_pins=PINS, stack_images=IMAGES)
    )
    todays = dict(today["head"] + today["worker"])
    for name, extra in (("lab-head", {"pair", "lan_address"}), ("lab-worker1", {"pair"})):
        assert {k: v for k, v in hosts[name].items() if k not in extra} == todays[name]


def test_the_deploy_reads_two_pairs_each_on_both_functions_of_its_own_subnets(tmp_path) -> None:
    groups = pairs_inventory(tmp_path)
    base = {**knob_defaults(), "base_image": "registry.example/v@sha256:" + "ab" * 32}
    view = InventoryView(
        {g: [(n, {**base, **d}) for n, d in groups[g]] for g in ("head", "worker")}
    )
    settings = build(view)
    assert {n: s.pair for n, s in settings.items()} == {n: p for n, _, p in PAIR_NAMES}
    for name, s in settings.items():
        assert [h.name for h in s.pair_heads] == ["lab-head", "lab-head2"], name
        assert [str(h.lan_address) for h in s.pair_heads] == ["172.30.1.11", "172.30.1.13"]
        assert [r.name for r in s.ranks] == [n for n, _, p in PAIR_NAMES if p == s.pair]
    rank = settings["lab-worker2"].fabric_rank
    assert rank is not None
    assert [(i.netdev, str(i.address)) for i in rank.ifaces] == [
        ("enp1s0f1np1", "10.202.0.2/24"),
        ("enP2p1s0f1np1", "10.202.1.2/24"),
    ]


PYINFRA_LIMIT = """
import sys
from pyinfra.api import State
from pyinfra.context import ctx_state
from pyinfra_cli.inventory import make_inventory_from_files
with ctx_state.use(State()):
    inv = make_inventory_from_files(sys.argv[1], cwd=sys.argv[2])
print([h.name for h in inv.get_group("pair_b")], inv.get_host("lab-head2").data.pair,
      inv.get_host("lab-head2").data.api_url)
"""


def test_pyinfra_sees_one_group_per_pair_for_limit(tmp_path) -> None:
    """pyinfra's own inventory loader (in a process of its own: it gevent-patches) over the
    pairs inventory: the group `--limit pair_b` selects, the data merged per host."""
    pairs_inventory(tmp_path)
    out = subprocess.run(
        [sys.executable, "-c", PYINFRA_LIMIT, str(tmp_path / "lab/inventory.py"), str(tmp_path)],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    assert out.stdout.split("\n")[0] == (
        "['lab-head2', 'lab-worker2'] pair_b https://127.0.0.1:28001"
    ), out.stdout + out.stderr


def test_status_prints_each_hosts_pair(monkeypatch, capsys) -> None:
    state = lab_state("cable", 4, 2, namespace="sparkrig-lab", internet_address="203.0.113.1",
                      status="up", pids={})  # fmt: skip
    monkeypatch.setattr(labmain, "load_state", lambda: state)
    monkeypatch.setattr(labmain, "alive", lambda pid: True)
    monkeypatch.setattr(labmain.vm, "ssh_ok", lambda state, host: True)
    monkeypatch.setattr(labmain.net, "shaping", lambda: {})
    labmain.status()
    lines = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()}
    assert {n: lines[n][2] for n, _, _ in PAIR_NAMES} == {n: p for n, _, p in PAIR_NAMES}
    # today's lab prints as ever: no pair column
    monkeypatch.setattr(labmain, "load_state", lambda: {**state, "hosts": state["hosts"][:2]})
    for h in state["hosts"][:2]:
        del h["pair"]
    labmain.status()
    lines = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()}
    assert lines["lab-head"][2] == "ssh"


def test_a_pair_labs_guests_know_their_pair_and_pair_bs_worker_runs_rank_1() -> None:
    state = lab_state("cable", 4, 2)
    got = {g.name: (g.pair, g.container) for g in guests(state)}
    assert got == {
        "lab-head": ("pair_a", "sparkrig-rank0"), "lab-worker1": ("pair_a", "sparkrig-rank1"),
        "lab-head2": ("pair_b", "sparkrig-rank0"), "lab-worker2": ("pair_b", "sparkrig-rank1"),
    }  # fmt: skip
    # without pairs lab-workerN is rank N, as ever
    ring = guests(lab_state("ports", 3))
    assert [g.container for g in ring] == ["sparkrig-rank0", "sparkrig-rank1", "sparkrig-rank2"]
