"""What a stack declares: one frozen value per way of serving GLM-5.3-Flash on the pair.

A stack is an engine family (its engine builds argv, readiness, metrics: ``sparkrig/engines/``),
an image pinned by digest (with sparkrig's patch layer or none), a model and a drafter at pinned
commits, per-rank environment, how the API is authenticated, its gates, what the watchdog reads
for progress, its memory gate, the caches a rank mounts, the stop order and the figures it is
expected to reach, each with its source. Adding a stack is adding one declaration (one module of
``sparkrig/stacks/``); a new engine family adds one module of ``sparkrig/engines/``.

This module knows no domain beyond the declaration itself: no settings, no pyinfra.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Literal

# The engine family: a key of sparkrig.engines.ENGINES (its adapter), e.g. "vllm", "tensorfold"
Family = str
# What a stack's memory gate measures (the stacks disagree: docs/stacks.md):
# memfree: /proc/meminfo MemFree (sparkrig's own start gate, today's default);
# used: free(1)'s "used" column must stay below the floor (Entrpi's 6 GB preflight);
# available: MemAvailable must reach the floor (MiaAI's / TensorFold's budget).
MemoryMeasure = Literal["memfree", "used", "available"]
# vllm-api-key: the engine checks the key itself (VLLM_API_KEY); front: the engine has no key,
# binds 127.0.0.1:<engine_port> on the head and the authenticating front serves api_port; none:
# nothing checks a key
ApiAuth = Literal["vllm-api-key", "front", "none"]
# How the watchdog reads an engine's progress (files/sparkhost/wedge.py PARSERS): vLLM's
# Prometheus /metrics, or TensorFold's /health JSON counters
ProgressParser = Literal["vllm-metrics", "tensorfold-health"]
# How the pair's ranks stop (tasks/pair_stop.py): every rank in one step, or one side first.
StopOrder = Literal["together", "head-first", "workers-first"]
# How the ranks start (``Stack.start_waves``): every worker at once, then rank 0 (sparkrig's
# ordered start, tasks/pair_start.py); or one rank at a time from the last to rank 0
# (TensorFold's N-rank scripts: workers TP-1 .. 1, then rank 0).
StartOrder = Literal["workers-first", "last-to-first"]


@dataclass(frozen=True)
class Pin:
    """A Hub repository at one commit (the lockfile is made from exactly this)."""

    repo: str
    revision: str  # 40-hex commit
    why: str = ""  # why this commit (where the recipe pins none, sparkrig says why it chose it)
    license_note: str = ""  # e.g. "CC BY-NC-ND 4.0: needs drafter_license_accepted"


@dataclass(frozen=True)
class Profile:
    """One serve profile of a stack (the knob ``profile``): the numbers its engine is started
    with. The family adapter turns them into flags (vLLM: ``engines/vllm.py``); a number left
    None adds no flag (a recipe that sets its limits in ``serve_flags`` declares only its
    speculation here)."""

    name: str  # the value of the `profile` knob: single | shared | guard | long
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    kv_cache_memory_bytes: int | None = None  # None: the engine sizes the KV pool itself
    max_num_batched_tokens: int | None = None  # None: the engine's default
    speculative: str | None = None  # "dflash" (loads the stack's drafter), "mtp" or None
    num_speculative_tokens: int = 0
    logits_processors: tuple[str, ...] = ()
    doc: str = ""  # one line: what it is for and its figure, with the source


@dataclass(frozen=True)
class Figure:
    """A published figure the stack is expected to reach, with where it was published: the one
    source of published figures (sparkrig/bench/published.py judges bench results by them, the
    README's stacks table shows them). A figure of a bench protocol (``seed000``, ``seed004``) is
    named as the bench's result names it (sparkrig/bench/expected.py ``lookup``)."""

    name: str  # e.g. "single_stream_tok_s", "decode_tok_s.8", "prose_decode_tok_s"
    value: float  # the figure, or the low end of a published range
    unit: str  # "tok/s", "s", "U+FFFD/10k chars", "tokens"
    protocol: str  # the protocol it was measured with ("seed000", "seed004", the publisher's)
    source: str  # seed file or URL
    profile: str = ""  # the profile it was measured with ("" when the stack serves one)
    upper: float | None = None  # the high end of a published range (None: a single figure)
    condition: str = ""  # what was measured, as the source says it
    lower_is_better: bool = False  # a latency or a defect rate
    causes: str = ""  # the likely causes when a run falls short (the recipe's own experience)
    # the rank count it was measured on (None: the stack's only one); the bench picks a result's
    # figures by its nnodes (sparkrig/bench/published.py)
    nodes: int | None = None

    # the shape sparkrig/bench/expected.py judges (its Figure protocol)
    @property
    def figure(self) -> str:
        return self.name

    @property
    def low(self) -> float:
        return self.value

    @property
    def high(self) -> float:
        return self.value if self.upper is None else self.upper


@dataclass(frozen=True)
class StackFile:
    """A file the stack's recipe provides beside its image (e.g. sfxnz's chat template): one
    file of a GitHub repository at one commit, fetched by the head (sparkrig/stackfiles.py) and
    mounted read-only into the ranks that use it."""

    name: str  # the file's name on the host (under the stack files directory)
    repo: str  # GitHub owner/name
    commit: str  # 40-hex commit: the raw URL at a commit serves that commit's bytes only
    path: str  # the file's path in the repository
    container_path: str  # where the rank's container sees it (read-only)
    # sha256 of the bytes, checked after the download; None: not known from a checked source
    # (the commit URL pins it; the head logs the digest it fetched)
    sha256: str | None = None
    head_only: bool = True  # only rank 0 mounts it (a chat template: the API is rank 0's)
    why: str = ""  # what the recipe uses it for, with its source

    @property
    def url(self) -> str:
        return f"https://raw.githubusercontent.com/{self.repo}/{self.commit}/{self.path}"


@dataclass(frozen=True)
class MemoryGate:
    measure: MemoryMeasure
    floor_gib: float | None  # None: derived as today (gpu_memory_utilization x MemTotal + margin)
    source: str = ""


@dataclass(frozen=True)
class Stack:
    """One stack, in one place. Field by field, what the layer needs to deploy, gate, watch,
    switch and measure it."""

    name: str  # the value of the `stack` knob, e.g. "vllm-nvfp4"
    family: Family
    title: str  # one line for the README's stacks table
    # reference pinned by digest; None: the operator must give one (why in image_note)
    image: str | None
    # where the image comes from; for None, why there is no published one and how to build it
    image_note: str
    patched: bool  # True: sparkrig builds its patch layer (files/Dockerfile + files/patches) on top
    model: Pin
    drafter: Pin | None  # None: this stack loads no drafter
    # per-rank environment beyond sparkrig's own (same on every rank): the rank env file's last
    # lines, after the fabric/NCCL set and the runtime lines every stack gets
    # (templates/rank.env.j2: VLLM_HOST_IP, HF_HUB_OFFLINE, TRANSFORMERS_OFFLINE,
    # VLLM_ENGINE_READY_TIMEOUT_S=3600, VLLM_NO_USAGE_STATS=1, PYTORCH_CUDA_ALLOC_CONF)
    env: Mapping[str, str]
    profiles: Mapping[str, Profile]  # the sparkrig profiles it serves, by name (knob `profile`)
    # env names the engine's stock release does not know, with their source in docs
    fork_env: tuple[str, ...] = ()
    fork_flags: tuple[str, ...] = ()  # serve flags (or flag=value) only the stack's fork accepts
    # the recipe's own flags for every rank (the family adapter adds the rest)
    serve_flags: tuple[str, ...] = ()
    head_flags: tuple[str, ...] = ()  # flags only rank 0 gets (e.g. a chat template)
    api_auth: ApiAuth = "vllm-api-key"
    readiness_path: str = "/health"
    progress_metrics: tuple[str, ...] = ()  # /metrics names whose movement the watchdog reads
    # the watchdog's progress reader (wedge.PARSERS; None: the engine's, engines.progress_parser)
    # and the engine path it reads
    progress_parser: ProgressParser | None = None
    progress_path: str = "/metrics"
    # the torch/TCPStore rendezvous port the stack's engine uses on the head's fabric address;
    # None: the master_port knob (vLLM's)
    master_port: int | None = None
    # how many Sparks the stack serves on (() : any the inventory has)
    nodes: tuple[int, ...] = ()
    # env added to ``env`` at one rank count (``at``): what the recipe sets by TP
    env_by_nodes: Mapping[int, Mapping[str, str]] = field(default_factory=dict)
    # the fabric layouts it runs on (() : any); a stack whose per-rank env comes from the
    # fabric plan (topology.fabric_env) names "ports"
    fabric_layouts: tuple[str, ...] = ()
    # what the engine needs in each rank's fabric env (topology.fabric_env), by rank count: checked
    # against it (engines/tensorfold.py fabric_env_problems), never written by the stack
    fabric_env_needs: Mapping[int, Mapping[str, str]] = field(default_factory=dict)
    # docker run options the recipe gives every rank beyond sparkrig's own (e.g. --shm-size)
    run_flags: tuple[str, ...] = ()
    memory: MemoryGate = MemoryGate("memfree", None)
    # container path -> what it caches; each is mounted from the persistent cache_dir, per image
    # (one cache: <cache_dir>/<image>; several: <cache_dir>/<image>/<path made a name>)
    caches: Mapping[str, str] = field(default_factory=dict)
    stop_order: StopOrder = "together"  # the recipe's own, with its source
    start_order: StartOrder = "workers-first"  # the recipe's own, with its source
    # files the recipe provides beside its image (sparkrig/stackfiles.py fetches and mounts them)
    files: tuple[StackFile, ...] = ()
    figures: tuple[Figure, ...] = ()
    sources: tuple[str, ...] = ()  # where the declaration's facts were read
    default_profile: str = ""  # what `profile = None` serves; "": the first declared profile

    def __post_init__(self) -> None:
        if self.default_profile and self.default_profile not in self.profiles:
            raise ValueError(f"stack {self.name!r}: default_profile not among its profiles")

    @property
    def own_profile(self) -> str:
        """The profile the knob's None selects: the declared default, else the first one."""
        return self.default_profile or next(iter(self.profiles))

    def profile(self, name: str) -> Profile:
        """The profile ``name``; ValueError naming the profiles this stack serves."""
        try:
            return self.profiles[name]
        except KeyError:
            raise ValueError(
                f"unknown profile {name!r} for stack {self.name!r}; choose one of "
                f"{', '.join(self.profiles)}"
            ) from None

    def at(self, nnodes: int) -> Stack:
        """The declaration as it runs on ``nnodes`` Sparks: ``env`` with ``env_by_nodes``'s
        entries for that count; the stack itself when it declares none."""
        extra = self.env_by_nodes.get(nnodes)
        if not extra:
            return self
        return replace(self, env={**self.env, **extra}, env_by_nodes={})

    def start_waves(self, nnodes: int) -> tuple[tuple[int, ...], ...]:
        """The ranks in start order, one tuple per step (each step's ranks start together, the
        next step once they did): ``workers-first`` every worker, then rank 0;
        ``last-to-first`` rank nnodes-1, ..., rank 1, then rank 0."""
        if nnodes < 1:
            raise ValueError(f"nnodes must be >= 1, got {nnodes!r}")
        workers = tuple(range(1, nnodes))
        if self.start_order == "last-to-first":
            return tuple((r,) for r in reversed(workers)) + ((0,),)
        return ((workers,) if workers else ()) + ((0,),)

    def needs_drafter(self, profile: str) -> bool:
        """True when the profile loads the stack's drafter (its licence, its download)."""
        return self.profile(profile).speculative == "dflash"
