"""A rank's fabric environment from the plan (NCCL and TensorFold; docs/rings.md): pure.

``fabric_env`` is the fabric part of a rank's env file; ``function_env`` one function's alone
(the per-function smoke test); a ring of four and more names its NCCL graph files at
``GRAPH_FILE`` and ``RING_GRAPHS``."""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

from sparkrig.topology import FUNCTION_NAMES, LINK_PREFIX, Iface, Plan

# ---------------------------------------------------------------------------------------------
# The per-rank environment of the fabric (NCCL and TensorFold), from the plan
# ---------------------------------------------------------------------------------------------

# TensorFold's 4-Spark ring: the per-rank NCCL graph file and the two link graphs, read-only
# mounts at these container paths (docs/rings.md; tensorfold.md "4-Spark ring adds", M2
# scripts/nodes.sh@14a5e91c and config.sh@336811f8)
GRAPH_FILE = "/nccl-graph.xml"
RING_GRAPHS = ("/nccl-link-prev.xml", "/nccl-link-next.xml")


def socket_ifname(plan: Plan, rank: int, uplinks: Sequence[str] = ()) -> str:
    """Where NCCL and gloo bootstrap: a pair over its primary fabric netdev (as today); three
    and more over the LAN (no fabric address reaches every rank directly: TensorFold's TP>2
    rule, docs/rings.md): the first uplink named, else every interface but loopback, docker's
    and the fabric netdevs."""
    part = plan.ranks[rank]
    if plan.nnodes == 2:
        return part.ifaces[0].netdev
    if uplinks:
        return "=" + uplinks[0]
    return "^" + ",".join(["lo", "docker", "veth", *part.netdevs])  # prefixes left out


# two ranks over one cable: both functions, one NIC each, primary to primary and twin to twin
PAIR_ENV = [("NCCL_CROSS_NIC", "0"), ("NCCL_IB_MERGE_NICS", "0")]


def ib_env(
    ifaces: Sequence[Iface], cidr: ipaddress.IPv4Network, roce_port: int, ifname: str
) -> list[tuple[str, str]]:
    """NCCL over RoCE v2 on the RDMA devices of ``ifaces`` (each one's GID by value: in
    NCCL_IB_ADDR_RANGE ``cidr``), bootstrapping on ``ifname`` (NCCL's syntax; gloo gets it too
    unless it is an exclusion list), with sparkrig's own SPARKRIG_* lines first."""
    env = [
        ("SPARKRIG_FABRIC_LAYOUT", "ports"),
        ("SPARKRIG_FABRIC_NETDEVS", ",".join(i.netdev for i in ifaces)),
        ("SPARKRIG_ROCE_DEVICES", ",".join(i.rdma for i in ifaces)),
        ("SPARKRIG_FABRIC_ADDRESSES", ",".join(str(i.address.ip) for i in ifaces)),
        ("NCCL_NET", "IB"),
        ("NCCL_IB_DISABLE", "0"),
        ("NCCL_IB_HCA", "=" + ",".join(f"{i.rdma}:{roce_port}" for i in ifaces)),
        ("NCCL_IB_ROCE_VERSION_NUM", "2"),
        ("NCCL_IB_ADDR_FAMILY", "AF_INET"),
        ("NCCL_IB_ADDR_RANGE", str(cidr)),
        ("NCCL_SOCKET_IFNAME", ifname),
    ]
    if not ifname.startswith("^"):  # gloo takes interface names, not NCCL's exclusions
        env.append(("GLOO_SOCKET_IFNAME", ifname.removeprefix("=")))
    return env


def link_env(plan: Plan, rank: int, cable: int, roce_port: int = 1) -> list[tuple[str, str]]:
    """The env of a two-rank NCCL run over one cable of a triangle or a ring, at ``rank`` (one
    of its ends): a pair's env on that cable's functions (those the plan kept), bootstrapping on
    its first netdev there. What the per-link NCCL smoke test runs with (the busbw of every
    link)."""
    ifaces = [i for i in plan.ranks[rank].ifaces if i.cable == cable]
    if not ifaces:
        raise ValueError(f"rank {rank} has no function of cable {cable} in the plan")
    return ib_env(ifaces, plan.cidr, roce_port, "=" + ifaces[0].netdev) + PAIR_ENV


def function_env(plan: Plan, rank: int, function: int, roce_port: int = 1) -> list[tuple[str, str]]:
    """The env of a pair's NCCL run on one function of its cable alone, at ``rank``: the pair's
    env with NCCL_IB_HCA naming that function's device only, bootstrapping where the pair's does.
    What the per-function smoke test runs with (the figure of each function, and which one is
    slow when the pair's is)."""
    if plan.nnodes != 2:
        raise ValueError("one function alone is a pair's test")
    ifaces = [i for i in plan.ranks[rank].ifaces if i.function == function]
    if not ifaces:
        raise ValueError(f"rank {rank} has no {FUNCTION_NAMES[function]} function in the plan")
    return ib_env(ifaces, plan.cidr, roce_port, socket_ifname(plan, rank)) + PAIR_ENV


def fabric_env(
    plan: Plan, rank: int, roce_port: int = 1, uplinks: Sequence[str] = ()
) -> list[tuple[str, str]]:
    """The fabric part of rank ``rank``'s env file (fabric_layout "ports"), in order.

    Every plan: NCCL over RoCE v2 on every RDMA device facing a peer (NCCL_IB_HCA), the GID
    chosen by value per device: NCCL_IB_GID_INDEX is left unset, so NCCL (>= 2.21, default -1)
    takes on each device the RoCE v2 GID whose IPv4 is in NCCL_IB_ADDR_RANGE (fabric_cidr).
    A pair: both functions of its cable, one NIC each (NCCL_IB_MERGE_NICS=0, NCCL_CROSS_NIC=0:
    primary to primary, twin to twin). Three and more, TensorFold's N-rank env (its
    scripts/nodes.sh ``nccl_env_n``): cross-NIC, subnet-aware routing (each peer through the
    device on its subnet), no P2P/SHM, 4 channels, TF_ROCE_HCA the same devices. A ring of four
    and more adds ring-only NCCL (NCCL_ALGO=Ring, no merged NICs), the per-rank graph files
    (NCCL_GRAPH_FILE, TF_NCCL_RING_GRAPHS), TF_NCCL_RING and TF_ROCE_RING (relay through
    neighbours) and NCCL_IB_SUBNET_PREFIX_LEN: /24, each function's own subnet here (TensorFold
    computes a longer one only because its twins share a /24)."""
    part = plan.ranks[rank]
    env = ib_env(part.ifaces, plan.cidr, roce_port, socket_ifname(plan, rank, uplinks))
    if plan.nnodes == 2:
        return env + PAIR_ENV
    env += [
        ("NCCL_CROSS_NIC", "1"),
        ("NCCL_IB_SUBNET_AWARE_ROUTING", "1"),
        ("NCCL_P2P_DISABLE", "1"),
        ("NCCL_SHM_DISABLE", "1"),
        ("NCCL_MIN_NCHANNELS", "4"),
        ("NCCL_MAX_NCHANNELS", "4"),
        ("TF_ROCE_HCA", ",".join(part.rdma_devices)),
    ]
    if plan.relays:
        env += [
            ("NCCL_ALGO", "Ring"),
            ("NCCL_IB_MERGE_NICS", "0"),
            ("NCCL_IB_SUBNET_PREFIX_LEN", str(LINK_PREFIX)),
            ("NCCL_GRAPH_FILE", GRAPH_FILE),
            ("TF_NCCL_RING", "1"),
            ("TF_NCCL_RING_GRAPHS", ",".join(RING_GRAPHS)),
            ("TF_ROCE_RING", "1"),
        ]
    return env
