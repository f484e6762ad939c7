"""Preflight verdicts: pure functions over node reports, so they are unit-tested without hosts."""

from __future__ import annotations

import ipaddress

from sparkrig.config.model import Settings
from sparkrig.fabric import DISPLACED_DIR
from sparkrig.node import NodeReport
from sparkrig.serving import memory_floor_gib  # the start gate's own rule

GIB = 1024**3


def fabric_claims(node: NodeReport) -> list[str]:
    """Other configurations of the fabric NIC, as paths (netplan files, NM profile files)."""
    return [*node.netplan_claims, *(p.path for p in node.nm_claims)]


def describe(node: NodeReport) -> str:
    gpu = node.gpu or "no NVIDIA GPU found"
    return (
        f"{node.arch}, kernel {node.kernel}, {gpu}, MemFree {node.memfree_kb / 1024**2:.1f} GiB, "
        f"{node.disk_free / GIB:.0f} GiB free for weights, fabric MTU {node.mtu or '?'}"
    )


def warnings(s: Settings, node: NodeReport, peers: dict[str, NodeReport]) -> list[str]:
    """Worth saying, not worth refusing (the lab's x86 VMs have no GB10)."""
    out = []
    if node.link_present and not node.admin_up:
        out.append(
            f"fabric interface {s.me.fabric_interface} is administratively down (no IFF_UP: "
            "`ip link set down`, `nmcli device disconnect` or a driver reset): the fabric phase "
            "brings it up"
        )
    if node.arch != "aarch64":
        out.append(f"architecture is {node.arch}, not aarch64 (a DGX Spark is aarch64)")
    if not node.gpu:
        out.append("nvidia-smi reports no GPU (a DGX Spark has one GB10)")
    elif "12.1" not in node.gpu:
        out.append(f"GPU {node.gpu!r} is not compute capability 12.1 (GB10)")
    if s.me.is_head and (clear := in_clear(s)):
        out.append(clear)
    for name, peer in peers.items():
        if peer.driver != node.driver:
            out.append(
                f"NVIDIA driver differs: {s.me.name} has {node.driver or 'none'}, "
                f"{name} has {peer.driver or 'none'} (580.x is known good)"
            )
    return out


def _loopback(network: str) -> bool:
    net = ipaddress.ip_network(network)
    loop = ipaddress.ip_network("127.0.0.0/8" if net.version == 4 else "::1/128")
    return net.subnet_of(loop)  # type: ignore[arg-type]


def in_clear(s: Settings) -> str | None:
    """The API key, the prompts and the answers would cross a network in clear: the front
    serves plain HTTP (api_tls off) to addresses beyond loopback (api_allow)."""
    k = s.knobs
    beyond = [n for n in k.api_allow if not _loopback(n)]
    if k.api_tls or not beyond:
        return None
    what = "the API key, every prompt and every answer" if k.api_auth else "every prompt and answer"
    return (
        f"the API front serves plain HTTP to {', '.join(beyond)} (api_allow, api_tls = False): "
        f"{what} cross the network in clear; set api_tls = True (the pair's own CA, or tls_cert "
        'and tls_key: docs/front.md), or api_allow = ["127.0.0.0/8"] to serve this host alone'
    )


def fetch_summary(fetch_bytes: dict[str, int]) -> str:
    """What is still to fetch per artifact, e.g. ``model 181.0 GiB, drafter 2.1 GiB``."""
    return ", ".join(f"{name} {size / GIB:.1f} GiB" for name, size in fetch_bytes.items() if size)


def disk_problem(
    s: Settings, node: NodeReport, weights_to_fetch: int, kept: str = ""
) -> str | None:
    """Too little free space where the weights land: what the lockfiles say is still to fetch
    here (``weights_to_fetch`` bytes: verified files excluded) plus ``min_disk_free_gib`` kept
    free after it (the base image's pull and its saved copy for the workers, the JIT caches).
    Nothing to fetch needs nothing: a converged pair is never refused for its disk. ``kept``:
    the serving release during a release change (a stack switch, a new revision), whose weights
    stay on this disk, already counted as used, until the new release passes its gates."""
    k = s.knobs
    if weights_to_fetch <= 0:
        return None
    need = weights_to_fetch + k.min_disk_free_gib * GIB
    if node.disk_free >= need:
        return None
    stays = (
        f"; the serving release ({kept}) keeps its weights there until the new one passes its gates"
        if kept
        else ""
    )
    return (
        f"{node.disk_free / GIB:.1f} GiB free under {k.weights_dir}, need {need / GIB:.1f} GiB: "
        f"{weights_to_fetch / GIB:.1f} GiB of weights still to fetch (the lockfiles in "
        f"{k.lockfile_dir}) + {k.min_disk_free_gib:g} GiB kept free (min_disk_free_gib){stays}; "
        "free space on that filesystem, or set weights_dir to a larger one"
    )


def memory_problem(s: Settings, node: NodeReport) -> str | None:
    """A stack whose start gate wants a pinned amount of free memory (``Stack.memory``, or the
    knob memfree_min_gib) that this node's MemTotal cannot hold: every start would wait and
    refuse, so the run is refused before any change. A derived floor (utilization x MemTotal)
    always fits, and a ceiling on used memory is no floor."""
    gate = s.stack.memory
    floor = memory_floor_gib(s)
    if gate.measure == "used" or floor is None or not node.memtotal_kb:
        return None
    total_gib = node.memtotal_kb / 1024**2
    if total_gib >= floor:
        return None
    said = {"memfree": "MemFree", "available": "MemAvailable"}[gate.measure]
    source = f" ({gate.source})" if gate.source and floor == gate.floor_gib else ""
    return (
        f"memory: stack {s.stack.name} starts only with {said} >= {floor:g} GiB on every "
        f"node{source}; MemTotal here is {total_gib:.1f} GiB, so no start could pass its "
        "gate: choose another stack (knob stack), or another node"
    )


def problems(
    s: Settings,
    node: NodeReport,
    peers: dict[str, NodeReport],
    weights_to_fetch: int = 0,
    kept: str = "",
) -> list[str]:
    """Reasons this host must not be converged; each names what to fix. ``weights_to_fetch``:
    bytes of the pinned revisions not yet verified here, ``kept``: the serving release whose
    weights stay during a release change (``disk_problem``)."""
    k, out = s.knobs, []
    if not node.docker:
        out.append("docker is not installed (DGX OS ships it; install docker.io)")
    disk = disk_problem(s, node, weights_to_fetch, kept)
    out += [disk] if disk else []
    memory = memory_problem(s, node)
    out += [memory] if memory else []
    iface = s.me.fabric_interface
    if not node.link_present:
        have = ", ".join(f"{name} ({state or '?'})" for name, state in node.netdevs) or "none"
        out.append(
            f"fabric interface {iface} does not exist (fabric_interface); the netdevs here: "
            f"{have}; set it in the inventory to the cabled ConnectX-7 netdev (`ibdev2netdev` on "
            "the host shows which is Up)"
        )
    elif node.admin_up and not node.carrier:
        # only an UP netdev says anything about the cable: a down one reads no carrier anyway,
        # and the fabric phase brings it up (fabric_link_raised)
        out.append(
            f"fabric interface {iface} is up but has no carrier (flags IFF_UP, carrier 0, "
            f"operstate {node.operstate}): check the QSFP cable at both ends and that the "
            "peer Spark is powered on"
        )
    if node.networkmanager != "active":
        out.append(
            f"NetworkManager is not running (systemctl is-active: {node.networkmanager or '?'}): "
            "sparkrig's fabric netplan file is written for the NetworkManager renderer, as DGX OS "
            "uses; start NetworkManager"
        )
    if not k.fabric_takeover:
        how = (
            f"remove it, or set fabric_takeover = True to let sparkrig move it to "
            f"{DISPLACED_DIR}{{path}}"
        )
        # every fabric netdev of the plan in fabric_layout "ports" (the node report lists them all)
        named = " or ".join(s.fabric_rank.netdevs) if s.fabric_rank is not None else iface
        for path in node.netplan_claims:
            out.append(
                f"fabric interface {named} is also configured by the netplan file {path}; netplan "
                f"would merge it with {k.fabric_netplan_file}: " + how.format(path=path)
            )
        for profile in node.nm_claims:
            out.append(
                f"fabric interface {named} is also claimed by the NetworkManager profile "
                f"'{profile.name}' ({profile.path}), which competes with sparkrig's: "
                + how.format(path=profile.path)
            )
    if k.min_free_kbytes is None:
        for name, peer in peers.items():
            if peer.min_free_kbytes != node.min_free_kbytes:
                out.append(
                    f"vm.min_free_kbytes differs: {node.min_free_kbytes} here, "
                    f"{peer.min_free_kbytes} on {name}; set min_free_kbytes to pin one value"
                )
    return out
