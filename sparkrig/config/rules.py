"""What the knobs of a host and the whole inventory refuse together, before any host is touched:
the ranks against each other (addresses, subnets, cluster-wide knobs), the knobs against each
other (ports, the watchdog's timings), the selected stack against the knobs and the rank count,
the fabric env the engine needs, the layouts the deploy does not apply, and the lockfiles.
Each returns its problems as lines (``<host>: <key>: <why>``) or a refusal; none raises."""

from __future__ import annotations

import ipaddress
import re
from typing import Any

from sparkrig import fabricenv, hubtoken, lockfile, topology
from sparkrig.config.checks import known_bad_image
from sparkrig.config.knobs import Knobs, cluster_keys
from sparkrig.config.model import (
    Rank,
    Settings,
    api_scheme,
    fabric_plan,
    layout_of,
    pinned_drafter,
    pinned_image,
)
from sparkrig.engines import engine_of
from sparkrig.stacks import STACKS, get

# a pair's name is its inventory group's (``--limit <pair>``): a Python identifier, not a role's
PAIR_NAME_RE = re.compile(r"^(?!(?:head|worker|all)$)[A-Za-z][A-Za-z0-9_]{0,31}$")
# one endpoint: every head serves the API the same way, with the same key and CA
ENDPOINT_KNOBS = ("api_port", "api_auth", "api_tls", "api_key_file", "api_tls_dir", "tls_cert")


def endpoint_problems(clusters: list[tuple[str, list[Rank], dict[str, Knobs]]]) -> list[str]:
    """What keeps two pairs and more from serving one endpoint: a knob of ``ENDPOINT_KNOBS``
    that differs between their heads (a client must be served alike by any head)."""
    if len(clusters) < 2:
        return []
    first_pair, first_ranks, first_knobs = clusters[0]
    first = first_knobs[first_ranks[0].name]
    problems = []
    for _, ranks, knobs in clusters:
        head = ranks[0]
        if head.lan_address is None:
            problems.append(
                f"{head.name}: lan_address: missing: the other pairs' fronts reach this head at "
                "its LAN IPv4 address (one endpoint over every pair); set it on every head"
            )
        if knobs[head.name].tls_cert is not None:
            problems.append(
                f"{head.name}: tls_cert: the heads of several pairs verify each other with the "
                "endpoint's own CA (api_tls_dir); remove tls_cert and tls_key"
            )
    for _, ranks, knobs in clusters[1:]:
        k = knobs[ranks[0].name]
        for key in ENDPOINT_KNOBS:
            if getattr(k, key) != getattr(first, key):
                problems.append(
                    f"{ranks[0].name}: {key}: {getattr(k, key)!r} differs from "
                    f"{first_ranks[0].name}'s {getattr(first, key)!r} (pair {first_pair}): "
                    "every pair's head serves the one endpoint alike"
                )
    return problems


def typed_pair_problems(ranks: list[Rank]) -> list[str]:
    """A pair on both functions keeps the fabric_address its inventory types (its primary
    function's; the twin's is derived, topology.typed_links): on both ranks or on neither, on
    one subnet that has a buddy of its size."""
    if len(ranks) != 2:
        return []
    typed = [r for r in ranks if r.fabric_address.network.prefixlen < 32]
    if len(typed) == 1:
        other = next(r for r in ranks if r not in typed)
        return [
            f"{other.name}: fabric_address: missing, but {typed[0].name} has one: a pair on "
            "both functions types both primary addresses or neither (then fabric_cidr's)"
        ]
    if len(typed) == 2:
        pair = (ranks[0].fabric_address, ranks[1].fabric_address)
        return [f"{ranks[1].name}: {p}" for p in topology.typed_problems(pair)]
    return []


def ports_layout_keys(name: str, data: dict[str, Any], nnodes: int) -> list[str]:
    """What fabric_layout "ports" refuses in one host's data on three ranks and more: a typed
    fabric address (every address is derived from fabric_cidr), a fabric_interface or
    roce_device (a ring names both ports, fabric_ports, or takes DGX OS's names). A pair keeps
    its fabric_address as its primary function's (``typed_pair_problems``)."""
    problems = []
    if nnodes > 2 and data.get("fabric_address") not in (None, ""):
        problems.append(
            f"{name}: fabric_address: fabric_layout 'ports' derives every fabric address from "
            "fabric_cidr, never per host (docs/rings.md); remove it"
        )
    if nnodes > 2 and data.get("lan_address") in (None, ""):
        problems.append(
            f"{name}: lan_address: missing: a ring of {nnodes} meets at the head's LAN address "
            "(the engine's rendezvous and NCCL's bootstrap: no fabric address reaches every "
            "rank directly); set each rank's LAN IPv4 address, the one on its first "
            "uplink_interfaces entry (docs/rings.md)"
        )
    if nnodes > 2:
        for key in ("fabric_interface", "roce_device"):
            if data.get(key) not in (None, ""):
                problems.append(
                    f"{name}: {key}: a ring of {nnodes} uses both QSFP ports of every rank, "
                    "named in fabric_ports (or DGX OS's names: docs/rings.md); remove it"
                )
    return problems


def cluster_problems(ranks: list[Rank], knobs: dict[str, Knobs]) -> list[str]:
    problems: list[str] = []
    head = ranks[0] if ranks and ranks[0].rank == 0 else None
    if head is not None and head.api_url and head.name in knobs:
        scheme = api_scheme(knobs[head.name])
        if not head.api_url.startswith(f"{scheme}://"):
            how = "api_tls = True: the pair's CA" if scheme == "https" else "api_tls = False"
            problems.append(
                f"{head.name}: api_url: {head.api_url} is not {scheme}:// but the front serves "
                f"{scheme.upper()} ({how}); write {scheme}://..., or change api_tls"
            )
    layout = layout_of(next(iter(knobs.values())).fabric_layout, len(ranks)) if knobs else "single"
    real = [r for r in ranks if r.fabric_address.network.prefixlen < 32]
    seen: dict[str, str] = {}
    for r in real:
        if r.ip in seen:
            problems.append(f"{r.name}: fabric_address: {r.ip} is already used by {seen[r.ip]}")
        seen.setdefault(r.ip, r.name)
    lan: dict[ipaddress.IPv4Address, str] = {}
    cidr = next(iter(knobs.values())).fabric_cidr if knobs else None
    for r in ranks:
        if r.lan_address is None:
            continue
        if r.lan_address in lan:
            problems.append(
                f"{r.name}: lan_address: {r.lan_address} is already used by {lan[r.lan_address]}"
            )
        lan.setdefault(r.lan_address, r.name)
        if cidr is not None and r.lan_address in ipaddress.ip_network(cidr):
            problems.append(
                f"{r.name}: lan_address: {r.lan_address} is in fabric_cidr {cidr}: the LAN "
                "address is the rank's management one, never a fabric address"
            )
    if real and layout == "single":
        net = real[0].fabric_address.network
        for r in real[1:]:
            if r.fabric_address.network != net:
                problems.append(
                    f"{r.name}: fabric_address: {r.fabric_address} is not on the head's "
                    f"fabric subnet {net}"
                )
    if knobs:
        first_name = next(iter(knobs))
        first = knobs[first_name]
        for name, k in knobs.items():
            for key in cluster_keys():
                if getattr(k, key) != getattr(first, key):
                    problems.append(
                        f"{name}: {key}: {getattr(k, key)!r} differs from {first_name}'s "
                        f"{getattr(first, key)!r}; it must be equal on every host"
                    )
            problems.extend(_stack_problems(name, k))
            declared = get(k.stack).nodes
            split = (
                engine_of(get(k.stack)).topology_problem(get(k.stack), len(ranks))
                if name == first_name and ranks
                else None
            )
            if split:
                problems.append(f"{name}: stack: {k.stack!r} {split}")
            elif declared and ranks and len(ranks) not in declared:
                serving = [n for n, st in STACKS.items() if len(ranks) in st.nodes]
                problems.append(
                    f"{name}: stack: {k.stack!r} serves on {' or '.join(map(str, declared))} "
                    f"Sparks; the inventory has {len(ranks)}"
                    + (f" (stack {', '.join(map(repr, serving))} serves on it)" if serving else "")
                )
            layouts = get(k.stack).fabric_layouts
            if name == first_name and layouts and layout not in layouts:
                problems.append(
                    f"{name}: fabric_layout: stack {k.stack!r} runs on fabric_layout "
                    f"{' or '.join(map(repr, layouts))}, not {layout!r}: its ranks' NCCL env is "
                    "the fabric plan's, every device facing a peer (docs/rings.md)"
                )
            ports = (k.api_port, k.master_port, k.master_port + 1, k.pair_port, k.copy_port)
            if len({*ports, k.agent_port, k.image_copy_port, k.engine_port}) != 8:
                problems.append(
                    f"{name}: api_port, engine_port, master_port (+1 for the smoke test), "
                    "pair_port, copy_port, agent_port and image_copy_port must differ"
                )
            if k.api_key_rotate and not k.api_auth:
                problems.append(
                    f"{name}: api_key_rotate: True with api_auth = False: an open API has no key "
                    "to rotate (set api_auth = True, or drop api_key_rotate)"
                )
            if k.watchdog and k.watchdog_grace_s < k.ready_timeout_s:
                problems.append(
                    f"{name}: watchdog_grace_s: {k.watchdog_grace_s} is below ready_timeout_s "
                    f"{k.ready_timeout_s}; it must not judge a boot the deploy still waits for"
                )
            if k.watchdog and k.watchdog_stall_s <= k.watchdog_interval_s:
                problems.append(
                    f"{name}: watchdog_stall_s: {k.watchdog_stall_s} must exceed "
                    f"watchdog_interval_s {k.watchdog_interval_s}: a stall is no progress seen "
                    "over several probes, never one"
                )
    return problems


def rank_fabric_env(plan: topology.Plan, r: Rank, k: Knobs) -> list[tuple[str, str]]:
    """What rank ``r``'s container gets of the fabric env: ``fabricenv.fabric_env`` with the knob
    ``nccl_env`` over it (the rank env file lists the knob last, and the last value wins)."""
    env = fabricenv.fabric_env(plan, r.rank, k.roce_port, r.uplink_interfaces)
    keys = {key for key, _ in env}
    return [(key, k.nccl_env.get(key, value)) for key, value in env] + [
        (key, value) for key, value in k.nccl_env.items() if key not in keys
    ]


def fabric_env_refusals(ranks: list[Rank], k: Knobs) -> list[str]:
    """The engine's needs (``Stack.fabric_env_needs``) checked against every rank's fabric env
    before any host is touched (the engine's ``fabric_env_problems``): one line
    per problem, naming the rank and the key (and the knob nccl_env where it set the value)."""
    stack = get(k.stack).at(len(ranks))
    if not stack.fabric_env_needs.get(len(ranks)):
        return []
    plan = fabric_plan(ranks, k.fabric_cidr)
    out = []
    for r in ranks:
        env = rank_fabric_env(plan, r, k)
        for problem in engine_of(stack).fabric_env_problems(stack, len(ranks), env):
            key = re.split(r"[= :]", problem, maxsplit=1)[0]
            knob = " (set by the knob nccl_env)" if key in k.nccl_env else ""
            out.append(
                f"{r.name}: rank {r.rank}'s env for stack {stack.name!r}: {problem}{knob} "
                '(docs/rings.md "The per-rank env")'
            )
    return out


def _stack_problems(name: str, k: Knobs) -> list[str]:
    """What the selected stack refuses in one host's knobs: a profile it does not serve, no
    image pinned, a known-bad image, a drafter it lacks or whose licence is not accepted."""
    problems: list[str] = []
    stack = get(k.stack)
    if k.profile not in stack.profiles:
        return [
            f"{name}: profile: stack {stack.name!r} serves no profile {k.profile!r}; choose "
            f"one of {', '.join(stack.profiles)} (or another stack)"
        ]
    image = pinned_image(k)
    if image is None:
        problems.append(
            f"{name}: base_image: missing: stack {stack.name!r} declares no image "
            f"({stack.image_note}); pin one by digest (repo@sha256:<64 hex>) in base_image or "
            f"stack_pins[{stack.name!r}]['base_image'] (docs/stacks.md)"
        )
    elif (why := known_bad_image(image)) and not k.base_image_known_bad_ok:
        problems.append(
            f"{name}: base_image: {image} is known not to work: {why} "
            "(set base_image_known_bad_ok = True to use it anyway)"
        )
    gate = stack.memory
    if gate.measure == "available" and gate.floor_gib is None and k.memfree_min_gib is None:
        problems.append(
            f"{name}: memfree_min_gib: stack {stack.name!r}'s start gate measures "
            f"{gate.measure!r} memory and declares no floor; set memfree_min_gib (GiB)"
        )
    elif gate.measure == "used" and gate.floor_gib is None:  # a ceiling no knob sets
        problems.append(
            f"{name}: stack: {stack.name!r}'s start gate caps used memory and declares no "
            "ceiling (sparkrig/stacks/: MemoryGate('used', <GiB>))"
        )
    drafter = pinned_drafter(k)
    if stack.needs_drafter(k.profile):
        if drafter is None:
            problems.append(
                f"{name}: profile: {k.profile!r} loads a drafter and stack {stack.name!r} "
                "declares none; set drafter_repo and drafter_revision, or choose another profile"
            )
        elif drafter.license_note and not k.drafter_license_accepted:
            problems.append(
                f"{name}: profile: {k.profile!r} uses the drafter {drafter.repo} "
                f"({drafter.license_note}); set drafter_license_accepted = True or choose "
                "another profile"
            )
    return problems


def ring_engines(nnodes: int) -> list[str]:
    """The stacks the deploy runs on a triangle or a ring of ``nnodes``: those whose ranks' env
    is the fabric plan's (they declare fabric_layouts "ports" and serve on ``nnodes``)."""
    return [n for n, st in STACKS.items() if "ports" in st.fabric_layouts and nnodes in st.nodes]


def not_applied(settings: dict[str, Settings]) -> str | None:
    """Why the deploy refuses a valid inventory it cannot converge, or None. fabric_layout
    "ports" is applied for a pair (both functions of its cable) and, on three and four ranks,
    for a stack whose N-rank env is the plan's (``ring_engines``: `tensorfold-ring`,
    docs/rings.md); every other stack is refused there for good. A vLLM stack on four ranks of
    a switchless ring: stock NCCL dies in ``ncclTransportTreeConnect`` on a ring of four and
    needs ring-only NCCL with a patched NCCL (``NCCL_SKIP_TREE_CONNECT``), which no vLLM stack
    here ships (research rings.md [I2, S13]); three ranks are refused earlier, by the 64 heads."""
    s = next(iter(settings.values()), None)
    if s is None or s.layout == "single" or s.nnodes == 2:
        return None
    engines = ring_engines(s.nnodes)
    if s.knobs.stack in engines:
        return None
    why = engine_of(s.stack).ring_refusal(s.stack)
    return (
        f"fabric_layout 'ports' with {s.nnodes} ranks: stack {s.knobs.stack!r} does not run on a "
        f"triangle or a switchless ring: {why}; use stack "
        f"{' or '.join(map(repr, engines)) or '(none)'}, two ranks, or fabric_layout 'single' "
        "on a switch"
    )


def lockfile_refusal(settings: dict[str, Settings]) -> str | None:
    """Every lockfile the run needs that is missing, stale or gated without a Hub token, in one
    error (each with the command that fixes it), or None. Missing lockfiles that are all the
    stack's declared pins get one command more that makes every one of them."""
    problems: list[str] = []
    locks_refused: set[tuple[str, str, str]] = set()
    declared_only = True
    for s in settings.values():
        k = s.knobs
        wanted = [(repo, revision) for _, repo, revision in s.locked_artifacts]
        locks, refused = lockfile.checked_all(k.lockfile_dir, wanted, k.hub_endpoint)
        pins = {(p.repo, p.revision) for p in lockfile.declared(k.stack)}
        for repo, revision, why in refused:
            locks_refused.add((k.lockfile_dir, repo, revision))
            declared_only = declared_only and (repo, revision) in pins
            problems += [why] if why not in problems else []
        for repo, lock in locks.items():
            gated = lock.get("gated")
            for said in (
                hubtoken.missing_for(repo, gated, k.hub_endpoint),
                hubtoken.in_clear(repo, gated, k.hub_endpoint),
            ):
                problems += [said] if said and said not in problems else []
    if not problems:
        return None
    k = next(iter(settings.values())).knobs
    one_dir = {d for d, _, _ in locks_refused} == {k.lockfile_dir}
    at_once = (
        lockfile.stack_refresh_command(k.stack, k.lockfile_dir, k.hub_endpoint)
        if len(locks_refused) > 1 and declared_only and one_dir
        else None
    )
    return lockfile.refusal(problems, at_once)
