"""The lab's fabric (lab/fabric.py, `lab up --fabric ports`): today's one-bridge lab unchanged, a
pair's two functions on two segments, and a triangle and a ring of four cabled as the rule says
(port 0 of guest i to port 1 of guest i+1, the last back to the head), each cable's function class
its own segment between two guests only. The qemu argv each guest gets (lab/vm.py), with its
PCI slots, and the Soft-RoCE devices its kernel command line asks for."""

from __future__ import annotations

from pathlib import Path

import pytest

from lab import fabric, vm
from sparkrig import topology
from sparkrig.config.inventory import build
from tests.unit.test_rings import ports_cluster


def test_the_single_layout_is_todays_lab() -> None:
    for idx in (1, 2, 3):
        (nic,) = fabric.nics("single", 3, idx)
        assert (nic.netdev, nic.rdma, nic.slot, nic.tap, nic.bridge) == (
            "enp1s0f1np1", "rxe0", 0x08, f"g{idx}f", "br-fab"
        )  # fmt: skip
        assert fabric.rxe_arg("single", 3, idx) == ""
    assert fabric.bridges("single", 3) == ["br-fab"]


def segments(n: int) -> dict[str, list[tuple[int, str]]]:
    """bridge -> the (guest index, netdev) of every NIC on it."""
    out: dict[str, list[tuple[int, str]]] = {}
    for idx in range(1, n + 1):
        for nic in fabric.nics("ports", n, idx):
            out.setdefault(nic.bridge, []).append((idx, nic.netdev))
    return out


def port_function(netdev: str) -> tuple[int, int]:
    return next(k for k, v in fabric.NETDEVS.items() if v == netdev)


def test_a_pair_has_both_functions_of_port_1_each_on_its_own_segment() -> None:
    assert segments(2) == {
        "br-c0f0": [(1, "enp1s0f1np1"), (2, "enp1s0f1np1")],
        "br-c0f1": [(1, "enP2p1s0f1np1"), (2, "enP2p1s0f1np1")],
    }


@pytest.mark.parametrize("n", [3, 4])
def test_a_ring_is_cabled_port_0_to_the_next_guests_port_1_one_segment_per_function(n) -> None:
    segs = segments(n)
    assert len(segs) == 2 * n  # n cables, two function classes each
    for bridge, ends in segs.items():
        assert len(ends) == 2, (bridge, ends)  # two guests only
        (ia, da), (ib, db) = sorted(ends, key=lambda e: port_function(e[1])[0])
        (pa, fa), (pb, fb) = port_function(da), port_function(db)
        assert (pa, pb) == (0, 1) and fa == fb  # never like-port; one function class
        assert ib == ia % n + 1  # port 0 of guest i to port 1 of guest i+1, the last to the head
    for idx in range(1, n + 1):
        mine = fabric.nics("ports", n, idx)
        assert sorted(m.netdev for m in mine) == sorted(fabric.NETDEVS.values())
        assert len({m.slot for m in mine}) == 4 and len({m.tap for m in mine}) == 4
        assert all(len(m.tap) <= 15 for m in mine)  # IFNAMSIZ


@pytest.mark.parametrize("n", [2, 3, 4])
def test_the_guests_rdma_devices_are_dgx_os_names_the_deploy_derives(n) -> None:
    for idx in range(1, n + 1):
        for nic in fabric.nics("ports", n, idx):
            port = topology.dgx_os_port(nic.netdev.replace("enP2p1", "enp1"))
            assert port is not None
            derived = port.primary if nic.netdev.startswith("enp") else port.twin
            assert (derived.netdev, derived.rdma) == (nic.netdev, nic.rdma)
        word = fabric.rxe_arg("ports", n, idx)
        assert word.startswith("sparkrig.rxe=") and " " not in word
        pairs = dict(p.split(":") for p in word.removeprefix("sparkrig.rxe=").split(","))
        assert pairs == {nic.rdma: nic.netdev for nic in fabric.nics("ports", n, idx)}


@pytest.mark.parametrize("n", [2, 3, 4])
def test_the_first_address_the_lab_records_is_the_deploys(n) -> None:
    ring = {"stack": "tensorfold-ring", "base_image": None, "profile": "single"} if n > 2 else {}
    settings = build(ports_cluster(n, **ring))
    for rank, s in enumerate(sorted(settings.values(), key=lambda s: s.me.rank)):
        assert fabric.first_address("ports", n, rank + 1) == str(s.me.fabric_address)
    assert fabric.first_address("single", 2, 2) == "10.200.0.2/24"


def qemu_argv(monkeypatch, tmp_path: Path, layout: str, n: int, idx: int) -> list[str]:
    """lab/vm.py's qemu argv for guest ``idx`` (qemu-img and the spawn caught)."""
    spawned: list[list[str]] = []
    monkeypatch.setattr(vm.subprocess, "run", lambda *a, **k: None)
    monkeypatch.setattr(vm.net, "spawn", lambda argv, *a, **k: spawned.append(list(argv)) or 1)
    host = {
        "name": f"g{idx}",
        "index": idx,
        "overlay": str(tmp_path / "o.qcow2"),
        "console_log": str(tmp_path / "c.log"),
        "fabric_layout": layout,
        "lab_hosts": n,
    }
    vm.start(host, tmp_path, "ssh-ed25519 AAAA key", smp=1)
    return spawned[0]


def devices(argv: list[str]) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == "-device"]


def test_qemu_gets_todays_three_nics_in_the_single_layout(monkeypatch, tmp_path) -> None:
    argv = qemu_argv(monkeypatch, tmp_path, "single", 2, 2)
    assert devices(argv) == [
        f"virtio-net-pci,netdev=na,mac={vm.mac(2, 1)},addr=0x07",
        f"virtio-net-pci,netdev=nf8,mac={vm.mac(2, 2)},addr=0x08",
        f"virtio-net-pci,netdev=nb,mac={vm.mac(2, 3)},addr=0x09",
    ]
    assert "tap,id=nf8,ifname=g2f,script=no,downscript=no" in argv
    assert "sparkrig.rxe" not in " ".join(argv)


def test_qemu_gets_both_ports_functions_on_a_ring(monkeypatch, tmp_path) -> None:
    argv = qemu_argv(monkeypatch, tmp_path, "ports", 4, 3)
    slots = [d.rpartition("addr=")[2] for d in devices(argv)]
    assert slots == ["0x07", "0x08", "0x09", "0x0a", "0x0b", "0x0c"]
    assert len({d.split(",mac=")[1].split(",")[0] for d in devices(argv)}) == 6
    append = argv[argv.index("-append") + 1]
    assert fabric.rxe_arg("ports", 4, 3) in append.split()
    for nic in fabric.nics("ports", 4, 3):
        assert f"ifname={nic.tap}," in " ".join(argv)


def test_a_pair_lab_is_cabled_on_both_functions_by_default() -> None:
    assert fabric.default_layout(2) == "cable" and fabric.default_layout(3) == "single"
    for idx in (1, 2):
        assert fabric.nics("cable", 2, idx) == fabric.nics("ports", 2, idx)
        assert fabric.rxe_arg("cable", 2, idx) == fabric.rxe_arg("ports", 2, idx)
        # the inventory's form is today's: the typed address of the single lab
        assert fabric.first_address("cable", 2, idx) == f"10.200.0.{idx}/24"
    with pytest.raises(ValueError, match="a pair's"):
        fabric.nics("cable", 3, 1)


def test_the_cable_labs_inventory_deploys_on_both_functions_by_default(tmp_path) -> None:
    """lab/inventory.py over a `lab up` (cable) state: today's keys, no fabric_layout, and the
    deploy's settings plan the typed primary and its twin; the single lab says "single"."""
    from sparkrig.config.inventory import InventoryView
    from tests.unit.conftest import knob_defaults
    from tests.unit.test_lab_stacks import inventory, state_json

    def hosts_of(layout: str) -> dict[str, dict]:
        state = state_json()
        for i, h in enumerate(state["hosts"], start=1):
            nics = fabric.nics(layout, 2, i)
            h.update(fabric_layout=layout, fabric_interface=nics[0].netdev,
                     fabric_address=fabric.first_address(layout, 2, i), roce_device=nics[0].rdma,
                     fabric_nics=[{"netdev": n.netdev, "rdma": n.rdma} for n in nics])  # fmt: skip
        (tmp_path / layout).mkdir()
        return inventory(tmp_path / layout, state)

    cable = hosts_of("cable")
    assert all(
        "fabric_layout" not in d and d["roce_device"] == "rocep1s0f1" for d in cable.values()
    )
    assert all(d["fabric_layout"] == "single" for d in hosts_of("single").values())
    base = {**knob_defaults(), "base_image": "registry.example/v@sha256:" + "ab" * 32}
    names = list(cable)
    view = InventoryView(
        {
            "head": [(names[0], {**base, **cable[names[0]]})],
            "worker": [(names[1], {**base, **cable[names[1]]})],
        }
    )
    worker = build(view)[names[1]]
    assert worker.fabric_rank is not None
    assert [(i.netdev, str(i.address)) for i in worker.fabric_rank.ifaces] == [
        ("enp1s0f1np1", "10.200.0.2/24"),
        ("enP2p1s0f1np1", "10.200.1.2/24"),
    ]


def test_the_stranger_routes_every_fabric_subnet_of_the_lab() -> None:
    from lab import stranger

    state = {"fabric_subnet": "10.200.0.0/24", "fabric_layout": "cable"}
    assert stranger.fabric_subnets(state) == ["10.200.0.0/24", "10.200.1.0/24"]
    assert stranger.fabric_subnets({**state, "fabric_layout": "single"}) == ["10.200.0.0/24"]
    assert stranger.fabric_subnets({**state, "fabric_layout": "ports"}) == ["198.18.0.0/20"]
