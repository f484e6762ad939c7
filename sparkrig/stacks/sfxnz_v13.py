"""Stack `sfxnz-v13`: sfxnz's NVFP4 recipe on its local image chain glm53-sm121-v13 (vLLM).

Every value below was read at its source; docs/stacks-facts.md §S has each with its status word,
docs/stacks.md ("sfxnz-v13") the choices sparkrig made and how to build the image. Short names:

- run.sh: sfxnz/GLM-5.3-Flash-NVFP4-vLLM-2x-DGX-Spark run.sh generated from recipe.yaml, the
  version with the nvidia defaults (stored copy id 70870169816; commit not returned by the index)
- args: the same repository's evidence/e0-nvidia-v11/docker-args-head.json at commit
  458f099f8872e9043d79c353903e7180fa382de4, the head rank's argv as Docker recorded it at a boot
- v8: the same repository's docker/Dockerfile.sm121-v8@a4b7e29f60eb3bfdc54db67c8af85fa83796e247

What the vllm family adapter adds, so it is not in ``serve_flags``: the model directory, the
topology flags (--tensor-parallel-size, --distributed-executor-backend mp, --nnodes, --node-rank,
--master-addr, --master-port), --host/--port/--served-model-name on rank 0 (run.sh serves
``nvidia/GLM-5.3-Flash-NVFP4``; sparkrig's name is the `served_model_name` knob), --headless on
rank > 0, the speculative config with sparkrig's drafter directory (profile `single`: dflash,
7 tokens, as run.sh), and --default-chat-template-kwargs from the `thinking_default` knob (run.sh:
``{"enable_thinking": false}``, sparkrig's default).

Fabric env: sparkrig's rank.env keeps its own NCCL set (one HCA pinned, GID index by value,
NCCL_IB_ADDR_RANGE, NCCL_CROSS_NIC=0); run.sh's NCCL_CROSS_NIC=1 and its missing GID index are
not carried over (one rail, one NIC: cross-NIC has nothing to cross).
"""

from __future__ import annotations

from sparkhost.wedge import GENERATION_TOKENS, PROMPT_TOKENS, RUNNING

from sparkrig.stacks.base import Figure, MemoryGate, Pin, Profile, Stack, StackFile

REPO = "sfxnz/GLM-5.3-Flash-NVFP4-vLLM-2x-DGX-Spark"
RUN_SH = f"{REPO} run.sh, nvidia defaults (stored copy id 70870169816)"
ARGS = (
    f"{REPO} evidence/e0-nvidia-v11/docker-args-head.json@458f099f8872e9043d79c353903e7180fa382de4"
)
V8 = f"{REPO} docker/Dockerfile.sm121-v8@a4b7e29f60eb3bfdc54db67c8af85fa83796e247"
SEED_003 = "seed 003 (shared/seeds/003_b876b9038c2c4cb2.txt)"
README = f"{REPO} README (stored copy id 70887864586, research stacks.md 'Published speed')"

# The template rank 0 serves with (run.sh mounts it on rank 0 only: the stock template leaks
# chain-of-thought). sparkrig carries no copy: the head fetches it at this commit
# (sparkrig/stackfiles.py) and only rank 0 mounts it. Its sha256 is not in a checked source:
# the commit URL pins the bytes, and the head logs the digest it fetched (docs/stacks.md).
CHAT_TEMPLATE_COMMIT = "f59cb7cc41c3ee32146782900d87133f538b5d30"
CHAT_TEMPLATE_SOURCE = f"{REPO}: chat_template.jinja@{CHAT_TEMPLATE_COMMIT}"
CHAT_TEMPLATE_PATH = "/chat_template.jinja"  # in the container, as run.sh mounts it
CHAT_TEMPLATE = StackFile(
    name="chat_template.jinja",
    repo=REPO,
    commit=CHAT_TEMPLATE_COMMIT,
    path="chat_template.jinja",
    container_path=CHAT_TEMPLATE_PATH,
    sha256=None,  # unverified against GitHub: no checked source gives it
    head_only=True,
    why=f"run.sh mounts it on rank 0 for --chat-template ({RUN_SH})",
)

# The chain and why sparkrig cannot build it (the message settings give without an image).
IMAGE_CHAIN = (
    "sfxnz's image glm53-sm121-v13 is a local chain v8 -> v9 -> v10 -> v11 -> v13 on "
    "vllm/vllm-openai:glm53-flash-arm64-cu130 (a tag; sfxnz records no digest) that was never "
    "published. It cannot be built from a clean clone of the recipe: Dockerfile.sm121-v8 COPYs "
    "docker/patch_v7.py, which is not in the repository, and v8 pip-installs FlashInfer "
    "nightlies and NCCL/CUTLASS wheels, so it needs network at build (sparkrig builds with "
    "--network none). Build it yourself (docs/stacks.md, 'sfxnz-v13'), push it to a registry "
    "the head can pull from, and give it by digest: base_image or "
    "stack_pins['sfxnz-v13']['base_image'] = 'registry/glm53-sm121-v13@sha256:<64 hex>'"
)

# Read only by the image's own patch layers (run.sh refuses any GLM53_* on an image not named
# glm53-sm121-v13*): not variables of stock vLLM. The last two are set only when
# PREFILL_DEQUANT_MIN_M is not 0 (default 0: absent).
FORK_ENV = (
    "GLM53_NVFP4_W4A16",
    "GLM53_INT8_W8A16",
    "GLM53_KPOOL_TAIL_FIX",
    "GLM53_ADAPTIVE_VERIFY",
    "GLM53_ADAPTIVE_VERIFY_TAU",
    "GLM53_WQ_DEQUANT_MIN_M",
    "GLM53_WQ_DEQUANT_GROUPS",
)

# The recipe's own flags, the same on every rank (what the adapter adds: the docstring).
SERVE_FLAGS = (
    "--max-model-len", "327680",  # run.sh refuses more on the fp8 KV pin
    "--kv-cache-dtype", "fp8_e4m3",
    # the KV pin, 4.14 GiB (run.sh writes --kv-cache-memory, argparse's abbreviation of this
    # flag; 5.14 GiB crashed under load, none at all NV_ERR_NO_MEMORY)
    "--kv-cache-memory-bytes", "4445787956",
    "--gpu-memory-utilization", "0.85",
    "--max-num-seqs", "2",
    # run.sh: 1, 2, 4, then (num_speculative_tokens + 1) x i for i = 1..max_num_seqs
    "--compilation-config", '{"cudagraph_capture_sizes":[1,2,4,8,16]}',
    "--block-size", "2304",
    "--moe-backend", "marlin",  # run.sh refuses others: non-Marlin JIT OOMs on UMA
    "--linear-backend", "marlin",
    "--tool-call-parser", "glm47",
    "--enable-auto-tool-choice",
    "--reasoning-parser", "glm45",
    "--mm-processor-cache-gb", "1",
    "--limit-mm-per-prompt", '{"image":4,"video":1}',
    "--override-generation-config", '{"max_new_tokens": 65536}',
    "--trust-remote-code",
)  # fmt: skip

STACK = Stack(
    name="sfxnz-v13",
    family="vllm",
    title="sfxnz v13: vLLM on the local glm53-sm121-v13 chain, nvidia NVFP4, DFlash2",
    image=None,
    image_note=IMAGE_CHAIN,
    patched=False,  # the chain carries its own patches (v8 .. v13); sparkrig adds none
    model=Pin(
        repo="nvidia/GLM-5.3-Flash-NVFP4",
        revision="09b04e5e74bca08ca8549fc736d4cdd8624bfde3",
        why="run.sh's SNAPSHOT_REV, the revision docker-args-head.json recorded at boot",
        license_note="sfxnz's README: the base model's licence (MIT); the card was not read",
    ),
    drafter=Pin(
        repo="incoai/GLM-5.3-Flash-DFlash2",
        revision="7d74cdd881ed7e32c31175984a67823127b66cfe",
        why="run.sh's DRAFT_REV (bf582e4 and dc77ff1 are weights-only updates sfxnz did not adopt)",
        license_note="CC BY-NC-ND 4.0: needs drafter_license_accepted",
    ),
    env={
        # run.sh, every rank; rank.env already has VLLM_ENGINE_READY_TIMEOUT_S=3600 and
        # PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, the same values
        "HF_HOME": "/cache/huggingface",
        "TORCH_CUDA_ARCH_LIST": "12.1a",
        "FLASHINFER_CUDA_ARCH_LIST": "12.1a",
        "FLASHINFER_DISABLE_VERSION_CHECK": "1",
        # the image's switches (all off inside the image unless set)
        "GLM53_NVFP4_W4A16": "draft",  # DRAFT_WEIGHTS=nvfp4: the drafter in NVFP4 W4A16
        "GLM53_INT8_W8A16": "shared,mla,kda_o,kda_in,lm_head",
        "GLM53_KPOOL_TAIL_FIX": "1",
        "GLM53_ADAPTIVE_VERIFY": "1",
        "GLM53_ADAPTIVE_VERIFY_TAU": "0.3",
        # JIT caches under the per-image mount (JIT_CACHE=1, run.sh's default)
        "FLASHINFER_WORKSPACE_BASE": "/jit-cache/flashinfer",
        "VLLM_CACHE_ROOT": "/jit-cache/vllm",
        "DG_JIT_CACHE_DIR": "/jit-cache/vllm/deep_gemm",
        "TRITON_CACHE_DIR": "/jit-cache/triton",
        "TILELANG_CACHE_DIR": "/jit-cache/tilelang",
    },
    fork_env=FORK_ENV,
    fork_flags=(),  # every flag parses and validates with stock vLLM 0.33.0 (facts §S.4)
    serve_flags=SERVE_FLAGS,
    head_flags=("--chat-template", CHAT_TEMPLATE_PATH),
    # the recipe serves one configuration; sparkrig names it `single` (speculation only)
    profiles={
        "single": Profile(
            "single",
            speculative="dflash",
            num_speculative_tokens=7,
            doc="DFlash2 drafter, 7 tokens: run.sh's speculative config",
        )
    },
    api_auth="vllm-api-key",  # run.sh sets no key; stock vLLM's VLLM_API_KEY route
    readiness_path="/health",  # stock vLLM's route (run.sh polls /v1/models)
    progress_metrics=(RUNNING, GENERATION_TOKENS, PROMPT_TOKENS),  # stock vLLM names
    # run.sh has no memory preflight (it drops caches before each start): sparkrig's own MemFree
    # gate, its floor derived from --gpu-memory-utilization as today
    memory=MemoryGate("memfree", None, source=f"{RUN_SH}: no preflight; sparkrig's own gate"),
    caches={
        # run.sh: $JIT_CACHE_DIR/<first 12 hex of this node's image ID>:/jit-cache, "a new
        # image never reuses kernels built by an old one"
        "/jit-cache": "FlashInfer, vLLM (torch.compile, DeepGEMM), Triton, TileLang JIT caches",
        "/cache": "HF_HOME=/cache/huggingface (trust-remote-code modules)",
    },
    # run.sh starts rank 1 first (sleep 25 s), then rank 0;
    # stop.sh@a4b7e29f60eb3bfdc54db67c8af85fa83796e247 runs `docker rm -f` on the head first
    # (stop_local), then on the worker over ssh
    stop_order="head-first",
    files=(CHAT_TEMPLATE,),
    figures=(
        # seed 003: sfxnz's ruler v2, 8 short prose prompts, 512 forced tokens, greedy, thinking
        # off, mean of 3 boots; the bench's seed000 protocol is seeds 000's and 003's
        # (sparkrig/bench/protocol.py), so its results are judged by these
        Figure(
            "single_stream_tok_s",
            30.0,
            "tok/s",
            "seed000",
            SEED_003,
            "single",
            condition="DFlash2-7, 8 short prose prompts, 512 forced tokens, thinking off, "
            "mean of 3 boots",
        ),
        Figure(
            "ttft_p50_s",
            0.26,
            "s",
            "seed000",
            SEED_003,
            "single",
            condition="TTFT p50 of the prose prompts, 1 request",
            lower_is_better=True,
        ),
        Figure(
            "decode_tok_s.2",
            39.4,
            "tok/s",
            "seed000",
            SEED_003,
            "single",
            condition="prose, 2 streams aggregated (20.69 per stream), prefix-cache hits",
        ),
        Figure(
            "prefill_tok_s",
            1190.0,
            "tok/s",
            "seed000",
            SEED_003,
            "single",
            upper=1192.0,
            condition="cold unique-salt prompt: 32K 1,192 tok/s, 128K 1,190 tok/s",
        ),
        # the sfxnz README's long prompt (research stacks.md §1 "Published speed"): opt-in,
        # `--contexts 318123` on a profile whose context holds it
        Figure(
            "prefill_ttft_s.318123",
            245.0,
            "s",
            "seed000",
            README,
            "single",
            condition="one 318,123-token prompt, prefilled in 4 min 05 s",
            lower_is_better=True,
        ),
        Figure(
            "spec_acceptance_length",
            2.21,
            "tokens",
            "seed000",
            SEED_003,
            "single",
            condition="DFlash2-7 on the prose prompts, one request: 'Akzeptanzlänge 2,21' "
            "(line 41), 1.21 of 7 drafted tokens accepted a step",
        ),
    ),  # fmt: skip
    sources=(RUN_SH, ARGS, V8, SEED_003, README, "docs/stacks-facts.md §S"),
)
