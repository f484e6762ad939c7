"""Stack `tensorfold`: MiaAI's TensorFold recipe (EXL3 4bpw target, DFlash2 drafter) on the pair.

A second engine family (not vLLM): ``tensorfold serve`` on every rank, argv by
``engines/tensorfold.py``. Every value below was read at its source; docs/stacks.md
("tensorfold") has each with its source and the choices sparkrig made. Short names:

- CONFIG: MiaAI-Lab/GLM-5.3-Flash-EXL3-2x-DGX-Sparks-TensorFold
  scripts/config.sh@05f75fdec1dec6ec8ab7b618c849a5bd8843221a (the v1.10 release)
- START: the same repository's start.sh at the v1.10 release (stored copy id 70855383502)
- README: its README.md at the v1.10 release (Performance, "KV pool and memory", License)
- CLI: ashhart/TensorFold src/tensorfold/cli_args.py@0b3f3bbb080a1ab5e90216c2fedb1288ef996717
  (lab/tensorfold-flags.txt is its `serve` flag list)
- HEALTH: ashhart/TensorFold src/tensorfold/cuda/health.py@01ecc8dc204d07484f98ded75a51d20d6515c188

What the family adapter adds, so it is not in ``serve_flags``: the snapshot directory, ``--tp N
--rank i --master <head fabric address> --master-port 29551`` on every rank, ``--drafter
<DFlash2 snapshot | none>`` and the profile's ``--context/--parallel``, ``--thinking`` or
``--no-thinking`` from the `thinking_default` knob, and ``--name/--host 127.0.0.1/--port
<engine_port>`` on rank 0 alone (rank >= 1 never opens HTTP: CLI "rank 1 follows it").

The API key: TensorFold 0.6.0 has none (CLI: no --api-key; later releases add one). The engine
binds loopback on the head and sparkrig's authenticating front serves api_port with the key
(``api_auth = "front"``).
"""

from __future__ import annotations

from sparkrig.stacks.base import Figure, MemoryGate, Pin, Profile, Stack

CONFIG = (
    "MiaAI-Lab/GLM-5.3-Flash-EXL3-2x-DGX-Sparks-TensorFold "
    "scripts/config.sh@05f75fdec1dec6ec8ab7b618c849a5bd8843221a"
)
START = "MiaAI start.sh at release v1.10 (stored copy id 70855383502)"
README = "MiaAI README.md at release v1.10 (Performance; KV pool and memory; License)"
CLI = "ashhart/TensorFold src/tensorfold/cli_args.py@0b3f3bbb080a1ab5e90216c2fedb1288ef996717"
HEALTH = "ashhart/TensorFold src/tensorfold/cuda/health.py@01ecc8dc204d07484f98ded75a51d20d6515c188"
SEED_004 = "seed 004 (shared/seeds/004_d4f0c35b177c450a.txt)"

# TensorFold's rendezvous (a torch TCPStore served by rank 0): CONFIG's MASTER_PORT and the CLI's
# --master-port default
MASTER_PORT = 29551

# The recipe's own switches every rank gets (CONFIG exports them; START's env_args passes every
# TENSORFOLD_*/TF_GLM_*/TF_ROCE_* variable to every rank with the same value: the ranks compare
# settings at start). Only the defaults read in CONFIG's first half are carried; the rest of
# CONFIG (cache entries, streaming, spill) keeps TensorFold's/the patches' own defaults: lead.
RECIPE_ENV = {
    "TF_GLM_MTP": "auto",  # the MTP head stays out while DFlash2 drafts every request
    "TF_GLM_KV": "fp8",  # the 1M window with 4 streams fits only with the fp8 latent cache
    "TF_GLM_DENSE": "q4",
    "TF_GLM_COMM": "roce",
    "TF_ROCE_MAX_KB": "512",
    "TF_ROCE_WAIT_S": "300",  # issue #54: a late peer costs a slow round, not both ranks
    "TF_GLM_COPY_DRAFTS": "1",
    "TF_GLM_COPY_MAX": "15",
    "TF_GLM_DFLASH_POLICY": "fnc7:0.3",
    "TF_GLM_HC_SPLIT": "1",
    "TF_GLM_PREFILL_OVERLAP": "2",
    "TF_GLM_KDA_CHUNKED": "1",
    "TF_GLM_WIDE_GRAPHS": "16",
    "TF_GLM_COPY_REPLY_MATCH": "16",
    "TF_GLM_MULTI_LONE": "0",
    "TF_GLM_MULTI_WINDOW": "32",  # CONFIG: 32 up to 4 requests at once (64 past 4)
}

PROFILES = {
    "shared": Profile(
        "shared",
        max_model_len=1048576,  # --context: CONFIG's default with KV=fp8
        max_num_seqs=4,  # --parallel: CONFIG's default on two Sparks with DFlash2
        speculative="dflash",
        doc=(
            "DFlash2 drafts, 4 requests at once, 1,048,576-token window: MiaAI's default "
            "(60.4 tok/s prose alone, 108.8 at 4 streams)"
        ),
    ),
    "single": Profile(
        "single",
        max_model_len=1048576,
        max_num_seqs=1,  # START: "mtp serves one request at a time: PARALLEL=1"
        speculative="mtp",
        doc="the checkpoint's MTP head, no drafter file (no NC licence), one request at a time",
    ),
}

STACK = Stack(
    name="tensorfold",
    family="tensorfold",
    title="MiaAI v1.10: TensorFold 0.6.0 (96 patches), EXL3 4bpw target, DFlash2 or MTP drafts",
    image=(
        "ghcr.io/miaai-lab/glm-5.3-flash-exl3-2x-dgx-sparks-tensorfold"
        "@sha256:bc34d7d63f978cf601f42863b284bc95a567c50c10e9adb0866a635be568bf5f"
    ),
    image_note=(
        "MiaAI's published v1.10 image, tag v0.6.0-a1897d591f70 (CONFIG's IMAGE_TAG and "
        "IMAGE_DIGEST): nvcr.io/nvidia/pytorch:26.07-py3 + TensorFold v0.6.0 + the recipe's 96 "
        "patches, ~25 GB, arm64. Pulled by digest; no sparkrig patch layer."
    ),
    patched=False,
    model=Pin(
        repo="Mia-AiLab/GLM-5.3-Flash-EXL3-4bpw-TensorFold",
        revision="078455ffe6472f9a52fbc1139f58b9db2881b25c",
        why="CONFIG's MODEL_REVISION for this repository (v1.3.3 to v1.10): what MiaAI measured",
        license_note="Apache-2.0 (base model MIT)",
    ),
    drafter=Pin(
        repo="incoai/GLM-5.3-Flash-DFlash2",
        revision="bf582e4eacc1810f76656d1811693ff6c6737d2a",
        why="CONFIG's DFLASH2_REVISION",
        license_note="CC BY-NC-ND 4.0 (non-commercial use only): needs drafter_license_accepted",
    ),
    env={
        # START exports it (config.sh) and the image's updater would ask GitHub otherwise
        "TENSORFOLD_NO_UPDATE_CHECK": "1",
        # START's rank_nccl_env at TP=2: NCCL_CHANNELS 4
        "NCCL_MIN_NCHANNELS": "4",
        "NCCL_MAX_NCHANNELS": "4",
        **RECIPE_ENV,
    },
    profiles=PROFILES,
    default_profile="shared",
    # START's SERVE_ARGS beside what the adapter adds: the reply budget and images (VISION=1)
    serve_flags=("--max-tokens", "32768", "--vision"),
    head_flags=(),
    api_auth="front",
    # rank 0 starts HTTP only after the engine loaded (CLI); START polls /v1/models
    readiness_path="/v1/models",
    progress_parser="tensorfold-health",
    progress_path="/health",
    master_port=MASTER_PORT,
    # the v1.10 recipe's start.sh serves two Sparks (start-tp3.sh is experimental)
    nodes=(2,),
    # START: RUN_ARGS (--ipc=host --network host --device /dev/infiniband --cap-add IPC_LOCK
    # --ulimit memlock=-1 --ulimit stack=67108864 are sparkrig's own already)
    run_flags=("--shm-size", "16g"),
    # START: "TensorFold budgets each Spark's free memory minus MEMORY_RESERVE_GIB (14.5); the
    # defaults want ~110 GiB free at start on each" (free -g "available"); sparkrig refuses
    # instead of warning
    memory=MemoryGate("available", 110.0, source=START),
    caches={
        # START: ~/.cache/tensorfold-glm53/<image hash> -> /cache (TORCH_EXTENSIONS_DIR and
        # TRITON_CACHE_DIR point under it in the image): one cache, per image
        "/cache": "TensorFold's compiled CUDA extensions and Triton kernels",
    },
    # START's foreground watcher: either rank ending takes the other one down
    stop_order="together",
    figures=(
        # README Performance, two Sparks (measured at v1.0, clocks <= 2.2 GHz, sparkDash)
        Figure("single_stream_tok_s", 60.4, "tok/s", "miaai", README, "shared"),
        Figure("decode_tok_s.4", 108.8, "tok/s", "miaai", README, "shared"),
        Figure("prefill_tok_s", 1952.0, "tok/s", "miaai", README, "shared"),
        # seed 004 line 7: the seed author's own TensorFold stack (neko-legends' EXL3, incoai's
        # DFlash2), not this one; one streamed call, temperature 0.2, 384 tokens, ~3.7k prompt
        Figure("prose_decode_tok_s", 35.8, "tok/s", "seed004", SEED_004),
        Figure("code_low_decode_tok_s", 36.3, "tok/s", "seed004", SEED_004),
        Figure("code_max_decode_tok_s", 44.6, "tok/s", "seed004", SEED_004),
        Figure("prose_prefill_tok_s", 1342.0, "tok/s", "seed004", SEED_004),
        Figure("code_prefill_tok_s", 1364.0, "tok/s", "seed004", SEED_004),
        Figure("max_model_len", 1048576, "tokens", "seed004", SEED_004),
    ),
    sources=(CONFIG, START, README, CLI, HEALTH, SEED_004),
)
