"""Typed, validated settings: the only place that reads ``host.data``.

Inventory and group data go in; one ``Settings`` per host comes out, carrying the knobs and the
whole cluster (every rank's fabric address and interface), so tasks never touch ``host.data``. Every
problem in any host's data is collected and raised as one ``DeployError`` before any operation is
planned, so bad input never reaches a host.
"""

from __future__ import annotations

import difflib
import functools
import ipaddress
import re
from dataclasses import replace
from pathlib import PurePosixPath
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pyinfra.api.exceptions import DeployError

from sparkrig import fabricenv, hubtoken, lockfile, topology
from sparkrig.engines import engine_of
from sparkrig.runscope import once_per_run
from sparkrig.stacks import DEFAULT_STACK, STACKS, get
from sparkrig.stacks.base import Pin, Stack

HEAD_GROUP = "head"
WORKER_GROUP = "worker"
PROFILES = ("single", "shared", "guard", "long")
COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
DIGEST_REF_RE = re.compile(r"^[a-z0-9][a-z0-9._:/-]*@sha256:[0-9a-f]{64}$")
NETDEV_RE = re.compile(r"^[A-Za-z0-9_.:-]{1,15}$")
# Base images known not to serve GLM-5.3-Flash on GB10, by repository: reason (docs/sources.md).
# A digest cannot be traced back to its tag, so every digest of the stock repository is refused.
KNOWN_BAD_IMAGES = {
    "vllm/vllm-openai": (
        "the stock vLLM image (e.g. vllm/vllm-openai:glm53-flash-arm64-cu130) loads the weights, "
        "then dies in warmup on GB10 ('concat_and_cache_mla ... pe_dim must be 64 for "
        "fp8_ds_mla', docs/sources.md); use the default v11 image or another patched one"
    ),
}
REPO_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
# Per-host keys of the inventory (``Rank``); ssh_hostname, also read, is pyinfra's own.
HOST_KEYS = (
    "fabric_interface",
    "fabric_address",
    "roce_device",
    "uplink_interfaces",
    "api_url",
    "fabric_ports",  # fabric_layout "ports": the rank's QSFP ports by index (FabricPort)
    "lan_address",  # a triangle or a ring: the rank's LAN IPv4 address (the rendezvous's)
)
# Host data pyinfra 3.10's connectors read without declaring it in their ``data_meta``:
# pyinfra/connectors/chroot.py (chroot_directory), dockerssh.py (docker_image, docker_container_id).
PYINFRA_UNDECLARED_KEYS = ("chroot_directory", "docker_image", "docker_container_id")
# Knobs that are gone, with what replaced them (a plain "unknown key" would guess a wrong one).
RETIRED_KEYS = {
    "hf_token_file": "retired: the Hub token is the one huggingface_hub finds (HF_TOKEN, else "
    "the file `hf auth login` writes, which HF_TOKEN_PATH moves); remove the key",
}

# The knobs a stack pins (its declaration's image, model and drafter): each defaults to None, "the
# selected stack's pin"; stack_pins[<stack>] overrides them per stack, with these keys.
SAFE_PATH_RE = re.compile(r"/[A-Za-z0-9._/-]*")  # an owned path knob (see _absolute)
# A browser origin as the Origin header carries it: scheme, host (name, IPv4, [IPv6]), port
ORIGIN_RE = re.compile(r"https?://([A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\])(:[0-9]{1,5})?")
# a name a certificate may carry: a DNS name (no wildcard) or an IPv4/IPv6 address
DNS_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?"
DNS_OR_IP = re.compile(rf"{DNS_LABEL}(\.{DNS_LABEL})*|[0-9A-Fa-f.]*:[0-9A-Fa-f:.]*")

PIN_KEYS = ("base_image", "model_repo", "model_revision", "drafter_repo", "drafter_revision")

# Marks a knob that must hold one value across every rank (the pair runs one model with one
# config, and each rank calls the others' programs, files and ports by the same names).
CLUSTER = {"cluster": True}


def _cluster(**kw: Any) -> Any:
    """A cluster-wide knob: ``build`` refuses a value that differs between hosts."""
    return Field(json_schema_extra={"cluster": True}, **kw)


class KnownBadBaseline(BaseModel):
    """One entry of the catalogue ``known_bad_baselines``: a rank matching every condition it
    names is refused with ``reason`` (sparkrig/baseline.py ``known_bad``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    reason: str = Field(min_length=1)
    source: str = Field(pattern=r"^https?://\S+$")  # the thread the fact was taken from
    kernel: str | None = None  # regex on the kernel release
    driver: str | None = None  # regex on the NVIDIA driver version
    driver_below: str | None = Field(default=None, pattern=r"^\d+(\.\d+)*$")
    nic_fw: str | None = None  # regex on the fabric NIC's firmware version
    base_image: str | None = None  # regex on the base_image reference
    kho_active: bool | None = None  # kexec handover on in the running kernel

    @field_validator("kernel", "driver", "nic_fw", "base_image")
    @classmethod
    def _regex(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                re.compile(value)
            except re.error as err:
                raise ValueError(f"not a regular expression: {value!r} ({err})") from None
        return value

    @model_validator(mode="after")
    def _names_a_condition(self) -> KnownBadBaseline:
        conditions = ("kernel", "driver", "driver_below", "nic_fw", "base_image", "kho_active")
        if all(getattr(self, c) is None for c in conditions):
            raise ValueError(f"names no condition (one of {', '.join(conditions)})")
        return self


def pin_problem(key: str, value: Any) -> str | None:
    """Why ``value`` is no valid pin for ``key`` (one of PIN_KEYS), or None."""
    if not isinstance(value, str):
        return f"must be a string, not {value!r}"
    if key == "base_image" and not DIGEST_REF_RE.match(value):
        return f"must be pinned by digest (repo@sha256:<64 hex>), not {value!r}"
    if key.endswith("_revision") and not COMMIT_RE.match(value):
        return f"must be a 40-hex commit sha, not {value!r} (pin the revision)"
    if key.endswith("_repo") and not REPO_RE.match(value):
        return f"must be a Hub repository (owner/name), not {value!r}"
    return None


class Knobs(BaseModel):
    """Every knob of group_data/all.py, typed. ``build`` refuses a key that is neither a knob,
    a per-host key nor pyinfra's own (``unknown_keys``) before validating, so none is ignored.

    No knob has a default here: group_data/all.py holds each default once, so a knob missing
    from it is a validation error, not a silent second default."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    hub_endpoint: str = _cluster(pattern=r"^https?://[^\s/]+(/[^\s]*)?$")
    stack: str = _cluster()
    stack_pins: dict[str, dict[str, str]] = _cluster()
    model_repo: str | None = _cluster(pattern=REPO_RE.pattern)
    model_revision: str | None = _cluster()
    drafter_repo: str | None = _cluster(pattern=REPO_RE.pattern)
    drafter_revision: str | None = _cluster()
    drafter_license_accepted: bool = _cluster()
    lockfile_dir: str

    install_dir: str = _cluster()
    config_dir: str = _cluster()
    weights_dir: str = _cluster()
    cache_dir: str
    min_disk_free_gib: float = Field(ge=0)
    reach_check: bool

    swappiness: int = Field(ge=0, le=200)
    min_free_kbytes: int | None = _cluster(ge=1024)
    memfree_min_gib: float | None = Field(ge=0)
    memfree_margin_gib: float = Field(ge=0)
    # MHz for nvidia-smi -lgc 0,<MHz> (a value `nvidia-smi -q -d SUPPORTED_CLOCKS` lists)
    gpu_clock_max_mhz: int | None = _cluster(ge=100, le=5000)
    thinking_default: bool | None
    memfree_wait_s: int = Field(ge=0)
    fabric_wait_s: int = Field(ge=0)

    fabric_mtu: int = _cluster(ge=1280, le=9216)
    fabric_layout: Literal["auto", "single", "ports"] = _cluster()
    fabric_cidr: str = _cluster()
    fabric_link_silent: Literal["refuse", "omit"] = _cluster()
    fabric_netplan_file: str
    fabric_takeover: bool
    roce_port: int = Field(ge=1)
    roce_device_restore: list[str] = Field(min_length=1)
    nccl_env: dict[str, str] = _cluster()

    base_image: str | None = _cluster()
    base_image_known_bad_ok: bool
    image_repo: str = _cluster(pattern=r"^[a-z0-9][a-z0-9._/-]*$")
    container_gpu_args: list[str]
    container_memory: str = Field(pattern=r"^[0-9]+[bkmg]?$")
    container_pids_limit: int = Field(ge=256, le=4194304)
    image_skip_patches: list[str] = _cluster()
    image_copy_port: int = _cluster(ge=1, le=65535)
    image_transfer_dir: str = _cluster(pattern=r"^/")

    profile: Literal["single", "shared", "guard", "long"] = _cluster()
    served_model_name: str = _cluster(pattern=r"^[A-Za-z0-9._/-]+$")
    api_port: int = _cluster(ge=1, le=65535)
    api_auth: bool
    api_key_file: str = Field(min_length=1)
    api_key_rotate: bool
    engine_port: int = _cluster(ge=1, le=65535)
    api_cors_origins: list[str] = _cluster()
    api_conn_per_ip: int = Field(ge=1, le=65535)
    api_tls: bool = _cluster()
    api_tls_dir: str = Field(min_length=1)
    api_tls_names: list[str]
    api_tls_rotate: bool
    tls_cert: str | None = Field(min_length=1)
    tls_key: str | None = Field(min_length=1)
    master_port: int = _cluster(ge=1, le=65535)
    pair_port: int = _cluster(ge=1, le=65535)
    copy_port: int = _cluster(ge=1, le=65535)
    weights_verify: Literal["quick", "full"]
    pair_grace_s: int = _cluster(ge=10)
    extra_serve_args: list[str] = _cluster()
    ready_timeout_s: int = Field(ge=1)
    nccl_smoke: bool = _cluster()
    nccl_smoke_timeout_s: int = _cluster(ge=10)
    # equal on every rank: the ranks' collectives must match. At most 4 GiB: a 16 GiB nccl-tests
    # buffer froze a Spark (NVIDIA/dgx-spark-playbooks#102)
    nccl_smoke_bytes: int = _cluster(ge=2**20, le=2**32)
    nccl_smoke_warmup: int = _cluster(ge=0, le=1000)
    nccl_smoke_iters: int = _cluster(ge=1, le=10000)
    fabric_busbw_min_gbs: float = _cluster(ge=0)
    nccl_known_bad_ok: bool = _cluster()
    fabric_ports_busbw_min_gbs: float = _cluster(ge=0)
    watchdog: bool
    watchdog_grace_s: int = Field(ge=0)
    watchdog_interval_s: int = Field(ge=1)
    watchdog_fails: int = Field(ge=1)
    watchdog_stall_s: int = Field(ge=1)
    watchdog_max_restarts: int = Field(ge=0)
    watchdog_window_s: int = Field(ge=60)
    supervisor_max_restarts: int = Field(ge=0)
    supervisor_window_s: int = Field(ge=60)
    agent_port: int = _cluster(ge=1, le=65535)
    pair_token_file: str = _cluster()
    pair_token_rotate: bool = _cluster()
    firewall: bool = _cluster()
    api_allow: list[str]
    purge_weights: bool = _cluster()
    keep_releases: int = _cluster(ge=1, le=10)
    hold_baseline: bool
    accept_baseline: bool
    baseline_mismatch_ok: bool = _cluster()
    baseline_known_bad_ok: bool
    kho_off: bool
    known_bad_baselines: list[KnownBadBaseline] = _cluster()
    bench_gate: bool = _cluster()
    bench_tolerance: float = _cluster(ge=0, lt=1)
    bench_timeout_s: int = _cluster(ge=10)
    soak_minutes: float = _cluster(ge=0, le=1440)
    soak_streams: int = _cluster(ge=1, le=256)
    soak_floor: float = _cluster(ge=0, le=1)
    bench_gate_runs: int = _cluster(ge=1, le=10)
    bench_acceptance_min: float = _cluster(ge=0, le=1)

    @model_validator(mode="before")
    @classmethod
    def _stack_profile(cls, data: Any) -> Any:
        """``profile = None`` serves the selected stack's own profile (vllm-nvfp4: shared; a
        recipe that serves one configuration: that one), so `--data stack=<name>` alone switches."""
        if isinstance(data, dict) and data.get("profile") is None and "stack" in data:
            try:
                own = get(data["stack"]).own_profile
            except (ValueError, TypeError):  # an unknown stack: its own error names the choices,
                own = get(DEFAULT_STACK).own_profile  # and an unset profile is no second one
            data = {**data, "profile": own}
        return data

    @field_validator("model_revision", "drafter_revision")
    @classmethod
    def _pinned_commit(cls, value: str | None) -> str | None:
        if value is not None and (why := pin_problem("model_revision", value)):
            raise ValueError(why)
        return value

    @field_validator("base_image")
    @classmethod
    def _pinned_digest(cls, value: str | None) -> str | None:
        if value is not None and (why := pin_problem("base_image", value)):
            raise ValueError(why)
        return value

    @field_validator("stack")
    @classmethod
    def _declared_stack(cls, value: str) -> str:
        return get(value).name  # ValueError naming the declared stacks

    @field_validator("stack_pins")
    @classmethod
    def _stack_pins(cls, value: dict[str, dict[str, str]]) -> dict[str, dict[str, str]]:
        problems = []
        for stack, pins in value.items():
            if stack not in STACKS:
                problems.append(f"[{stack!r}]: unknown stack; choose among {', '.join(STACKS)}")
                continue
            for key, pin in pins.items():
                if key not in PIN_KEYS:
                    problems.append(
                        f"[{stack!r}][{key!r}]: unknown pin; the keys are {', '.join(PIN_KEYS)}"
                    )
                elif why := pin_problem(key, pin):
                    problems.append(f"[{stack!r}][{key!r}]: {why}")
        if problems:
            raise ValueError("; ".join(problems))
        return value

    @field_validator("install_dir", "config_dir", "weights_dir", "cache_dir", "fabric_netplan_file")
    @classmethod
    def _absolute(cls, value: str) -> str:
        if not PurePosixPath(value).is_absolute():
            raise ValueError(f"must be an absolute path, not {value!r}")
        # these paths reach unit files, shell commands and the watchdog's probe unquoted in
        # places: letters, digits and . _ - / only (no `$(`, quote, space or newline)
        if not SAFE_PATH_RE.fullmatch(value) or "/../" in f"{value}/":
            raise ValueError(
                f"{value!r}: only letters, digits and . _ - / (no spaces, quotes, `$`, `..` or "
                "newlines: the path lands in unit files and shell commands)"
            )
        return value

    @field_validator("fabric_cidr")
    @classmethod
    def _fabric_cidr(cls, value: str) -> str:
        try:
            net = ipaddress.IPv4Network(value, strict=True)
        except ValueError as err:
            raise ValueError(f"not an IPv4 network: {value!r} ({err})") from None
        if net.prefixlen > topology.LINK_PREFIX:
            raise ValueError(
                f"{value} is smaller than one /{topology.LINK_PREFIX} (each function class of "
                "each cable gets a /24 of it)"
            )
        return str(net)

    @field_validator("container_gpu_args")
    @classmethod
    def _one_token_each(cls, value: list[str]) -> list[str]:
        for token in value:
            if not token or any(c.isspace() for c in token):
                raise ValueError(f"one argument per element (docker splits nothing), got {token!r}")
        return value

    @field_validator("extra_serve_args")
    @classmethod
    def _non_empty(cls, value: list[str]) -> list[str]:
        if any(not token for token in value):
            raise ValueError("empty argument")
        for token in value:  # a newline would split the rank unit's ExecStart into two lines
            if any(not c.isprintable() for c in token):
                raise ValueError(
                    f"{token!r}: a control character (newline, tab, ...) in an argument"
                )
        return value

    @field_validator("api_cors_origins")
    @classmethod
    def _origins(cls, value: list[str]) -> list[str]:
        for origin in value:
            if not ORIGIN_RE.fullmatch(origin):
                raise ValueError(
                    f"{origin!r} is not an origin: scheme://host[:port], no path, no wildcard "
                    "(the front compares the browser's Origin header with it exactly)"
                )
        return value

    @model_validator(mode="after")
    def _tls_pair(self) -> Knobs:
        if (self.tls_cert is None) != (self.tls_key is None):
            given = "tls_cert" if self.tls_cert is not None else "tls_key"
            raise ValueError(
                f"{given} is set alone: the front serves the operator's certificate with "
                "tls_cert and tls_key together, the pair's CA's with neither"
            )
        if not self.api_tls and self.tls_cert is not None:
            raise ValueError(
                "tls_cert is set while api_tls = False: the front serves plain HTTP then; "
                "drop tls_cert and tls_key, or set api_tls = True"
            )
        return self

    @field_validator("api_tls_names")
    @classmethod
    def _tls_names(cls, value: list[str]) -> list[str]:
        for name in value:
            if not DNS_OR_IP.fullmatch(name):
                raise ValueError(
                    f"{name!r} is neither a DNS name nor an IP address (letters, digits, '-' "
                    "and '.', or an IPv4/IPv6 address; no wildcard)"
                )
        return value

    @field_validator("api_allow", mode="before")
    @classmethod
    def _comma_separated(cls, value: Any) -> Any:
        """``--data api_allow=10.1.0.0/16,fd00::/8`` arrives as one string: a comma list."""
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("api_allow")
    @classmethod
    def _cidrs(cls, value: list[str]) -> list[str]:
        """Each entry a network (``10.0.0.0/8``, ``fd00::/8``, or one address); returned in
        canonical form. Host bits set (``10.1.2.3/8``) are refused: a typo, not a network."""
        out = []
        for entry in value:
            try:
                net = ipaddress.ip_network(str(entry), strict=True)
            except ValueError as err:
                raise ValueError(f"not a CIDR network: {entry!r} ({err})") from None
            out.append(str(net))
        return out

    @field_validator("nccl_env")
    @classmethod
    def _env_names(cls, value: dict[str, str]) -> dict[str, str]:
        for key, val in value.items():
            if not re.match(r"^[A-Z_][A-Z0-9_]*$", key) or "\n" in str(val):
                raise ValueError(f"bad environment entry {key!r}={val!r}")
        return value


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


class Settings(BaseModel):
    """What one host's tasks need: its own rank, every rank, and the knobs."""

    model_config = ConfigDict(frozen=True)

    me: Rank
    ranks: tuple[Rank, ...]
    knobs: Knobs

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


def _fmt(host: str, err: ValidationError) -> list[str]:
    out = []
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"]) or "?"
        msg = e["msg"].removeprefix("Value error, ")
        out.append(f"{host}: {key}: {msg}")
    return out


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
    """Validate the whole inventory; return Settings per host name or raise one DeployError."""
    problems: list[str] = []
    heads = view.groups.get(HEAD_GROUP, [])
    workers = view.groups.get(WORKER_GROUP, [])

    if len(heads) != 1:
        names = ", ".join(n for n, _ in heads) or "none"
        problems.append(f"inventory: group 'head' must hold exactly one host (rank 0), has {names}")
    if not workers:
        problems.append("inventory: group 'worker' must hold at least one host (ranks 1..N-1)")
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
            problems.extend(_ports_layout_keys(name, data, nnodes))
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
                problems.extend(_fmt(name, err))
        except ValueError as err:
            problems.append(f"{name}: fabric_address: {err}")
        try:
            knobs[name] = Knobs.model_validate(data)
        except ValidationError as err:
            problems.extend(_fmt(name, err))

    first = next(iter(knobs.values()), None)
    ports_plan = first is not None and layout_of(first.fabric_layout, nnodes) == "ports"
    if ports_plan:
        problems.extend(typed_pair_problems(ranks))
    if not problems and first is not None and ports_plan:
        try:
            ranks = planned_ranks(ranks, first.fabric_cidr)
        except topology.PlanError as err:
            problems.extend(f"inventory: fabric_layout 'ports': {p}" for p in err.problems)
    problems.extend(_cluster_problems(ranks, knobs))
    if not problems and first is not None and ports_plan:
        problems.extend(fabric_env_refusals(ranks, first))
    if problems:
        said = said_once(problems, [n for n, _ in [*heads, *workers]])
        raise DeployError("invalid inventory or data:\n  " + "\n  ".join(said))

    as_tuple = tuple(ranks)
    return {r.name: Settings(me=r, ranks=as_tuple, knobs=knobs[r.name]) for r in ranks}


def layout_of(knob: str, nnodes: int) -> Literal["single", "ports"]:
    """What fabric_layout means for ``nnodes`` ranks: "auto" is both functions of the cable for
    a pair ("ports": the field's most reported slowdown is NCCL on one function, docs/rings.md)
    and one netdev per rank on one subnet (a switch) for three ranks and more."""
    if knob == "auto":
        return "ports" if nnodes == 2 else "single"
    return "ports" if knob == "ports" else "single"


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


def _ports_layout_keys(name: str, data: dict[str, Any], nnodes: int) -> list[str]:
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
            raise ValueError(f"port {key}: {_fmt('', err)[0].removeprefix(': ')}") from None
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


def _cluster_problems(ranks: list[Rank], knobs: dict[str, Knobs]) -> list[str]:
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


def cluster_keys() -> tuple[str, ...]:
    """The knobs declared cluster-wide (``_cluster``), in declaration order."""
    return tuple(n for n, f in Knobs.model_fields.items() if f.json_schema_extra == CLUSTER)


def known_bad_image(ref: str) -> str | None:
    """Why a base image reference is known to fail (KNOWN_BAD_IMAGES), or None."""
    name = ref.split("@", 1)[0]
    for prefix in ("docker.io/", "registry-1.docker.io/", "index.docker.io/"):
        name = name.removeprefix(prefix)
    repo = name.rsplit(":", 1)[0] if ":" in name.rsplit("/", 1)[-1] else name
    return KNOWN_BAD_IMAGES.get(repo)


def current() -> Settings:
    """Settings for the host pyinfra is preparing now (validates the whole inventory once)."""
    from pyinfra import host
    from pyinfra.context import ctx_inventory

    return for_inventory(ctx_inventory.get())[host.name]  # the real object, not the proxy


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


def for_inventory(inventory: Any) -> dict[str, Settings]:
    """Validate once per inventory object (the deploy file runs once per host), lockfiles
    included: a missing or stale lockfile, or a gated repo with no Hub token on this machine,
    stops the run before any command reaches a host."""

    def validate() -> dict[str, Settings]:
        settings = build(view_of(inventory))
        if why := not_applied(settings):
            raise DeployError(why)
        if why := lockfile_refusal(settings):
            raise DeployError(why)
        return settings

    return once_per_run("settings", inventory, validate)


def api_scheme(k: Knobs) -> str:
    """What the front speaks: HTTPS unless ``api_tls`` is off."""
    return "https" if k.api_tls else "http"


def api_url(s: Settings) -> str:
    """The head's API as the control machine reaches it: the head's host data ``api_url``
    (the lab forwards the port to loopback), else https://<its ssh_hostname or inventory
    name>:<api_port> (http:// with api_tls off). The bench and the release's bench gate both
    measure this."""
    default = f"{api_scheme(s.knobs)}://{s.head.address}:{s.knobs.api_port}"
    return (s.head.api_url or default).rstrip("/")


def api_ca_file(s: Settings) -> str | None:
    """The CA a client of the head's API verifies it with: the pair's own (``api_tls_dir``)
    unless the operator's certificate (tls_cert) or plain HTTP; None: the system's trust."""
    k = s.knobs
    return f"{k.api_tls_dir.rstrip('/')}/ca.crt" if k.api_tls and k.tls_cert is None else None


def drafter_lock(s: Settings) -> str | None:
    """The control side's lockfile of the drafter the profile loads (its files' sha256, what
    the bench records beside the drafter's acceptance); None when the profile loads none."""
    drafter = s.drafter
    if not s.needs_drafter or drafter is None:
        return None
    return str(lockfile.lock_path(s.knobs.lockfile_dir, drafter.repo))


def api_target(inventory: Any) -> dict[str, Any]:
    """What `python3 -m sparkrig.bench --inventory` measures: the head's API as the control
    machine reaches it (``api_url``), the served model, the profile and the control side's API
    key file (None when api_auth is off), the stack it serves and on how many ranks (its
    published figures), and the drafter's lockfile (``drafter_lock``)."""
    s = next(v for v in build(view_of(inventory)).values() if v.me.is_head)
    k = s.knobs
    return {
        "stack": k.stack,
        "url": api_url(s),
        "model": k.served_model_name,
        "profile": k.profile,
        "api_key_file": k.api_key_file if k.api_auth else None,
        "ca_file": api_ca_file(s),
        "nnodes": s.nnodes,
        "drafter_lock": drafter_lock(s),
    }
