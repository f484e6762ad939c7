"""fabric_layout "ports" (issue 36, docs/rings.md): the inventory's ports validated in settings,
the plan on Settings, and the files it renders (netplan, sysctl.d, the rank env) for 2, 3 and 4
ranks against reviewed golden copies (scripts/update-golden.py rewrites them)."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest
from pyinfra.api.exceptions import DeployError
from sparkhost import rankenv

from sparkrig import fabricenv, firewall, topology
from sparkrig.config.inventory import InventoryView, build
from sparkrig.config.model import Rank, Settings, planned_ranks, resolved_ports
from sparkrig.config.rules import not_applied
from sparkrig.fabric import (
    env_context,
    env_template,
    forwarding_text,
    netplan_text,
    relay_unit_text,
)
from sparkrig.render import render
from sparkrig.serving import rank_unit_context
from sparkrig.topology import LINK_PREFIX
from tests.unit.conftest import cluster

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "rings"


def ports_cluster(n: int = 2, **knobs) -> InventoryView:
    """``cluster(n)`` in fabric_layout "ports": no fabric_address (derived); a pair keeps its
    fabric_interface, a ring names no single interface and gives each rank's LAN address."""
    view = cluster(n, fabric_layout="ports", **knobs)
    drop = {"fabric_address"} | ({"fabric_interface"} if n > 2 else set())
    hosts = [name for group in view.groups.values() for name, _ in group]
    for group in view.groups.values():
        for i, (name, data) in enumerate(group):
            kept = {k: v for k, v in data.items() if k not in drop}
            if n > 2:
                kept["lan_address"] = LAN_ADDRESS.format(10 + hosts.index(name))
            group[i] = (name, kept)
    return view


LAN_ADDRESS = "192.168.1.{}"  # ports_cluster's rank r: .1{r} (the head .10)


def problems(view: InventoryView) -> str:
    with pytest.raises(DeployError) as err:
        build(view)
    return str(err.value)


def edit(view: InventoryView, index: int, **data) -> InventoryView:
    hosts = view.groups["head"] + view.groups["worker"]
    name = hosts[index][0]
    group = "head" if index == 0 else "worker"
    at = index if index == 0 else index - 1
    view.groups[group][at] = (name, {**hosts[index][1], **data})
    return view


def ring_settings(n: int, **knobs) -> dict[str, Settings]:
    """Settings of an n-rank ring in fabric_layout "ports" as ``build`` makes them once the
    inventory is valid, whatever the stack (``build`` refuses vLLM on three ranks), so the
    triangle's files are rendered too."""
    k = build(cluster(2, **knobs))["spark-0"].knobs.model_copy(update={"fabric_layout": "ports"})
    zero = ipaddress.IPv4Interface("0.0.0.0/32")
    ranks = [
        Rank(
            name=f"spark-{i}",
            rank=i,
            fabric_interface=f"enp1s0f{0}np0",
            fabric_address=zero,
            ports=resolved_ports({}, n),
            lan_address=ipaddress.IPv4Address(LAN_ADDRESS.format(10 + i)),
        )
        for i in range(n)
    ]
    ranks = planned_ranks(ranks, k.fabric_cidr)
    return {r.name: Settings(me=r, ranks=tuple(ranks), knobs=k) for r in ranks}


# ---------------------------------------------------------------------------------------------
# settings: the default unchanged, the opt-in validated
# ---------------------------------------------------------------------------------------------


def test_the_single_layout_has_no_plan():
    s = build(cluster(2))["spark-1"]
    assert s.knobs.fabric_layout == "single" and s.fabric_plan is None and s.fabric_rank is None
    assert env_template(s) == "rank.env.j2" and forwarding_text(s) is None


def test_a_pair_in_ports_layout_keeps_its_inventory_and_gets_derived_addresses():
    settings = build(ports_cluster(2))
    head, worker = settings["spark-0"], settings["spark-1"]
    # every phase that speaks over the fabric keeps one address per rank: the primary's
    assert (head.me.fabric_interface, str(head.me.fabric_address)) == (
        "enp1s0f1np1",
        "198.18.0.1/24",
    )
    assert worker.me.ip == "198.18.0.2" and str(worker.fabric_network) == "198.18.0.0/24"
    assert worker.fabric_rank is not None
    assert worker.fabric_rank.rdma_devices == ("rocep1s0f1", "roceP2p1s0f1")
    assert env_template(worker) == "rank-ports.env.j2"


def test_fabric_ports_names_what_dgx_os_names_cannot_derive():
    port = {"netdev": "eth4", "roce_device": "mlx5_0", "twin_netdev": "eth5",
            "twin_roce_device": "mlx5_1"}  # fmt: skip
    view = ports_cluster(2)
    for i in (0, 1):
        edit(view, i, fabric_interface="eth4", fabric_ports={1: port})
    s = build(view)["spark-0"]
    assert s.fabric_rank is not None
    assert s.fabric_rank.netdevs == ("eth4", "eth5")
    assert s.fabric_rank.rdma_devices == ("mlx5_0", "mlx5_1")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda v: edit(v, 1, fabric_address="198.18.0.9/24"),
            "spark-0: fabric_address: missing, but spark-1 has one: a pair on both functions "
            "types both primary addresses or neither (then fabric_cidr's)",
        ),
        (
            lambda v: edit(v, 1, fabric_interface="eth4"),
            "spark-1: fabric_ports: fabric_interface eth4 is the primary netdev of no port",
        ),
        (
            lambda v: edit(v, 1, fabric_interface="eth4", fabric_ports={1: {"netdev": "eth4"}}),
            "spark-1: fabric_ports: port 1: eth4 is no DGX OS name "
            "(enp<bus>s<slot>f<fn>np<port>): name roce_device, twin_netdev, twin_roce_device too",
        ),
        (
            lambda v: edit(v, 1, fabric_ports={2: {"netdev": "enp1s0f1np1"}}),
            "spark-1: fabric_ports: port 2: a Spark has ports 0 and 1",
        ),
        (
            lambda v: edit(v, 1, fabric_ports={1: {"netdev": "enp1s0f1np1", "twin": "x"}}),
            "spark-1: fabric_ports: port 1: twin: Extra inputs are not permitted",
        ),
        (
            lambda v: edit(v, 1, fabric_ports=["enp1s0f1np1"]),
            "spark-1: fabric_ports: must map a port index",
        ),
        (
            lambda v: [edit(v, i, fabric_cidr="198.18.0.0/25") for i in (0, 1)],
            "fabric_cidr: Value error, 198.18.0.0/25 is smaller than one /24",
        ),
        (
            lambda v: [edit(v, i, fabric_cidr="198.18.0.1/21") for i in (0, 1)],
            "every host: fabric_cidr: not an IPv4 network",
        ),
    ],
)
def test_a_bad_ports_inventory_is_refused_naming_host_and_key(change, message):
    view = ports_cluster(2)
    change(view)
    assert message.replace("Value error, ", "") in problems(view)


def test_fabric_ports_without_the_ports_layout_is_refused():
    view = edit(cluster(2), 1, fabric_ports={1: {"netdev": "enp1s0f1np1"}})
    assert "spark-1: fabric_ports: set, but fabric_layout is 'single'" in problems(view)


def test_a_ring_is_planned_and_the_deploy_refuses_a_vllm_stack_on_it():
    settings = build(ports_cluster(4))
    plan = settings["spark-2"].fabric_plan
    assert plan is not None and plan.relays and settings["spark-2"].me.ip == "198.18.4.1"
    why = not_applied(build(ports_cluster(4)))
    assert why and why.startswith("fabric_layout 'ports' with 4 ranks: stack 'vllm-nvfp4'")
    assert "ncclTransportTreeConnect" in why and "use stack 'tensorfold-ring'" in why
    assert not_applied(build(ports_cluster(2))) is None  # a pair's two functions are applied
    assert not_applied(build(cluster(2))) is None
    text = problems(ports_cluster(4, fabric_cidr="198.18.0.0/22"))
    assert (
        "inventory: fabric_layout 'ports': fabric_cidr 198.18.0.0/22 holds 4 /24; 4 ranks" in text
    )
    text = problems(edit(ports_cluster(4), 2, fabric_interface="enp1s0f1np1"))
    assert "spark-2: fabric_interface: a ring of 4 uses both QSFP ports of every rank" in text


@pytest.mark.parametrize("layout", ["single", "ports"])
def test_vllm_on_three_sparks_is_refused_with_the_heads(layout):
    view = cluster(3) if layout == "single" else ports_cluster(3)
    text = problems(view)
    assert (
        "spark-0: stack: 'vllm-nvfp4' is vLLM tensor parallel over every rank, and "
        "GLM-5.3-Flash's 64 attention heads are not divisible by 3"
    ) in text
    assert text.count("attention heads") == 1  # once, not per host
    assert build(cluster(4))["spark-3"].knobs.stack == "vllm-nvfp4"  # 4 divide 64


# ---------------------------------------------------------------------------------------------
# the rendered files
# ---------------------------------------------------------------------------------------------


def owned_files(s: Settings) -> dict[str, str]:
    ctx = env_context(s)
    files = {
        "60-sparkrig-fabric.yaml": netplan_text(s),
        "rank.env": render(env_template(s), **ctx, hca="rocep1s0f1", gid_index="3"),
    }
    if (sysctl := forwarding_text(s)) is not None:
        files["91-sparkrig-fabric.conf"] = sysctl
    if (relay := relay_unit_text(s)) is not None:
        files["sparkrig-relay.service"] = relay
    files["firewall.nft"] = firewall.ruleset(s)
    if s.nnodes == 2:  # the pair's engine is applied: its rank unit too
        unit = rank_unit_context(s, "registry.example/vllm@sha256:" + "ab" * 32, "w")
        files[f"{s.unit_name}.service"] = render("sparkrig-rank.service.j2", **unit)
    return files


def rendered(nodes: int) -> dict[Path, str]:
    """Every fabric file of an n-rank cluster in fabric_layout "ports", keyed by golden path."""
    settings = build(ports_cluster(2)) if nodes == 2 else ring_settings(nodes)
    return {
        GOLDEN / f"{nodes}nodes" / name / filename: text
        for name, s in settings.items()
        for filename, text in owned_files(s).items()
    }


@pytest.mark.parametrize("nodes", [2, 3, 4])
def test_rendered_ring_files_match_golden(nodes):
    files = rendered(nodes)
    on_disk = {p for p in (GOLDEN / f"{nodes}nodes").rglob("*") if p.is_file()}
    assert on_disk == set(files), "golden files differ in number; scripts/update-golden.py"
    for path, text in files.items():
        assert text == path.read_text(), f"{path} differs; scripts/update-golden.py, then review"


def env_of(s: Settings) -> dict[str, str]:
    text = render(env_template(s), **env_context(s), hca="rocep1s0f1", gid_index="3")
    pairs = [line.split("=", 1) for line in text.splitlines() if line and line[0] != "#"]
    return dict(pairs)


def test_the_pairs_env_names_both_functions_and_no_gid_index():
    env = env_of(build(ports_cluster(2))["spark-1"])
    assert env["NCCL_IB_HCA"] == "=rocep1s0f1:1,roceP2p1s0f1:1"
    assert "NCCL_IB_GID_INDEX" not in env  # by value, per device (NCCL picks it)
    assert env["NCCL_IB_ADDR_RANGE"] == "198.18.0.0/20"
    assert env["NCCL_SOCKET_IFNAME"] == "enp1s0f1np1" and env["VLLM_HOST_IP"] == "198.18.0.2"
    assert env["NCCL_IB_MERGE_NICS"] == "0" and env["NCCL_CROSS_NIC"] == "0"
    assert "NCCL_IB_SUBNET_AWARE_ROUTING" not in env and "NCCL_ALGO" not in env


def test_the_start_gate_reads_every_function_of_the_pairs_env_in_the_plans_order():
    s = build(ports_cluster(2))["spark-1"]
    view = rankenv.rank_env(env_of(s))  # what sparkhost prep checks (files/sparkhost/rankenv.py)
    ifaces = s.fabric_rank.ifaces
    assert view.ports and view.gid_index is None
    assert view.netdevs == s.fabric_rank.netdevs == tuple(i.netdev for i in ifaces)
    assert view.roce_devices == tuple(i.rdma for i in ifaces)
    assert view.addresses == tuple(str(i.address.ip) for i in ifaces)
    assert (view.mtu, view.roce_port) == (s.knobs.fabric_mtu, s.knobs.roce_port)


def test_the_triangles_env_is_tensorfolds_n_rank_set_without_the_ring_graphs():
    env = env_of(ring_settings(3)["spark-2"])
    assert env["NCCL_IB_HCA"] == "=rocep1s0f0:1,roceP2p1s0f0:1,rocep1s0f1:1,roceP2p1s0f1:1"
    assert env["TF_ROCE_HCA"] == "rocep1s0f0,roceP2p1s0f0,rocep1s0f1,roceP2p1s0f1"
    for key, value in (
        ("NCCL_CROSS_NIC", "1"),
        ("NCCL_IB_SUBNET_AWARE_ROUTING", "1"),
        ("NCCL_P2P_DISABLE", "1"),
        ("NCCL_SHM_DISABLE", "1"),
        ("NCCL_MIN_NCHANNELS", "4"),
        ("NCCL_MAX_NCHANNELS", "4"),
    ):
        assert env[key] == value, key
    assert "NCCL_ALGO" not in env and "NCCL_GRAPH_FILE" not in env and "TF_NCCL_RING" not in env
    # no fabric address reaches every rank: bootstrap over the LAN, never a fabric netdev
    assert env["NCCL_SOCKET_IFNAME"].startswith("^lo,docker,veth,enp1s0f0np0")
    assert "GLOO_SOCKET_IFNAME" not in env and "VLLM_HOST_IP" not in env


def test_the_ring_of_fours_env_adds_ring_only_nccl_and_the_graph_files():
    env = env_of(ring_settings(4, nccl_env={})["spark-1"])
    assert env["NCCL_ALGO"] == "Ring" and env["NCCL_IB_MERGE_NICS"] == "0"
    assert env["NCCL_GRAPH_FILE"] == "/nccl-graph.xml"
    assert env["TF_NCCL_RING_GRAPHS"] == "/nccl-link-prev.xml,/nccl-link-next.xml"
    assert env["TF_NCCL_RING"] == "1" and env["TF_ROCE_RING"] == "1"
    assert env["NCCL_IB_SUBNET_PREFIX_LEN"] == str(LINK_PREFIX)


def test_an_uplink_makes_the_bootstrap_interface_exact():
    plan = topology.derive([resolved_ports({}, 3)] * 3, "198.18.0.0/21")
    env = dict(fabricenv.fabric_env(plan, 0, uplinks=["enP7s7"]))
    assert env["NCCL_SOCKET_IFNAME"] == "=enP7s7" and env["GLOO_SOCKET_IFNAME"] == "enP7s7"


def test_only_a_relaying_ring_gets_forwarding_and_rp_filter():
    assert forwarding_text(build(ports_cluster(2))["spark-0"]) is None
    assert forwarding_text(ring_settings(3)["spark-0"]) is None
    text = forwarding_text(ring_settings(4)["spark-0"])
    assert text is not None
    lines = [line for line in text.splitlines() if line and line[0] != "#"]
    assert lines == [
        f"net.ipv4.conf.{dev}.{key} = {value}"
        for dev in ("enp1s0f0np0", "enP2p1s0f0np0", "enp1s0f1np1", "enP2p1s0f1np1")
        for key, value in (("forwarding", 1), ("rp_filter", 0))
    ]
    assert "ip_forward" not in "\n".join(lines)


def test_the_ring_netplan_sets_mtu_9000_on_every_netdev_and_the_routes():
    import yaml

    doc = yaml.safe_load(netplan_text(ring_settings(4)["spark-0"]))
    eths = doc["network"]["ethernets"]
    assert set(eths) == {"enp1s0f0np0", "enP2p1s0f0np0", "enp1s0f1np1", "enP2p1s0f1np1"}
    assert all(e["mtu"] == 9000 and e["renderer"] == "NetworkManager" for e in eths.values())
    assert eths["enp1s0f1np1"]["addresses"] == ["198.18.6.2/24"]
    assert eths["enp1s0f1np1"]["routes"] == [{"to": "198.18.4.0/24", "via": "198.18.6.1"}]
    assert eths["enp1s0f0np0"]["routes"] == [{"to": "198.18.2.0/24", "via": "198.18.0.2"}]
    tri = yaml.safe_load(netplan_text(ring_settings(3)["spark-0"]))["network"]["ethernets"]
    assert len(tri) == 4 and not any("routes" in e for e in tri.values())


def test_a_name_given_in_fabric_ports_wins_over_dgx_os_s():
    view = ports_cluster(2)
    for i in (0, 1):
        edit(view, i, fabric_ports={1: {"netdev": "enp1s0f1np1", "roce_device": "mlx5_1"}})
    part = build(view)["spark-1"].fabric_rank
    assert part is not None and part.rdma_devices == ("mlx5_1", "roceP2p1s0f1")


def test_fabric_link_silent_is_refuse_by_default_and_takes_omit_only():
    assert build(cluster(2))["spark-0"].knobs.fabric_link_silent == "refuse"
    assert (
        build(cluster(2, fabric_link_silent="omit"))["spark-1"].knobs.fabric_link_silent == "omit"
    )
    assert "fabric_link_silent: Input should be 'refuse' or 'omit'" in problems(
        cluster(2, fabric_link_silent="drop")
    )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda v: edit(v, 2, lan_address=None),
            "spark-2: lan_address: missing: a ring of 3 meets at the head's LAN address",
        ),
        (
            lambda v: edit(v, 2, lan_address="192.168.1.10"),
            "spark-2: lan_address: 192.168.1.10 is already used by spark-0",
        ),
        (
            lambda v: edit(v, 1, lan_address="198.18.7.9"),
            "spark-1: lan_address: 198.18.7.9 is in fabric_cidr 198.18.0.0/20",
        ),
        (lambda v: edit(v, 1, lan_address="192.168.1"), "spark-1: lan_address:"),
    ],
)
def test_a_ring_without_a_good_lan_address_per_rank_is_refused(change, message):
    assert message in problems(change(ports_cluster(3, stack="tensorfold-ring", base_image=None,
                                                    profile="single")))  # fmt: skip


def test_a_pair_and_one_subnet_keep_one_address_per_rank_and_need_no_lan_address():
    for view in (ports_cluster(2), cluster(2)):
        s = build(view)["spark-0"]
        worker = s.ranks[1]
        assert not s.relayed and s.me.lan_address is None
        assert s.listen_ips == (s.me.ip,) and s.dial(worker) == worker.ip
        assert s.helper_device == s.me.fabric_interface and s.rendezvous_ip == s.me.ip
