"""The cluster as the deploy sees it: a rank (``Rank``, its QSFP ports ``FabricPort``), one host's
view of every rank and its knobs (``Settings``), and what follows from the knobs and the
inventory alone: the pins a run serves, the fabric layout, the addressing plan of its ranks.
Pure: sparkrig/config/inventory.py builds these from host data."""

from __future__ import annotations

import ipaddress
from dataclasses import replace
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from sparkrig import topology
from sparkrig.config.checks import NETDEV_RE
from sparkrig.config.knobs import Knobs
from sparkrig.stacks import get
from sparkrig.stacks.base import Pin, Stack

HEAD_GROUP = "head"
WORKER_GROUP = "worker"


class FabricPort(BaseModel):
    """One QSFP port of a rank in the inventory (host data ``fabric_ports``, by port index): its
    primary function's netdev, and what DGX OS's names derive from it unless given (the RDMA
    device, the PCIe twin's netdev and RDMA device: ``topology.dgx_os_port``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    netdev: str = Field(pattern=NETDEV_RE.pattern)
    roce_device: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_.-]+$")
    twin_netdev: str | None = Field(default=None, pattern=NETDEV_RE.pattern)
    twin_roce_device: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_.-]+$")

    def port(self, index: int) -> topology.Port:
        """The plan's port: each name given, else DGX OS's (ValueError naming what is missing)."""
        derived = topology.dgx_os_port(self.netdev)
        names = {
            "roce_device": self.roce_device or (derived and derived.primary.rdma),
            "twin_netdev": self.twin_netdev or (derived and derived.twin.netdev),
            "twin_roce_device": self.twin_roce_device or (derived and derived.twin.rdma),
        }
        missing = [k for k, v in names.items() if not v]
        if missing:
            raise ValueError(
                f"{self.netdev} is no DGX OS name (enp<bus>s<slot>f<fn>np<port>): name "
                f"{', '.join(missing)} too"
            )
        return topology.Port(
            index,
            topology.Function(self.netdev, str(names["roce_device"])),
            topology.Function(str(names["twin_netdev"]), str(names["twin_roce_device"])),
        )


class Rank(BaseModel):
    """One node of the cluster as the deploy sees it."""

    model_config = ConfigDict(frozen=True)

    name: str
    rank: int
    fabric_interface: str = Field(pattern=NETDEV_RE.pattern)
    fabric_address: ipaddress.IPv4Interface
    roce_device: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_.-]+$")
    uplink_interfaces: list[str] = []
    # where the control machine reaches this rank over SSH (ssh_hostname, else its inventory name)
    address: str = ""
    # the head's API as the control machine reaches it (host data api_url; read on the head
    # only); None: the default, http://<address>:<api_port> (``api_url``)
    api_url: str | None = Field(default=None, pattern=r"^https?://[^\s/]+(/[^\s]*)?$")
    # fabric_layout "ports": the rank's QSFP ports by index, resolved (each port's functions)
    ports: dict[int, topology.Port] = {}
    # its LAN (management) IPv4 address: where a triangle's or a ring's rendezvous meets
    # (host data lan_address; required there, unused on one subnet and on a pair)
    lan_address: ipaddress.IPv4Address | None = None

    @property
    def role(self) -> str:
        return HEAD_GROUP if self.rank == 0 else WORKER_GROUP

    @property
    def is_head(self) -> bool:
        return self.rank == 0

    @property
    def ip(self) -> str:
        return str(self.fabric_address.ip)

    @field_validator("uplink_interfaces")
    @classmethod
    def _netdevs(cls, value: list[str]) -> list[str]:
        for name in value:
            if not NETDEV_RE.match(name):
                raise ValueError(f"not an interface name: {name!r}")
        if len(set(value)) != len(value):
            raise ValueError("lists an interface twice")
        return value


def for_pair(name: str, pair: str) -> str:
    """A control-side file of one pair's own: ``name`` itself for an inventory of one cluster,
    ``<name>-<pair>`` for a named pair (.sparkrig/pair-token-pair_a, front-pair_a.crt)."""
    return f"{name}-{pair}" if pair else name


class Settings(BaseModel):
    """What one host's tasks need: its own rank, every rank, and the knobs."""

    model_config = ConfigDict(frozen=True)

    me: Rank
    ranks: tuple[Rank, ...]  # this rank's pair (its cluster): rank 0 first
    knobs: Knobs
    pair: str = ""  # the pair's name (host data ``pair``); "": the inventory is one cluster
    # every pair's head in inventory order, this pair's among them: the endpoint's members
    pair_heads: tuple[Rank, ...] = ()

    @property
    def other_heads(self) -> tuple[Rank, ...]:
        """The heads of every other pair behind the endpoint (none for one pair)."""
        return tuple(h for h in self.pair_heads if h.name != self.head.name)

    @property
    def pair_token_control(self) -> str:
        """The control side's copy of this pair's agents' secret (knob pair_token_file, one file
        per named pair: ``for_pair``); the only path of it the control side reads."""
        return for_pair(self.knobs.pair_token_file, self.pair)

    @property
    def head(self) -> Rank:
        return self.ranks[0]

    @property
    def workers(self) -> tuple[Rank, ...]:
        return self.ranks[1:]

    @property
    def nnodes(self) -> int:
        return len(self.ranks)

    @property
    def peers(self) -> tuple[Rank, ...]:
        """Whom this rank reaches over the fabric: the head every worker, a worker the head."""
        return self.workers if self.me.is_head else (self.head,)

    @property
    def others(self) -> tuple[Rank, ...]:
        """Every other rank: tensor parallel talks between every pair, so each proves them all."""
        return tuple(r for r in self.ranks if r.rank != self.me.rank)

    @property
    def fabric_network(self) -> ipaddress.IPv4Network:
        return self.head.fabric_address.network

    @property
    def fabric_plan(self) -> topology.Plan | None:
        """The fabric's addressing plan (fabric_layout "ports", docs/rings.md); None: one netdev
        per rank on one subnet (fabric_layout "single", the inventory's fabric_address)."""
        if self.layout != "ports":
            return None
        return fabric_plan(self.ranks, self.knobs.fabric_cidr)

    @property
    def layout(self) -> Literal["single", "ports"]:
        """fabric_layout as it applies to this inventory (``layout_of``)."""
        return layout_of(self.knobs.fabric_layout, self.nnodes)

    @property
    def fabric_rank(self) -> topology.RankPlan | None:
        """This rank's part of ``fabric_plan``."""
        plan = self.fabric_plan
        return plan.ranks[self.me.rank] if plan else None

    @property
    def relayed(self) -> bool:
        """True on a triangle or a ring (fabric_layout "ports", three ranks and more): no one
        fabric address of a rank reaches every other rank, so each rank dials each peer at its
        own address of the plan and meets the rendezvous on the LAN."""
        return self.fabric_plan is not None and self.nnodes > 2

    def dial(self, peer: Rank) -> str:
        """The fabric address this rank reaches ``peer``'s helpers and copy servers at: its one
        fabric address on one subnet and on a pair; on a triangle or a ring the plan's (the
        peer's address on the cable they share, else on the cable the route arrives by:
        ``topology.RankPlan.peer_addresses``)."""
        part = self.fabric_rank
        if part is None or not self.relayed or peer.rank == self.me.rank:
            return peer.ip  # itself: its first address (an argument only the others use)
        return str(part.peer_addresses[peer.rank])

    @property
    def listen_ips(self) -> tuple[str, ...]:
        """Where this rank's helpers and copy servers listen: every address a peer dials it at
        (``dial`` from each other rank): one on one subnet and on a pair, one per cable a peer
        arrives by on a triangle or a ring."""
        plan = self.fabric_plan
        if plan is None or not self.relayed:
            return (self.me.ip,)
        me = self.me.rank
        dialed = {p.peer_addresses[me] for n, p in enumerate(plan.ranks) if n != me}
        return tuple(str(a) for a in sorted(dialed))

    def listen_on(self, port: int) -> str:
        """``--listen`` of a helper or a copy server on ``port``: ``ADDR:PORT[,ADDR:PORT...]``,
        every address of ``listen_ips``."""
        return ",".join(f"{ip}:{port}" for ip in self.listen_ips)

    @property
    def helper_device(self) -> str | None:
        """The netdev the helpers' and copy servers' sockets are bound to (SO_BINDTODEVICE):
        the fabric netdev on one subnet and on a pair. None on a triangle or a ring: peers
        arrive over several netdevs (a ring of four relays them through a neighbour) and the
        answers leave the way the routes say, which a socket bound to the netdev it was reached
        on would refuse; the firewall keeps the fabric to the ranks there (every address of
        every other rank, nothing else: sparkrig.firewall)."""
        return None if self.relayed else self.me.fabric_interface

    def fabric_ips(self, rank: Rank) -> tuple[str, ...]:
        """Every fabric address of ``rank``: its one, or every function's of the plan."""
        plan = self.fabric_plan
        if plan is None:
            return (rank.ip,)
        return tuple(str(i.address.ip) for i in plan.ranks[rank.rank].ifaces)

    @property
    def rendezvous_ip(self) -> str:
        """Where every rank meets the head's rendezvous (the engine's master address, the NCCL
        smoke test's MASTER_ADDR): the head's fabric address on one subnet and on a pair, its
        LAN address (host data lan_address) on a triangle or a ring, as TensorFold's TP>2
        rule has it (no fabric address of the head reaches every rank directly; research
        tensorfold.md, config.sh; NCCL bootstraps on the LAN there too: fabricenv.socket_ifname)."""
        if self.relayed and self.head.lan_address is not None:
            return str(self.head.lan_address)
        return self.head.ip

    @property
    def busbw_floor_gbs(self) -> float:
        """The NCCL smoke test's busbw floor of this layout: one function (fabric_busbw_min_gbs)
        or both functions of the cable (fabric_ports_busbw_min_gbs, docs/rings.md)."""
        k = self.knobs
        return k.fabric_busbw_min_gbs if self.fabric_plan is None else k.fabric_ports_busbw_min_gbs

    @property
    def container_name(self) -> str:
        return f"sparkrig-rank{self.me.rank}"

    @property
    def unit_name(self) -> str:
        return f"sparkrig-{self.me.role}"

    @property
    def head_unit_name(self) -> str:
        return f"sparkrig-{HEAD_GROUP}"

    @property
    def stack(self) -> Stack:
        """The selected stack's declaration (knob ``stack``) as it runs on this inventory's
        rank count (``Stack.at``: its env by rank count)."""
        return get(self.knobs.stack).at(self.nnodes)

    @property
    def image_ref(self) -> str:
        """The stack's image, pinned by digest, as this run resolves it (``pinned_image``)."""
        image = pinned_image(self.knobs)
        if image is None:  # build refuses this before any task runs
            raise ValueError(f"stack {self.knobs.stack!r}: no image pinned")
        return image

    @property
    def model(self) -> Pin:
        """The checkpoint this run serves (``pinned_model``)."""
        return pinned_model(self.knobs)

    @property
    def drafter(self) -> Pin | None:
        """The drafter the stack pins (``pinned_drafter``), whether or not the profile loads it."""
        return pinned_drafter(self.knobs)

    @property
    def needs_drafter(self) -> bool:
        return self.stack.needs_drafter(self.knobs.profile)

    @property
    def locked_artifacts(self) -> list[tuple[str, str, str]]:
        """(name, repo, revision) of every artifact a rank needs, each pinned by a lockfile:
        the model, and the drafter when the profile needs it."""
        wanted = [("model", self.model.repo, self.model.revision)]
        drafter = self.drafter
        if self.needs_drafter and drafter is not None:
            wanted.append(("drafter", drafter.repo, drafter.revision))
        return wanted


def pinned(k: Knobs, key: str) -> str | None:
    """One pin (a key of PIN_KEYS) as set by the operator: the top-level knob, else
    ``stack_pins[stack]``; None leaves the stack's declaration."""
    value = getattr(k, key)
    return value if value is not None else k.stack_pins.get(k.stack, {}).get(key)


def pinned_image(k: Knobs) -> str | None:
    """base_image > stack_pins[stack]["base_image"] > the stack's image (None: it declares none)."""
    return pinned(k, "base_image") or get(k.stack).image


def pinned_model(k: Knobs) -> Pin:
    """The model repository and revision, each: knob > stack_pins[stack] > the declaration."""
    declared = get(k.stack).model
    return replace(
        declared,
        repo=pinned(k, "model_repo") or declared.repo,
        revision=pinned(k, "model_revision") or declared.revision,
    )


def pinned_drafter(k: Knobs) -> Pin | None:
    """The drafter, as ``pinned_model``; None when the stack declares none and none is set."""
    declared = get(k.stack).drafter or Pin("", "")
    repo = pinned(k, "drafter_repo") or declared.repo
    revision = pinned(k, "drafter_revision") or declared.revision
    return replace(declared, repo=repo, revision=revision) if repo and revision else None


def errors_of(host: str, err: ValidationError) -> list[str]:
    """One ``<host>: <key>: <why>`` line per error pydantic found in a host's data."""
    out = []
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"]) or "?"
        msg = e["msg"].removeprefix("Value error, ")
        out.append(f"{host}: {key}: {msg}")
    return out


def layout_of(knob: str, nnodes: int) -> Literal["single", "ports"]:
    """What fabric_layout means for ``nnodes`` ranks: "auto" is both functions of the cable for
    a pair ("ports": the field's most reported slowdown is NCCL on one function, docs/rings.md)
    and one netdev per rank on one subnet (a switch) for three ranks and more."""
    if knob == "auto":
        return "ports" if nnodes == 2 else "single"
    return "ports" if knob == "ports" else "single"


def resolved_ports(data: dict[str, Any], nnodes: int) -> dict[int, topology.Port]:
    """One host's QSFP ports for fabric_layout "ports", by index: ``fabric_ports`` entries, each
    name it leaves out derived from DGX OS's names; on three ranks and more a port it does not
    name is DGX OS's (``enp1s0f<i>np<i>``); a pair's one port is the one whose primary netdev
    is ``fabric_interface``. ValueError naming what is wrong."""
    given = data.get("fabric_ports") or {}
    if not isinstance(given, dict):
        raise ValueError(
            "must map a port index (0: the cage next to the RJ45 port, 1) to its netdevs, e.g. "
            "{0: {'netdev': 'enp1s0f0np0'}, 1: {'netdev': 'enp1s0f1np1'}}"
        )
    ports: dict[int, topology.Port] = {}
    for key, entry in given.items():
        if str(key) not in ("0", "1"):
            raise ValueError(f"port {key!r}: a Spark has ports 0 and 1")
        try:
            spec = FabricPort.model_validate(entry)
        except ValidationError as err:
            raise ValueError(f"port {key}: {errors_of('', err)[0].removeprefix(': ')}") from None
        try:
            ports[int(key)] = spec.port(int(key))
        except ValueError as err:
            raise ValueError(f"port {key}: {err}") from None
    if nnodes == 2:
        iface = data.get("fabric_interface") or ""
        named = [p for p in ports.values() if p.primary.netdev == iface]
        derived = topology.dgx_os_port(iface)
        if named:
            return {named[0].index: named[0]}
        if derived is not None and derived.index not in ports:
            if data.get("roce_device"):  # a name given wins over DGX OS's
                primary = topology.Function(iface, str(data["roce_device"]))
                derived = topology.Port(derived.index, primary, derived.twin)
            return {derived.index: derived}
        if iface:
            raise ValueError(
                f"fabric_interface {iface} is the primary netdev of no port: name its port in "
                "fabric_ports (a DGX OS name, enp1s0f<i>np<i>, needs none), or set "
                "fabric_layout = 'single' to serve on this one netdev"
            )
        return {}
    for index in topology.PORTS:
        ports.setdefault(index, topology.dgx_os_default(index))
    return ports


def pair_ports(ranks: list[Rank] | tuple[Rank, ...]) -> tuple[int, int] | None:
    """The port a pair's cable is in on each rank (its one resolved port), or None."""
    if len(ranks) != 2 or not all(len(r.ports) == 1 for r in ranks):
        return None
    return (next(iter(ranks[0].ports)), next(iter(ranks[1].ports)))


def fabric_plan(ranks: list[Rank] | tuple[Rank, ...], cidr: str) -> topology.Plan:
    """The addressing plan of ``ranks`` in inventory order (topology.derive); a pair whose
    ranks hold a fabric_address keeps them (typed, or the plan's own once planned: the same)."""
    typed = None
    if len(ranks) == 2 and all(r.fabric_address.network.prefixlen < 32 for r in ranks):
        typed = (ranks[0].fabric_address, ranks[1].fabric_address)
    return topology.derive([r.ports for r in ranks], cidr, pair_ports(ranks), typed)


def planned_ranks(ranks: list[Rank], cidr: str) -> list[Rank]:
    """``ranks`` with each one's fabric_interface and fabric_address its first planned netdev
    and address (a pair: the primary function of its port), so every phase that speaks to a
    rank over the fabric keeps one address per rank."""
    plan = fabric_plan(ranks, cidr)
    out = []
    for r, part in zip(ranks, plan.ranks, strict=True):
        first = part.ifaces[0]
        out.append(
            r.model_copy(update={"fabric_interface": first.netdev, "fabric_address": first.address})
        )
    return out


def api_scheme(k: Knobs) -> str:
    """What the front speaks: HTTPS unless ``api_tls`` is off."""
    return "https" if k.api_tls else "http"
