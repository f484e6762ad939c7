"""Every knob sparkrig has, declared once: its name, type and bounds (the field), its default
(``_knob``'s or ``_cluster``'s first argument), what it is (the string under it), its section and
why (the comments above it). group_data/all.py is made from this file, to the byte:
``python3 -m sparkrig.config group-data --write`` writes it and ``table --write`` the knob table of
docs/configuration.md; tests/unit/test_knob_table.py fails when either differs.

The model has no default: a knob missing from a host's data (group_data/all.py left out, a key
deleted) is a validation error, never a silent second default. ``build`` (sparkrig/config/
inventory.py) refuses a key that is neither a knob, a per-host key nor pyinfra's own before
validating, so none is ignored. The checks of one knob's value are ``KnobChecks``'
(sparkrig/config/checks.py); those across knobs and hosts are in sparkrig/config/rules.py."""

# ruff: noqa: E501 (the comments in the class are group_data/all.py's lines, up to 100 wide there)

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import ConfigDict, Field, model_validator

from sparkrig.config.checks import REPO_RE, KnobChecks, KnownBadBaseline

# Marks a knob that must hold one value across every rank (the pair runs one model with one
# config, and each rank calls the others' programs, files and ports by the same names).
CLUSTER = "cluster"


def _knob(default: Any, **field: Any) -> Any:
    """A knob's field: the bounds pydantic checks, and the default group_data/all.py gets (kept
    aside as ``json_schema_extra["default"]``: the model itself requires the key)."""
    return Field(json_schema_extra={"default": default}, **field)


def _cluster(default: Any, **field: Any) -> Any:
    """A cluster-wide knob: ``build`` refuses a value that differs between hosts."""
    return Field(json_schema_extra={"default": default, CLUSTER: True}, **field)


# The defaults written over several lines, at the column group_data/all.py has them: the generator
# copies each from here as written, the knob's string after its opening bracket.
API_ALLOW = [
    "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "127.0.0.0/8", "::1/128", "fc00::/7",
]  # fmt: skip

KNOWN_BAD_BASELINES = [
    {
        "kho_active": True,
        "reason": (
            "kexec handover is on (the 7.0 kernels enable it by default, e.g. 7.0.0-1019-nvidia): "
            "its ~9.3 GiB of scratch pageblocks cannot be pinned long-term, so NCCL's memory "
            "registration fails (ibv_reg_mr_iova2: Cannot allocate memory); 6.17 kernels work. "
            "Boot with kho=off: sparkrig writes its GRUB drop-in only once this check passes, so "
            "put it there by hand on this Spark (docs/baseline.md): `echo "
            "'GRUB_CMDLINE_LINUX=\"$GRUB_CMDLINE_LINUX kho=off\"' | sudo tee "
            "/etc/default/grub.d/90-sparkrig-kho.cfg && sudo update-grub && sudo reboot`"
        ),
        "source": "https://github.com/MiaAI-Lab/DeepSeek-v4.1-Flash-DGX-Sparks/issues/14",
    },
    # A base image built for a newer driver than the ranks run fails at start ("This container
    # was built for NVIDIA Driver Release 590.48 or later, but version 580.159.03 was detected",
    # https://github.com/eugr/spark-vllm-docker/issues/266). Pin such an image, then add e.g.:
    # {"base_image": r"^registry/repo@", "driver_below": "590.48", "reason": ..., "source": ...},
]


class Knobs(KnobChecks):
    """Every knob of group_data/all.py, typed, in its order. ``_sudo`` is pyinfra's own host
    data, no knob (a ClassVar, no field): here because group_data/all.py gives it to every host."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    # --- connection -----------------------------------------------------------------------------
    _sudo: ClassVar[bool] = True
    """operators log in as a sudo-capable user (DGX OS default), not root"""

    # --- stack: how GLM-5.3-Flash is served (docs/stacks.md) -----------------------------------
    # One of the declared stacks (sparkrig/stacks/): vllm-nvfp4 is the NVFP4 vLLM v11 recipe of
    # seeds 000-002. A stack pins its image, model and drafter; switching it is a release change.
    stack: str = _cluster("vllm-nvfp4")
    """the stack every rank serves (same on every host)"""
    # Per-stack pins, {stack: {key: value}} with the keys base_image, model_repo, model_revision,
    # drafter_repo, drafter_revision; a top-level knob of that name wins over them, and they win
    # over the stack's declaration (e.g. the operator's own sfxnz-v13 image by digest).
    stack_pins: dict[str, dict[str, str]] = _cluster({})
    """per-stack overrides of the stack's pins"""

    # --- model and drafter (pinned: a 40-hex commit, never a branch) -----------------------------
    hub_endpoint: str = _cluster("https://huggingface.co", pattern=r"^https?://[^\s/]+(/[^\s]*)?$")
    """Hub (or mirror) base URL used for metadata and downloads"""
    # None: the selected stack's pin (vllm-nvfp4: LibertAIDAI/GLM-5.3-Flash-NVFP4 @caca4e6a, the
    # NVFP4 checkpoint, 181 GiB in 123 LFS files; incoai/GLM-5.3-Flash-DFlash2 @7d74cdd8, ~2.2 GB)
    model_repo: str | None = _cluster(None, pattern=REPO_RE.pattern)
    """checkpoint repository; None: the stack's"""
    model_revision: str | None = _cluster(None)
    """commit the lockfile was made from; None: the stack's"""
    drafter_repo: str | None = _cluster(None, pattern=REPO_RE.pattern)
    """speculative drafter repository; None: the stack's"""
    drafter_revision: str | None = _cluster(None)
    """drafter commit; None: the stack's"""
    drafter_license_accepted: bool = _cluster(False)
    """drafter is CC BY-NC-ND 4.0: set True to fetch/use it"""
    # Hub token: the one huggingface_hub finds on the control machine (HF_TOKEN, else the file
    # `hf auth login` writes), copied 0600 to the head; no knob (sparkrig/hubtoken.py)
    weights_verify: Literal["quick", "full"] = _knob("quick")
    """stamps (quick) or re-hash everything (full: refused while a rank serves)"""
    lockfile_dir: str = _knob("locks")
    """control-side directory of <owner>--<name>.lock.json (refresh --stack)"""
    purge_weights: bool = _cluster(False)
    """uninstall.py: True removes weights_dir too (kept by default)"""
    keep_releases: int = _cluster(2, ge=1, le=10)
    """releases (image, weights) kept after an upgrade passed its gates; 1: the new"""
    bench_gate: bool = _cluster(True)
    """a changed release must reach 1 - bench_tolerance of the previous one's bench"""
    bench_tolerance: float = _cluster(0.10, ge=0, lt=1)
    """share a bench figure may fall below the previous release's (bench.md)"""
    bench_timeout_s: int = _cluster(1800, ge=10)
    """the gate's short bench, run from the control machine, must end by then"""
    bench_gate_runs: int = _cluster(3, ge=1, le=10)
    """the gate's short bench runs this often; its median and p10 are both held"""
    bench_acceptance_min: float = _cluster(0.10, ge=0, le=1)
    """the drafter must accept this share of its draft tokens (bench.md)"""
    # The soak gate (docs/operating.md "Soak"): a changed (or first) release is held under load on the
    # head after the gates. 30 min x 4 streams: pip's NCCL 2.28.9 wedged a TP=2 pair of Sparks after
    # 20-26 minutes of 4-way load (vllm-project/vllm#42354, #41725)
    soak_minutes: float = _cluster(30, ge=0, le=1440)
    """0: no soak"""
    soak_streams: int = _cluster(4, ge=1, le=256)
    """concurrent completions through the API front"""
    soak_floor: float = _cluster(0.5, ge=0, le=1)
    """a whole minute decoding under this share of the first minute's tokens fails"""

    # --- install paths on the nodes ---------------------------------------------------------------
    install_dir: str = _cluster("/opt/sparkrig")
    """helper programs and patch files"""
    config_dir: str = _cluster("/etc/sparkrig")
    """per-rank env files"""
    weights_dir: str = _cluster("/var/lib/sparkrig/models")
    """checkpoint and drafter land here (~183 GiB per revision)"""
    cache_dir: str = _knob("/var/lib/sparkrig/cache")
    """JIT caches (triton, flashinfer, vllm) kept across restarts"""
    min_disk_free_gib: float = _knob(64, ge=0)
    """preflight: GiB left free where weights land after what is still to fetch"""
    reach_check: bool = _knob(True)
    """preflight: the head reaches the Hub / image registry it must download from"""

    # --- host tuning ------------------------------------------------------------------------------
    swappiness: int = _knob(0, ge=0, le=200)
    """vm.swappiness; 0 keeps the engine's pages out of swap"""
    min_free_kbytes: int | None = _cluster(None, ge=1024)
    """vm.min_free_kbytes to pin on every node; None: only check they are equal"""
    memfree_min_gib: float | None = _knob(None, ge=0)
    """start gate MemFree floor, GiB; None: util x MemTotal + margin (vLLM)"""
    memfree_margin_gib: float = _knob(1.5, ge=0)
    """GiB above gpu_memory_utilization x MemTotal when the floor is derived"""
    gpu_clock_max_mhz: int | None = _cluster(
        None,
        # MHz for nvidia-smi -lgc 0,<MHz> (a value `nvidia-smi -q -d SUPPORTED_CLOCKS` lists)
        ge=100,
        le=5000,
    )
    """cap the GPU clock (nvidia-smi -lgc 0,<MHz>) at every boot; None: off"""
    memfree_wait_s: int = _knob(120, ge=0)
    """how long the start gate keeps dropping caches before refusing to start"""
    fabric_wait_s: int = _knob(300, ge=0)
    """start gate: wait this long for fabric carrier, address and RoCE GID (polled)"""

    # --- fabric -----------------------------------------------------------------------------------
    fabric_mtu: int = _cluster(9000, ge=1280, le=9216)
    """MTU on the QSFP fabric NIC, persisted with netplan"""
    # How the fabric is laid out (docs/rings.md). "auto": "ports" for a pair, "single" for three
    # ranks and more. "ports": both PCIe functions of every cabled port (a pair: the port
    # fabric_interface names, its twin's netdev and RDMA device by DGX OS's names or host data
    # fabric_ports; the primary keeps the inventory's fabric_address and the twin takes the buddy
    # subnet with the same host number, 10.200.0.1/24 -> 10.200.1.1/24, or both from fabric_cidr
    # when none is typed; three and more: both ports, cabled port 0 of rank i to port 1 of rank i+1,
    # every address from fabric_cidr, lan_address). "single": one netdev per rank (fabric_interface,
    # fabric_address), every rank on one subnet: a switch, or a pair held to one function. NCCL on
    # one function is the slowdown the field reports most (~12 GB/s of ~21: docs/rings.md).
    # Triangles and rings run stack "tensorfold-ring" only (plan tested); others are refused there.
    fabric_layout: Literal["auto", "single", "ports"] = _cluster("auto")
    '"auto" (a pair: ports), "single" (one netdev per rank) or "ports"'
    # One /24 per function class per cable is cut from it, in cable order (cable e: the 2e-th and
    # (2e+1)-th /24), the port-0 end .1, the port-1 end .2: SparkRing's layout (docs/rings.md). A /21
    # holds a ring of 4, a /20 one of 8. 198.18.0.0/15 is set aside for benchmarking (RFC 2544).
    fabric_cidr: str = _cluster("198.18.0.0/20")
    '"ports": the network every derived fabric subnet is cut from'
    # A link (one function class of one cable) that fails the full-MTU don't-fragment ping either way:
    # "refuse" names it and stops; "omit" names it and leaves it out on both ends (its RDMA devices out
    # of NCCL_IB_HCA). A cable with neither function answering is refused either way (docs/rings.md).
    fabric_link_silent: Literal["refuse", "omit"] = _cluster("refuse")
    'fabric_layout "ports": a link failing the DF ping: refuse | omit'
    fabric_netplan_file: str = _knob("/etc/netplan/60-sparkrig-fabric.yaml")
    """the netplan drop-in sparkrig owns"""
    fabric_takeover: bool = _knob(False)
    """True: move other netplan files / NM profiles naming the fabric NIC aside"""
    roce_port: int = _knob(1, ge=1)
    """HCA port whose GID table is read"""
    roce_device_restore: list[str] = _knob(["modprobe mlx5_ib"], min_length=1)
    """run when the fabric NIC has no RoCE device (driver)"""
    nccl_env: dict[str, str] = _cluster({})
    """extra NCCL_* / runtime variables appended to every rank's env file"""

    # --- image ------------------------------------------------------------------------------------
    # The serving image pinned by digest (repo@sha256:<64 hex>); None: the selected stack's (vllm-nvfp4:
    # the v11 image every working report used, docs/sources.md "Image", vLLM 0.1.dev20051+g487ecf187)
    base_image: str | None = _cluster(None)
    """image by digest; None: the stack's"""
    base_image_known_bad_ok: bool = _knob(False)
    """True lets a base image known to fail (stock vllm-openai) through"""
    image_repo: str = _cluster("sparkrig/vllm-glm53", pattern=r"^[a-z0-9][a-z0-9._/-]*$")
    """local name of the patched image; tag = content hash"""
    container_gpu_args: list[str] = _knob(["--gpus", "all"])
    """how the container gets the GPU; one token per element"""
    container_memory: str = _knob("112g", pattern=r"^[0-9]+[bkmg]?$")
    """--memory and --memory-swap cap: an OOM kills the container, not the host"""
    container_pids_limit: int = _knob(4096, ge=256, le=4194304)
    """--pids-limit of a rank (threads count): bounds a fork/thread runaway"""
    image_skip_patches: list[str] = _cluster([])
    """patch names the build skips on purpose (the lab's stand-in has no vLLM)"""
    image_copy_port: int = _cluster(29701, ge=1, le=65535)
    """the head serves the saved base image to workers here (fabric address)"""
    image_transfer_dir: str = _cluster("/var/lib/sparkrig/images", pattern=r"^/")
    """where the base image tar is saved and received"""

    # --- serving ----------------------------------------------------------------------------------
    profile: Literal["single", "shared", "guard", "long"] = _cluster(None)
    """single | shared | guard | long; None: the stack's own (vllm-nvfp4: shared)"""
    served_model_name: str = _cluster("glm-5.3-flash", pattern=r"^[A-Za-z0-9._/-]+$")
    """name /v1/models reports and clients ask for"""
    api_port: int = _cluster(8000, ge=1, le=65535)
    """OpenAI-compatible API on the head"""
    api_auth: bool = _knob(True)
    """/v1 needs a Bearer key (api_key_file); False: an open API, for a trusted LAN"""
    api_key_file: str = _knob(".sparkrig/api-key", min_length=1)
    """control side: copy of the head's API key (used if it has none)"""
    api_key_rotate: bool = _knob(False)
    """True for one run: a new API key on the head, its serving restarted"""
    # The API front (docs/front.md): nginx on the head serves api_port and checks the key; the engine
    # listens on 127.0.0.1:engine_port only
    engine_port: int = _cluster(8001, ge=1, le=65535)
    """the engine's own port, loopback only on the head; differs from api_port"""
    api_cors_origins: list[str] = _cluster([])
    'browser origins let in cross-origin ("https://host[:port]"); []: no CORS'
    api_conn_per_ip: int = _knob(64, ge=1, le=65535)
    """in-flight requests one client address may hold at the front (429 beyond)"""
    # Two pairs and more behind one endpoint (docs/pairs.md): a pair about to restart leaves the
    # balance first, and its requests in flight may finish this long before its ranks stop
    drain_timeout_s: int = _knob(120, ge=0, le=3600)
    """pairs: the most a restarting pair waits for its requests in flight"""
    # HTTPS by default: without tls_cert, a CA of the pair's own (docs/front.md "TLS") issues the
    # front's certificate; clients trust <api_tls_dir>/ca.crt
    api_tls: bool = _cluster(True)
    """False: plain HTTP (the key, prompts and answers cross the network in clear)"""
    api_tls_dir: str = _knob(".sparkrig/tls", min_length=1)
    """control side: the CA, the heads' certificates (front[-<pair>].*)"""
    api_tls_names: list[str] = _knob([])
    """extra DNS names or addresses clients dial the head by (its own are in)"""
    api_tls_rotate: bool = _knob(False)
    """True for one run: a new CA (clients must trust the new ca.crt)"""
    tls_cert: str | None = _knob(None, min_length=1)
    """control-side path of the operator's PEM certificate chain, instead of the CA's"""
    tls_key: str | None = _knob(None, min_length=1)
    """control-side path of its PEM private key (0600); set with tls_cert or not at all"""
    master_port: int = _cluster(29521, ge=1, le=65535)
    """torch distributed rendezvous port on the head's fabric address"""
    pair_port: int = _cluster(29600, ge=1, le=65535)
    """rank liveness beacon on each fabric address (stop-together)"""
    pair_grace_s: int = _cluster(1800, ge=10)
    """a rank's wait for its peers at start (the head's start gate; stop-together)"""
    copy_port: int = _cluster(29700, ge=1, le=65535)
    """the head serves verified weights to workers here, on its fabric address"""
    thinking_default: bool | None = _knob(False)
    """reasoning off unless a request enables it; None: the template decides"""
    extra_serve_args: list[str] = _cluster([])
    """appended to the vllm serve command line of every rank"""
    ready_timeout_s: int = _knob(3600, ge=1)
    """how long the deploy waits for the head's /health"""
    nccl_smoke: bool = _cluster(True)
    """all-reduce in the serving image before each pair (re)start; must use IB/RoCE"""
    nccl_smoke_timeout_s: int = _cluster(300, ge=10)
    """rendezvous + all-reduce limit of the smoke test"""
    nccl_smoke_bytes: int = _cluster(
        268435456,
        # equal on every rank: the ranks' collectives must match. At most 4 GiB: a 16 GiB
        # nccl-tests buffer froze a Spark (NVIDIA/dgx-spark-playbooks#102)
        ge=2**20,
        le=2**32,
    )
    """256 MiB per timed all-reduce, nccl-tests' plateau (docs/fabric.md)"""
    nccl_smoke_warmup: int = _cluster(5, ge=0, le=1000)
    """untimed all-reduces before the timed ones (nccl-tests' default -w)"""
    nccl_smoke_iters: int = _cluster(20, ge=1, le=10000)
    """timed all-reduces; their mean time gives busbw (nccl-tests' default -n)"""
    # a release whose engine loaded an NCCL build listed as known bad (sparkrig/runtime.py KNOWN_BAD,
    # each with its source) is refused before it serves (docs/runtime.md)
    nccl_known_bad_ok: bool = _cluster(False)
    """True: serve on a known-bad NCCL build anyway, warned every run"""
    # The smoke test's all-reduce bus bandwidth floor, nccl-tests' busbw (docs/fabric.md "Bandwidth
    # floor"). Published: one RDMA function of the QSFP port 11.6-12.8 GB/s (himorishige/glm53-flash-
    # 2x-dgx-spark-recipe README; MiaAI-Lab/GLM-5.3-Flash-EXL3-2x-DGX-Sparks#172), both functions
    # 20.4-23.7 (MiaAI #118, #172; dgx-spark-playbooks#103), MTU 1500 1.5 (himorishige). Our env
    # file names ONE function in the single layout (NCCL_IB_HCA), so a healthy pair measures ~12:
    # a floor between one and both functions (16) would fail every such deploy. 8 (2/3 of one function)
    # fails MTU 1500, a 13 Gb/s link (1.6), a dev NCCL build (3.04, #103), a function at half width;
    # fabric_layout "ports" names both functions and uses fabric_ports_busbw_min_gbs instead (below).
    fabric_busbw_min_gbs: float = _cluster(8.0, ge=0)
    """GB/s; the smoke test fails below it (0: no floor)"""
    # fabric_layout "ports" names both functions of the pair's cable in NCCL_IB_HCA: published 20.9
    # (MiaAI-Lab/GLM-5.3-Flash-EXL3-2x-DGX-Sparks#172), 23.74 and 20.4 all_gather (NVIDIA/dgx-spark-
    # playbooks#103, MiaAI #118); one function 11.6-12.8. 16 fails a pair with one function down or
    # left out (12.8 < 16), with a quarter of margin under 20.4 (docs/rings.md). Not measured by us.
    fabric_ports_busbw_min_gbs: float = _cluster(16.0, ge=0)
    'GB/s; fabric_layout "ports": the floor over both functions'
    supervisor_max_restarts: int = _knob(3, ge=0)
    """head: ordered restarts of a pair that went down by itself, per window"""
    supervisor_window_s: int = _knob(21600, ge=60)
    """the supervisor's restart budget window (6 h); then a human decides"""
    watchdog: bool = _knob(True)
    """head: restart the pair in order when the engine is wedged (/health can lie)"""
    watchdog_grace_s: int = _knob(3600, ge=0)
    """no probing this long after a start; >= ready_timeout_s (cold boot)"""
    watchdog_interval_s: int = _knob(60, ge=1)
    """seconds between probes"""
    watchdog_fails: int = _knob(3, ge=1)
    """consecutive failed canary completions (idle engine) before the pair restarts"""
    watchdog_stall_s: int = _knob(300, ge=1)
    """requests in flight and nothing in /metrics moved this long: a wedge"""
    watchdog_max_restarts: int = _knob(3, ge=0)
    """restarts allowed per window; then the pair is left down for a human"""
    watchdog_window_s: int = _knob(21600, ge=60)
    """the restart budget's window (6 h)"""
    agent_port: int = _cluster(29601, ge=1, le=65535)
    """worker agent on the fabric: starts the worker rank when the head asks"""
    pair_token_file: str = _cluster(".sparkrig/pair-token")
    """control side: agents' secret if no rank has one (pairs: <file>-<pair>)"""
    pair_token_rotate: bool = _cluster(False)
    """True for one run: a new agents' secret on every rank, helpers restarted"""

    # --- firewall (sparkrig/firewall.py, docs/firewall.md) ----------------------------------------
    firewall: bool = _cluster(True)
    """table inet sparkrig: pair ports only from the fabric peers; False removes it"""
    # Who may reach api_port on the head, as CIDRs (loopback always may). The private ranges by
    # default: the pair serves the LAN it sits on, never the internet through a forwarded port; a
    # client on a public address must be named. [] closes the API to all but loopback.
    api_allow: list[str] = _knob(API_ALLOW)
    """CIDRs api_port accepts (docs/firewall.md); the rest is dropped and counted"""

    # --- host baseline (sparkrig/baseline.py, docs/baseline.md) ----------------------------------
    hold_baseline: bool = _knob(True)
    """apt-mark hold the running kernel and NVIDIA driver packages"""
    accept_baseline: bool = _knob(False)
    """True for one run: release that hold for a planned kernel/driver upgrade"""
    baseline_mismatch_ok: bool = _cluster(False)
    """True: converge ranks that differ on kernel, driver or NIC firmware"""
    baseline_known_bad_ok: bool = _knob(False)
    """True: converge a rank that matches known_bad_baselines"""
    kho_off: bool = _knob(True)
    """a kernel with kexec handover built in boots with kho=off (GRUB drop-in)"""
    # A rank matching every condition of an entry is refused with its reason. Conditions: kernel,
    # driver, nic_fw, base_image (regexes), driver_below (a version), kho_active (docs/baseline.md).
    known_bad_baselines: list[KnownBadBaseline] = _cluster(KNOWN_BAD_BASELINES)
    """known-bad combinations, each with its reason and source thread"""

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


def cluster_keys() -> tuple[str, ...]:
    """The knobs declared cluster-wide (``_cluster``), in declaration order."""
    return tuple(
        n
        for n, f in Knobs.model_fields.items()
        if isinstance(f.json_schema_extra, dict) and f.json_schema_extra.get(CLUSTER)
    )
