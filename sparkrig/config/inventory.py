"""Typed, validated settings: the only place that reads ``host.data`` (docs/design.md).

Inventory and group data go in (group_data/all.py holds every knob's default, made from
sparkrig/config/knobs.py); one ``Settings`` per host comes out, carrying the knobs and the whole
cluster (every rank's fabric address and interface), so tasks never touch ``host.data``. Every
problem in any host's data is collected and raised as one ``DeployError`` before any operation is
planned, so bad input never reaches a host.
"""

from __future__ import annotations

import difflib
import functools
import ipaddress
from typing import Any

from pydantic import ValidationError
from pyinfra.api.exceptions import DeployError

from sparkrig import topology
from sparkrig.config.knobs import Knobs
from sparkrig.config.model import (
    HEAD_GROUP,
    WORKER_GROUP,
    Rank,
    Settings,
    errors_of,
    layout_of,
    planned_ranks,
    resolved_ports,
)
from sparkrig.config.rules import (
    PAIR_NAME_RE,
    cluster_problems,
    endpoint_problems,
    fabric_env_refusals,
    lockfile_refusal,
    not_applied,
    ports_layout_keys,
    typed_pair_problems,
)
from sparkrig.runscope import once_per_run, pairs_are

# Per-host keys of the inventory (``Rank``); ssh_hostname, also read, is pyinfra's own.
HOST_KEYS = (
    "fabric_interface",
    "fabric_address",
    "roce_device",
    "uplink_interfaces",
    "api_url",
    "fabric_ports",  # fabric_layout "ports": the rank's QSFP ports by index (FabricPort)
    "lan_address",  # a triangle or a ring: the rank's LAN IPv4 address (the rendezvous's)
    "pair",  # two pairs and more behind one endpoint: the name of the rank's pair (docs/pairs.md)
)
# Host data pyinfra 3.10's connectors read without declaring it in their ``data_meta``:
# pyinfra/connectors/chroot.py (chroot_directory), dockerssh.py (docker_image, docker_container_id).
PYINFRA_UNDECLARED_KEYS = ("chroot_directory", "docker_image", "docker_container_id")
# Knobs that are gone, with what replaced them (a plain "unknown key" would guess a wrong one).
RETIRED_KEYS = {
    "hf_token_file": "retired: the Hub token is the one huggingface_hub finds (HF_TOKEN, else "
    "the file `hf auth login` writes, which HF_TOKEN_PATH moves); remove the key",
}


class InventoryView:
    """The slice of a pyinfra inventory settings needs (tests pass a stand-in)."""

    def __init__(self, groups: dict[str, list[tuple[str, dict[str, Any]]]]) -> None:
        self.groups = groups


def _host_items(inventory: Any, group: str) -> list[tuple[str, dict[str, Any]]]:
    try:
        hosts = inventory.get_group(group)
    except Exception:  # pyinfra raises NoGroupError for a group nobody defined
        return []
    return [(h.name, h.data.dict()) for h in hosts]


def view_of(inventory: Any) -> InventoryView:
    """Read head and worker hosts (in inventory order) with their merged data."""
    return InventoryView(
        {g: _host_items(inventory, g) for g in (HEAD_GROUP, WORKER_GROUP)},
    )


@functools.cache
def pyinfra_keys() -> frozenset[str]:
    """Host data keys pyinfra itself reads: the global operation arguments, whose default is the
    host data of the same name (pyinfra/api/arguments.py ``all_global_arguments``, read by
    ``pop_global_arguments``: _sudo, _sudo_user, _env, ...), every installed connector's declared
    data (``data_meta``: ssh_*, docker_*, fake_*, a plugin's own) and PYINFRA_UNDECLARED_KEYS."""
    from pyinfra.api.arguments import all_global_arguments
    from pyinfra.api.connectors import get_all_connectors

    keys = {name for name, _ in all_global_arguments()}
    for connector in get_all_connectors().values():
        keys.update(getattr(connector, "data_meta", {}))
    return frozenset(keys | set(PYINFRA_UNDECLARED_KEYS))


def known_keys() -> frozenset[str]:
    """Every key host data may hold: the knobs, the per-host keys and pyinfra's own."""
    return frozenset(Knobs.model_fields) | set(HOST_KEYS) | pyinfra_keys()


def unknown_keys(host: str, data: dict[str, Any]) -> list[str]:
    """One problem per key of a host's merged data (group data, inventory, ``--data``) that is
    no known key, naming the closest known one: a misspelled knob is never silently ignored."""
    known = known_keys()
    problems = []
    for key in sorted(k for k in data if k not in known):
        if key in RETIRED_KEYS:
            problems.append(f"{host}: {key}: {RETIRED_KEYS[key]}")
            continue
        close = difflib.get_close_matches(key, sorted(known), n=1)
        if close:
            problems.append(f"{host}: {key}: unknown key; did you mean {close[0]!r}?")
        else:
            problems.append(
                f"{host}: {key}: unknown key: not a knob of group_data/all.py, not a per-host key "
                f"({', '.join(HOST_KEYS)}) nor pyinfra's host data (ssh_*, _sudo, ...); remove it"
            )
    return problems


def said_once(problems: list[str], hosts: list[str]) -> list[str]:
    """``problems`` with one said of every host (group_data, --data: "<host>: <why>" once per
    host) said once, as "every host: <why>"; order kept, at the first host's place."""
    by_text: dict[str, set[str]] = {}
    for p in problems:
        name, sep, text = p.partition(": ")
        if sep and name in hosts:
            by_text.setdefault(text, set()).add(name)
    everyone = {text for text, names in by_text.items() if len(hosts) > 1 and names == set(hosts)}
    out: list[str] = []
    for p in problems:
        name, _, text = p.partition(": ")
        if text in everyone and name in hosts:
            line = f"every host: {text}"
            if line not in out:
                out.append(line)
        else:
            out.append(p)
    return out


def build(view: InventoryView) -> dict[str, Settings]:
    """Validate the whole inventory; return Settings per host name or raise one DeployError.

    Hosts that name a ``pair`` form one cluster per name, each validated as a pair of its own
    (its head, its workers, its fabric); without ``pair`` the inventory is one cluster."""
    heads = view.groups.get(HEAD_GROUP, [])
    workers = view.groups.get(WORKER_GROUP, [])
    clusters, problems = pairs_of(heads, workers)
    built: list[tuple[str, list[Rank], dict[str, Knobs]]] = []
    for pair, pair_heads, pair_workers in clusters:
        ranks, knobs, found = _build_cluster(pair, pair_heads, pair_workers)
        built.append((pair, ranks, knobs))
        problems.extend(found)
    if not problems:
        problems.extend(endpoint_problems([(p, r, k) for p, r, k in built if r]))
    if problems:
        said = said_once(problems, [n for n, _ in [*heads, *workers]])
        raise DeployError("invalid inventory or data:\n  " + "\n  ".join(said))
    every_head = tuple(ranks[0] for _, ranks, _ in built)
    out: dict[str, Settings] = {}
    for pair, ranks, knobs in built:
        as_tuple = tuple(ranks)
        for r in ranks:
            out[r.name] = Settings(
                me=r, ranks=as_tuple, knobs=knobs[r.name], pair=pair, pair_heads=every_head
            )
    return out


Hosts = list[tuple[str, dict[str, Any]]]


def pairs_of(heads: Hosts, workers: Hosts) -> tuple[list[tuple[str, Hosts, Hosts]], list[str]]:
    """The inventory's clusters, (pair name, heads, workers) each in inventory order, and what
    is wrong with the grouping. No host names a ``pair``: one cluster, named "". Every host
    names one: one cluster per name, in the order of their heads."""
    named = [(n, d.get("pair")) for n, d in [*heads, *workers]]
    if all(p in (None, "") for _, p in named):
        return [("", heads, workers)], []
    problems = [
        f"{n}: pair: missing: the other hosts name their pair; name this one's too"
        for n, p in named
        if p in (None, "")
    ]
    for n, p in named:
        if p not in (None, "") and not (isinstance(p, str) and PAIR_NAME_RE.match(p)):
            problems.append(
                f"{n}: pair: {p!r} is no pair name (a letter, then letters, digits or '_': the "
                "name of the inventory's group of that pair, for --limit)"
            )
    # in the order of their heads, then of workers whose pair has no head (refused below)
    order = dict.fromkeys(str(d["pair"]) for _, d in [*heads, *workers] if d.get("pair"))
    clusters = []
    for pair in order:
        if not PAIR_NAME_RE.match(pair):
            continue
        own_heads = [hd for hd in heads if hd[1].get("pair") == pair]
        own_workers = [hd for hd in workers if hd[1].get("pair") == pair]
        clusters.append((pair, own_heads, own_workers))
    return clusters, problems


def _build_cluster(
    pair: str, heads: Hosts, workers: Hosts
) -> tuple[list[Rank], dict[str, Knobs], list[str]]:
    """One cluster's ranks and knobs, and every problem found in its hosts' data."""
    problems: list[str] = []
    where = f"pair {pair}" if pair else "inventory"
    if len(heads) != 1:
        names = ", ".join(n for n, _ in heads) or "none"
        problems.append(f"{where}: group 'head' must hold exactly one host (rank 0), has {names}")
    if not workers:
        problems.append(f"{where}: group 'worker' must hold at least one host (ranks 1..N-1)")
    both = {n for n, _ in heads} & {n for n, _ in workers}
    for name in sorted(both):
        problems.append(f"{name}: is in both 'head' and 'worker'")

    ordered = heads[:1] + [hw for hw in workers if hw[0] not in both]
    ranks: list[Rank] = []
    knobs: dict[str, Knobs] = {}
    nnodes = len(ordered)
    for rank, (name, data) in enumerate(ordered):
        problems.extend(unknown_keys(name, data))
        ports_layout = layout_of(data.get("fabric_layout") or "auto", nnodes) == "ports"
        required: tuple[str, ...] = ("fabric_interface", "fabric_address")
        if ports_layout:  # the addresses are derived; a ring names no single interface
            required = ("fabric_interface",) if nnodes == 2 else ()
            problems.extend(ports_layout_keys(name, data, nnodes))
        elif data.get("fabric_ports") not in (None, {}):
            problems.append(
                f"{name}: fabric_ports: set, but fabric_layout is 'single' (one netdev, "
                "fabric_interface); set fabric_layout = 'ports' or remove it (docs/rings.md)"
            )
        for key in required:
            if data.get(key) in (None, ""):
                problems.append(f"{name}: {key}: missing (set it on the host in the inventory)")
        ports: dict[int, topology.Port] = {}
        if ports_layout:
            try:
                ports = resolved_ports(data, nnodes)
            except ValueError as err:
                problems.append(f"{name}: fabric_ports: {err}")
        interface = data.get("fabric_interface") or ""
        if ports_layout and nnodes != 2 and 0 in ports:
            interface = ports[0].primary.netdev  # the rank's first fabric netdev
        try:
            ranks.append(
                Rank(
                    name=name,
                    rank=rank,
                    fabric_interface=interface,
                    fabric_address=_interface(
                        None if ports_layout and nnodes > 2 else data.get("fabric_address")
                    ),
                    roce_device=data.get("roce_device"),
                    uplink_interfaces=list(data.get("uplink_interfaces") or []),
                    address=str(data.get("ssh_hostname") or name),
                    api_url=data.get("api_url") or None,
                    ports=ports,
                    lan_address=data.get("lan_address") or None,
                )
            )

        except ValidationError as err:
            if interface and (ports_layout or data.get("fabric_address")):
                problems.extend(errors_of(name, err))
        except ValueError as err:
            problems.append(f"{name}: fabric_address: {err}")
        try:
            knobs[name] = Knobs.model_validate(data)
        except ValidationError as err:
            problems.extend(errors_of(name, err))

    first = next(iter(knobs.values()), None)
    ports_plan = first is not None and layout_of(first.fabric_layout, nnodes) == "ports"
    if ports_plan:
        problems.extend(typed_pair_problems(ranks))
    if not problems and first is not None and ports_plan:
        try:
            ranks = planned_ranks(ranks, first.fabric_cidr)
        except topology.PlanError as err:
            problems.extend(f"inventory: fabric_layout 'ports': {p}" for p in err.problems)
    problems.extend(cluster_problems(ranks, knobs))
    if not problems and first is not None and ports_plan:
        problems.extend(fabric_env_refusals(ranks, first))
    return ranks, knobs, problems


def _interface(value: Any) -> ipaddress.IPv4Interface:
    if value in (None, ""):
        return ipaddress.IPv4Interface("0.0.0.0/32")
    text = str(value)
    if "/" not in text:
        raise ValueError(f"{text!r} needs a prefix length, e.g. 192.168.100.10/24")
    try:
        iface = ipaddress.IPv4Interface(text)
    except ValueError as err:
        raise ValueError(f"{text!r} is not an IPv4 address with prefix ({err})") from None
    if iface.ip == iface.network.network_address or iface.ip == iface.network.broadcast_address:
        raise ValueError(f"{text!r} is the network or broadcast address of its subnet")
    return iface


def current() -> Settings:
    """Settings for the host pyinfra is preparing now (validates the whole inventory once)."""
    from pyinfra import host
    from pyinfra.context import ctx_inventory

    return for_inventory(ctx_inventory.get())[host.name]  # the real object, not the proxy


def for_inventory(inventory: Any) -> dict[str, Settings]:
    """Validate once per inventory object (the deploy file runs once per host), lockfiles
    included: a missing or stale lockfile, or a gated repo with no Hub token on this machine,
    stops the run before any command reaches a host. Each host's pair is said to the run's
    scope (sparkrig/runscope.py), which keeps a pair's decisions apart from another's."""

    def validate() -> dict[str, Settings]:
        settings = build(view_of(inventory))
        pairs_are(inventory, {name: s.pair for name, s in settings.items()})
        if why := not_applied(settings):
            raise DeployError(why)
        if why := lockfile_refusal(settings):
            raise DeployError(why)
        return settings

    return once_per_run("settings", inventory, validate)
