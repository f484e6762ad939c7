"""fabric_layout "auto", the default: a pair of today's inventory (fabric_interface,
fabric_address, roce_device) serves on both functions of its cable, the primary keeping its
typed address and the twin taking the buddy subnet; three ranks and more stay on one subnet."""

from __future__ import annotations

import pytest
from pyinfra.api.exceptions import DeployError

from sparkrig import fabricenv, topology
from sparkrig.config.inventory import InventoryView, build
from sparkrig.fabric import env_context, env_template
from sparkrig.render import render
from tests.unit.conftest import cluster


def default_cluster(n: int = 2, **knobs) -> InventoryView:
    """``cluster(n)`` with fabric_layout left to group_data/all.py's default."""
    return cluster(n, fabric_layout="auto", **knobs)


def env_of(s) -> dict[str, str]:
    text = render(env_template(s), **env_context(s), hca="rocep1s0f1", gid_index="3")
    return dict(line.split("=", 1) for line in text.splitlines() if line and line[0] != "#")


def edit(view: InventoryView, index: int, **data) -> InventoryView:
    group, at = ("head", 0) if index == 0 else ("worker", index - 1)
    name, old = view.groups[group][at]
    view.groups[group][at] = (name, {**old, **data})
    return view


def test_group_data_defaults_to_auto(defaults):
    assert defaults["fabric_layout"] == "auto"


def test_a_pair_of_todays_inventory_serves_on_both_functions():
    settings = build(default_cluster(2))
    head, worker = settings["spark-0"], settings["spark-1"]
    assert head.layout == "ports" and worker.fabric_rank is not None
    # the primary keeps the inventory's address; the twin takes the buddy /24, same host number
    assert [(i.netdev, i.rdma, str(i.address)) for i in worker.fabric_rank.ifaces] == [
        ("enp1s0f1np1", "rocep1s0f1", "192.168.100.11/24"),
        ("enP2p1s0f1np1", "roceP2p1s0f1", "192.168.101.11/24"),
    ]
    assert worker.me.ip == "192.168.100.11" and head.me.ip == "192.168.100.10"
    # what the lab and its checks compute for the twin is the plan's
    twin = worker.fabric_rank.ifaces[1].address
    assert topology.buddy_address(worker.me.fabric_address) == twin
    env = env_of(worker)
    assert env["NCCL_IB_HCA"] == "=rocep1s0f1:1,roceP2p1s0f1:1"
    # one range holds both subnets, none of fabric_cidr's (198.18.0.0/20) is taken
    assert env["NCCL_IB_ADDR_RANGE"] == "192.168.100.0/23"
    assert head.busbw_floor_gbs == head.knobs.fabric_ports_busbw_min_gbs == 16.0


def test_a_pair_without_typed_addresses_takes_fabric_cidrs():
    view = default_cluster(2)
    for i in (0, 1):
        edit(view, i, fabric_address=None)
    worker = build(view)["spark-1"]
    assert worker.fabric_rank is not None
    assert [str(i.address) for i in worker.fabric_rank.ifaces] == [
        "198.18.0.2/24",
        "198.18.1.2/24",
    ]
    assert env_of(worker)["NCCL_IB_ADDR_RANGE"] == "198.18.0.0/20"


def test_a_roce_device_given_wins_over_dgx_os_name():
    worker = build(edit(default_cluster(2), 1, roce_device="mlx5_0"))["spark-1"]
    assert worker.fabric_rank is not None
    assert worker.fabric_rank.rdma_devices == ("mlx5_0", "roceP2p1s0f1")


def test_three_ranks_stay_on_one_subnet():
    s = build(default_cluster(4))["spark-3"]
    assert s.layout == "single" and s.fabric_plan is None
    assert s.busbw_floor_gbs == s.knobs.fabric_busbw_min_gbs


def test_single_holds_a_pair_to_one_function():
    s = build(cluster(2, fabric_layout="single"))["spark-1"]
    assert s.layout == "single" and s.fabric_plan is None
    assert env_of(s)["NCCL_IB_HCA"] == "rocep1s0f1"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda v: edit(v, 1, fabric_address=None),
            "spark-1: fabric_address: missing, but spark-0 has one: a pair on both functions "
            "types both primary addresses or neither",
        ),
        (
            lambda v: edit(v, 1, fabric_address="192.168.7.11/24"),
            "spark-1: fabric_address: rank 1's 192.168.7.11/24 is not on rank 0's subnet "
            "192.168.100.0/24",
        ),
        (
            lambda v: [edit(v, i, fabric_address=f"10.0.0.{i + 1}/1") for i in (0, 1)],
            "needs a prefix of /2 to /30 (the twin takes its buddy)",
        ),
        (
            lambda v: [edit(v, i, fabric_interface="eth1") for i in (0, 1)],
            "fabric_interface eth1 is the primary netdev of no port: name its port in "
            "fabric_ports (a DGX OS name, enp1s0f<i>np<i>, needs none), or set fabric_layout = "
            "'single' to serve on this one netdev",
        ),
    ],
)
def test_a_pair_the_default_cannot_plan_is_refused_naming_the_fix(change, message):
    view = default_cluster(2)
    change(view)
    with pytest.raises(DeployError) as err:
        build(view)
    assert message in str(err.value)


def test_each_function_alone_names_one_device_and_bootstraps_as_the_pair():
    worker = build(default_cluster(2))["spark-1"]
    plan = worker.fabric_plan
    assert plan is not None
    pair = dict(fabricenv.fabric_env(plan, 1))
    for function, rdma in ((topology.PRIMARY, "rocep1s0f1"), (topology.TWIN, "roceP2p1s0f1")):
        env = dict(fabricenv.function_env(plan, 1, function))
        assert env["NCCL_IB_HCA"] == f"={rdma}:1"
        assert env["NCCL_SOCKET_IFNAME"] == pair["NCCL_SOCKET_IFNAME"] == "enp1s0f1np1"
        assert env["NCCL_IB_ADDR_RANGE"] == pair["NCCL_IB_ADDR_RANGE"]
