"""Every knob sparkrig has, with its default. Made from sparkrig/config/knobs.py, where each
knob is declared once (type, bounds, default, what and why) and validated before any host: edit
it there, then run `python3 -m sparkrig.config group-data --write`, never here. Override a knob
per group (head.py, worker.py), per host in the inventory, or on the command line with `--data
key=value`. Per-host keys (fabric_interface, fabric_address, roce_device, uplink_interfaces,
fabric_ports, lan_address, the head's api_url) belong in the inventory, not here."""

# --- connection -----------------------------------------------------------------------------
_sudo = True  # operators log in as a sudo-capable user (DGX OS default), not root

# --- stack: how GLM-5.3-Flash is served (docs/stacks.md) -----------------------------------
# One of the declared stacks (sparkrig/stacks/): vllm-nvfp4 is the NVFP4 vLLM v11 recipe of
# seeds 000-002. A stack pins its image, model and drafter; switching it is a release change.
stack = "vllm-nvfp4"  # the stack every rank serves (same on every host)
# Per-stack pins, {stack: {key: value}} with the keys base_image, model_repo, model_revision,
# drafter_repo, drafter_revision; a top-level knob of that name wins over them, and they win
# over the stack's declaration (e.g. the operator's own sfxnz-v13 image by digest).
stack_pins = {}  # per-stack overrides of the stack's pins

# --- model and drafter (pinned: a 40-hex commit, never a branch) -----------------------------
hub_endpoint = "https://huggingface.co"  # Hub (or mirror) base URL used for metadata and downloads
# None: the selected stack's pin (vllm-nvfp4: LibertAIDAI/GLM-5.3-Flash-NVFP4 @caca4e6a, the
# NVFP4 checkpoint, 181 GiB in 123 LFS files; incoai/GLM-5.3-Flash-DFlash2 @7d74cdd8, ~2.2 GB)
model_repo = None  # checkpoint repository; None: the stack's
model_revision = None  # commit the lockfile was made from; None: the stack's
drafter_repo = None  # speculative drafter repository; None: the stack's
drafter_revision = None  # drafter commit; None: the stack's
drafter_license_accepted = False  # drafter is CC BY-NC-ND 4.0: set True to fetch/use it
# Hub token: the one huggingface_hub finds on the control machine (HF_TOKEN, else the file
# `hf auth login` writes), copied 0600 to the head; no knob (sparkrig/hubtoken.py)
weights_verify = "quick"  # stamps (quick) or re-hash everything (full: refused while a rank serves)
lockfile_dir = "locks"  # control-side directory of <owner>--<name>.lock.json (refresh --stack)
purge_weights = False  # uninstall.py: True removes weights_dir too (kept by default)
keep_releases = 2  # releases (image, weights) kept after an upgrade passed its gates; 1: the new
bench_gate = True  # a changed release must reach 1 - bench_tolerance of the previous one's bench
bench_tolerance = 0.10  # share a bench figure may fall below the previous release's (bench.md)
bench_timeout_s = 1800  # the gate's short bench, run from the control machine, must end by then
bench_gate_runs = 3  # the gate's short bench runs this often; its median and p10 are both held
bench_acceptance_min = 0.10  # the drafter must accept this share of its draft tokens (bench.md)
# The soak gate (docs/operating.md "Soak"): a changed (or first) release is held under load on the
# head after the gates. 30 min x 4 streams: pip's NCCL 2.28.9 wedged a TP=2 pair of Sparks after
# 20-26 minutes of 4-way load (vllm-project/vllm#42354, #41725)
soak_minutes = 30  # 0: no soak
soak_streams = 4  # concurrent completions through the API front
soak_floor = 0.5  # a whole minute decoding under this share of the first minute's tokens fails

# --- install paths on the nodes ---------------------------------------------------------------
install_dir = "/opt/sparkrig"  # helper programs and patch files
config_dir = "/etc/sparkrig"  # per-rank env files
weights_dir = "/var/lib/sparkrig/models"  # checkpoint and drafter land here (~183 GiB per revision)
cache_dir = "/var/lib/sparkrig/cache"  # JIT caches (triton, flashinfer, vllm) kept across restarts
min_disk_free_gib = 64  # preflight: GiB left free where weights land after what is still to fetch
reach_check = True  # preflight: the head reaches the Hub / image registry it must download from

# --- host tuning ------------------------------------------------------------------------------
swappiness = 0  # vm.swappiness; 0 keeps the engine's pages out of swap
min_free_kbytes = None  # vm.min_free_kbytes to pin on every node; None: only check they are equal
memfree_min_gib = None  # start gate MemFree floor, GiB; None: util x MemTotal + margin (vLLM)
memfree_margin_gib = 1.5  # GiB above gpu_memory_utilization x MemTotal when the floor is derived
gpu_clock_max_mhz = None  # cap the GPU clock (nvidia-smi -lgc 0,<MHz>) at every boot; None: off
memfree_wait_s = 120  # how long the start gate keeps dropping caches before refusing to start
fabric_wait_s = 300  # start gate: wait this long for fabric carrier, address and RoCE GID (polled)

# --- fabric -----------------------------------------------------------------------------------
fabric_mtu = 9000  # MTU on the QSFP fabric NIC, persisted with netplan
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
fabric_layout = "auto"  # "auto" (a pair: ports), "single" (one netdev per rank) or "ports"
# One /24 per function class per cable is cut from it, in cable order (cable e: the 2e-th and
# (2e+1)-th /24), the port-0 end .1, the port-1 end .2: SparkRing's layout (docs/rings.md). A /21
# holds a ring of 4, a /20 one of 8. 198.18.0.0/15 is set aside for benchmarking (RFC 2544).
fabric_cidr = "198.18.0.0/20"  # "ports": the network every derived fabric subnet is cut from
# A link (one function class of one cable) that fails the full-MTU don't-fragment ping either way:
# "refuse" names it and stops; "omit" names it and leaves it out on both ends (its RDMA devices out
# of NCCL_IB_HCA). A cable with neither function answering is refused either way (docs/rings.md).
fabric_link_silent = "refuse"  # fabric_layout "ports": a link failing the DF ping: refuse | omit
fabric_netplan_file = "/etc/netplan/60-sparkrig-fabric.yaml"  # the netplan drop-in sparkrig owns
fabric_takeover = False  # True: move other netplan files / NM profiles naming the fabric NIC aside
roce_port = 1  # HCA port whose GID table is read
roce_device_restore = ["modprobe mlx5_ib"]  # run when the fabric NIC has no RoCE device (driver)
nccl_env = {}  # extra NCCL_* / runtime variables appended to every rank's env file

# --- image ------------------------------------------------------------------------------------
# The serving image pinned by digest (repo@sha256:<64 hex>); None: the selected stack's (vllm-nvfp4:
# the v11 image every working report used, docs/sources.md "Image", vLLM 0.1.dev20051+g487ecf187)
base_image = None  # image by digest; None: the stack's
base_image_known_bad_ok = False  # True lets a base image known to fail (stock vllm-openai) through
image_repo = "sparkrig/vllm-glm53"  # local name of the patched image; tag = content hash
container_gpu_args = ["--gpus", "all"]  # how the container gets the GPU; one token per element
container_memory = (
    "112g"  # --memory and --memory-swap cap: an OOM kills the container, not the host
)
container_pids_limit = 4096  # --pids-limit of a rank (threads count): bounds a fork/thread runaway
image_skip_patches = []  # patch names the build skips on purpose (the lab's stand-in has no vLLM)
image_copy_port = 29701  # the head serves the saved base image to workers here (fabric address)
image_transfer_dir = "/var/lib/sparkrig/images"  # where the base image tar is saved and received

# --- serving ----------------------------------------------------------------------------------
profile = None  # single | shared | guard | long; None: the stack's own (vllm-nvfp4: shared)
served_model_name = "glm-5.3-flash"  # name /v1/models reports and clients ask for
api_port = 8000  # OpenAI-compatible API on the head
api_auth = True  # /v1 needs a Bearer key (api_key_file); False: an open API, for a trusted LAN
api_key_file = ".sparkrig/api-key"  # control side: copy of the head's API key (used if it has none)
api_key_rotate = False  # True for one run: a new API key on the head, its serving restarted
# The API front (docs/front.md): nginx on the head serves api_port and checks the key; the engine
# listens on 127.0.0.1:engine_port only
engine_port = 8001  # the engine's own port, loopback only on the head; differs from api_port
api_cors_origins = []  # browser origins let in cross-origin ("https://host[:port]"); []: no CORS
api_conn_per_ip = 64  # in-flight requests one client address may hold at the front (429 beyond)
# Two pairs and more behind one endpoint (docs/pairs.md): a pair about to restart leaves the
# balance first, and its requests in flight may finish this long before its ranks stop
drain_timeout_s = 120  # pairs: the most a restarting pair waits for its requests in flight
# HTTPS by default: without tls_cert, a CA of the pair's own (docs/front.md "TLS") issues the
# front's certificate; clients trust <api_tls_dir>/ca.crt
api_tls = True  # False: plain HTTP (the key, prompts and answers cross the network in clear)
api_tls_dir = ".sparkrig/tls"  # control side: the CA, the heads' certificates (front[-<pair>].*)
api_tls_names = []  # extra DNS names or addresses clients dial the head by (its own are in)
api_tls_rotate = False  # True for one run: a new CA (clients must trust the new ca.crt)
tls_cert = None  # control-side path of the operator's PEM certificate chain, instead of the CA's
tls_key = None  # control-side path of its PEM private key (0600); set with tls_cert or not at all
master_port = 29521  # torch distributed rendezvous port on the head's fabric address
pair_port = 29600  # rank liveness beacon on each fabric address (stop-together)
pair_grace_s = 1800  # a rank's wait for its peers at start (the head's start gate; stop-together)
copy_port = 29700  # the head serves verified weights to workers here, on its fabric address
thinking_default = False  # reasoning off unless a request enables it; None: the template decides
extra_serve_args = []  # appended to the vllm serve command line of every rank
ready_timeout_s = 3600  # how long the deploy waits for the head's /health
nccl_smoke = True  # all-reduce in the serving image before each pair (re)start; must use IB/RoCE
nccl_smoke_timeout_s = 300  # rendezvous + all-reduce limit of the smoke test
nccl_smoke_bytes = 268435456  # 256 MiB per timed all-reduce, nccl-tests' plateau (docs/fabric.md)
nccl_smoke_warmup = 5  # untimed all-reduces before the timed ones (nccl-tests' default -w)
nccl_smoke_iters = 20  # timed all-reduces; their mean time gives busbw (nccl-tests' default -n)
# a release whose engine loaded an NCCL build listed as known bad (sparkrig/runtime.py KNOWN_BAD,
# each with its source) is refused before it serves (docs/runtime.md)
nccl_known_bad_ok = False  # True: serve on a known-bad NCCL build anyway, warned every run
# The smoke test's all-reduce bus bandwidth floor, nccl-tests' busbw (docs/fabric.md "Bandwidth
# floor"). Published: one RDMA function of the QSFP port 11.6-12.8 GB/s (himorishige/glm53-flash-
# 2x-dgx-spark-recipe README; MiaAI-Lab/GLM-5.3-Flash-EXL3-2x-DGX-Sparks#172), both functions
# 20.4-23.7 (MiaAI #118, #172; dgx-spark-playbooks#103), MTU 1500 1.5 (himorishige). Our env
# file names ONE function in the single layout (NCCL_IB_HCA), so a healthy pair measures ~12:
# a floor between one and both functions (16) would fail every such deploy. 8 (2/3 of one function)
# fails MTU 1500, a 13 Gb/s link (1.6), a dev NCCL build (3.04, #103), a function at half width;
# fabric_layout "ports" names both functions and uses fabric_ports_busbw_min_gbs instead (below).
fabric_busbw_min_gbs = 8.0  # GB/s; the smoke test fails below it (0: no floor)
# fabric_layout "ports" names both functions of the pair's cable in NCCL_IB_HCA: published 20.9
# (MiaAI-Lab/GLM-5.3-Flash-EXL3-2x-DGX-Sparks#172), 23.74 and 20.4 all_gather (NVIDIA/dgx-spark-
# playbooks#103, MiaAI #118); one function 11.6-12.8. 16 fails a pair with one function down or
# left out (12.8 < 16), with a quarter of margin under 20.4 (docs/rings.md). Not measured by us.
fabric_ports_busbw_min_gbs = 16.0  # GB/s; fabric_layout "ports": the floor over both functions
supervisor_max_restarts = 3  # head: ordered restarts of a pair that went down by itself, per window
supervisor_window_s = 21600  # the supervisor's restart budget window (6 h); then a human decides
watchdog = True  # head: restart the pair in order when the engine is wedged (/health can lie)
watchdog_grace_s = 3600  # no probing this long after a start; >= ready_timeout_s (cold boot)
watchdog_interval_s = 60  # seconds between probes
watchdog_fails = 3  # consecutive failed canary completions (idle engine) before the pair restarts
watchdog_stall_s = 300  # requests in flight and nothing in /metrics moved this long: a wedge
watchdog_max_restarts = 3  # restarts allowed per window; then the pair is left down for a human
watchdog_window_s = 21600  # the restart budget's window (6 h)
agent_port = 29601  # worker agent on the fabric: starts the worker rank when the head asks
pair_token_file = (
    ".sparkrig/pair-token"  # control side: agents' secret if no rank has one (pairs: <file>-<pair>)
)
pair_token_rotate = False  # True for one run: a new agents' secret on every rank, helpers restarted

# --- firewall (sparkrig/firewall.py, docs/firewall.md) ----------------------------------------
firewall = True  # table inet sparkrig: pair ports only from the fabric peers; False removes it
# Who may reach api_port on the head, as CIDRs (loopback always may). The private ranges by
# default: the pair serves the LAN it sits on, never the internet through a forwarded port; a
# client on a public address must be named. [] closes the API to all but loopback.
api_allow = [  # CIDRs api_port accepts (docs/firewall.md); the rest is dropped and counted
    "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "127.0.0.0/8", "::1/128", "fc00::/7",
]  # fmt: skip

# --- host baseline (sparkrig/baseline.py, docs/baseline.md) ----------------------------------
hold_baseline = True  # apt-mark hold the running kernel and NVIDIA driver packages
accept_baseline = False  # True for one run: release that hold for a planned kernel/driver upgrade
baseline_mismatch_ok = False  # True: converge ranks that differ on kernel, driver or NIC firmware
baseline_known_bad_ok = False  # True: converge a rank that matches known_bad_baselines
kho_off = True  # a kernel with kexec handover built in boots with kho=off (GRUB drop-in)
# A rank matching every condition of an entry is refused with its reason. Conditions: kernel,
# driver, nic_fw, base_image (regexes), driver_below (a version), kho_active (docs/baseline.md).
known_bad_baselines = [  # known-bad combinations, each with its reason and source thread
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
