"""Stack `entrpi-exl3`: Entrpi's v2.3-tier1 kit (a vLLM fork with EXL3 kernels) on the pair.

Every value below was read at its source; docs/stacks-facts.md §E has each with its status word,
docs/stacks.md ("entrpi-exl3") the choices sparkrig made. Short names of the sources:

- BUILD.md: Entrpi/glm-5.3-flash-exl3-2x-spark
  docs/BUILD.md@06624dd7df9478a4e3e744641511b247516358d7
- install.sh: Entrpi's v2.3 installer (stored copy id 57442114892; commit not returned by the index)
- launcher: Entrpi's scripts/launch-glm53-vllm-tp2.sh at kit commit 63f254f (a third-party frozen
  copy, id 68383410109, that differs from the original only in a comment and PORT 8000 -> 8888)
- README: Entrpi's v2.3 README (stored copy id 57479311866)

What the vllm family adapter adds, so it is not in ``serve_flags``: the model directory, the
topology flags (--tensor-parallel-size, --distributed-executor-backend mp, --nnodes, --node-rank,
--master-addr, --master-port), --headless on rank > 0, --host/--port/--served-model-name on rank 0
(the launcher passes --host/--port on both ranks; a headless rank ignores them), the speculative
config with sparkrig's drafter directory (profile `single`: dflash, 7 tokens, the launcher's own
``{"method":"dflash","model":"/models/glm53-dflash2","num_speculative_tokens":7}``), and
--default-chat-template-kwargs from the `thinking_default` knob (the launcher's value,
``{"enable_thinking": false}``, is sparkrig's default).

Fabric env: sparkrig's rank.env already sets every NCCL/socket variable the launcher sets, with
the same values (the GID index by value, as the launcher derives it); only the launcher's channel
count differs, so it is in ``env``. ``GLM53_NO_UPDATE_CHECK`` is not set: the once-a-day GET of
Entrpi's LATEST file is ``kit_update_check()`` in the host-side launcher, which sparkrig never
runs, and the launcher itself does not pass the variable into the container, so nothing in the
image reads it (facts §0.4). No call home is made because the launcher is not run.
"""

from __future__ import annotations

from sparkhost.wedge import GENERATION_TOKENS, PROMPT_TOKENS, RUNNING

from sparkrig.stacks.base import Figure, MemoryGate, Pin, Profile, Stack

BUILD = "Entrpi docs/BUILD.md@06624dd7df9478a4e3e744641511b247516358d7"
INSTALL = "Entrpi install.sh v2.3 (stored copy id 57442114892)"
LAUNCHER = "Entrpi scripts/launch-glm53-vllm-tp2.sh at kit 63f254f (frozen copy id 68383410109)"
README = "Entrpi README v2.3 (stored copy id 57479311866)"
SEED_004 = "seed 004 (shared/seeds/004_d4f0c35b177c450a.txt)"
SEED_004_RUN = (
    "Entrpi's kit, brandonmusic's 4bpw EXL3, MXFP8 DFlash2 drafter; one streamed call, "
    "temperature 0.2, 384 tokens, prompt around 3.7k tokens (seed 004 line 1)"
)

# The fork's own pieces (facts §E.6): vLLM 0.33.0's parser refuses the three --mixed-prefill-*
# flags ("unrecognized arguments"); it parses the two values, which its engine config refuses
# ("Invalid quantization method: exl3", "Unknown attention backend: 'B12X_MLA_SPARSE'"). The
# mixed-prefill flags are not in the default argv (the launcher passes them only when
# MIXED_PREFILL_* is set); they are listed because the fork accepts them in extra_serve_args.
FORK_FLAGS = (
    "--mixed-prefill-token-cap",
    "--mixed-prefill-max-defer-steps",
    "--mixed-prefill-decode-weight",
    "--quantization=exl3",
    "--attention-backend=B12X_MLA_SPARSE",
)
# Env names the fork reads that vLLM 0.33.0's envs does not know (README "introduced by this
# branch"; facts §E.6). Only the first two are set by default; the launcher passes the other
# three only when the operator sets them.
FORK_ENV = (
    "VLLM_USE_B12X_FP8_GEMM",
    "VLLM_DFLASH_FP8_DRAFT_HEAD",
    "VLLM_B12X_MXFP8_MAX_M",
    "VLLM_NVFP4_MLA_DYNAMIC_SCALE",
    "VLLM_EXL3_STANDARD_FUSED",
)

# The recipe's own flags, the same on every rank (what the adapter adds: the docstring).
SERVE_FLAGS = (
    "--trust-remote-code",
    "--quantization", "exl3",
    "--gpu-memory-utilization", "0.85",
    "--max-model-len", "524288",
    "--max-num-seqs", "4",
    "--block-size", "2304",
    "--mm-processor-cache-gb", "0.5",
    "--load-format", "instanttensor",
    "--max-num-batched-tokens", "8192",
    "--kv-cache-dtype", "fp8_ds_mla",
    "--attention-backend", "B12X_MLA_SPARSE",
    "--kv-cache-dtype-skip-layers", "sliding_window",
    # the launcher writes --kv-cache-memory, argparse's abbreviation of this flag in 0.33
    # (docs/vllm.md); the full name cannot become ambiguous if a fork adds a longer flag
    "--kv-cache-memory-bytes", "14400000000",
    "--prefix-match-unit", "512",
    "--skip-mm-profiling",
    "--tool-call-parser", "glm47",
    "--enable-auto-tool-choice",
    "--reasoning-parser", "glm45",
)  # fmt: skip

STACK = Stack(
    name="entrpi-exl3",
    family="vllm",
    title="Entrpi v2.3-tier1: vLLM fork, EXL3 4bpw target, MXFP8 DFlash2 drafter",
    # BUILD.md publishes the digest of :v2.3-tier1 (= :latest); the launcher pins the tag only.
    image=(
        "ghcr.io/entrpi/glm-5.3-flash-exl3-2x-spark"
        "@sha256:44b2dbafe8d81d6c7019a346480b49b23c1a0bef99c9b1d0db6e7ccc926921ca"
    ),
    image_note=(
        "Entrpi's published v2.3-tier1 image (BUILD.md: tag :v2.3-tier1 = :latest, linux/arm64, "
        "vLLM fork Entrpi/vllm-glm-5.3-flash-spark@f223ff9f2, b12x 2f53ce3, exllamav3 c5d9c657, "
        "FlashInfer 0.6.18, torch 2.13.0). Pulled by digest: its base build uses eugr's private "
        "spark-vllm-docker, so it cannot be rebuilt from public sources. It carries its own top-k "
        "fix (the launcher ignores GLM53_TOPK_FIX_SO on v2+ images), so no sparkrig patch layer."
    ),
    patched=False,
    model=Pin(
        repo="brandonmusic/GLM-5.3-Flash-tr3-4bpw",
        revision="5ab363a8dcf6405955fd5f99671e01a1c9fb124b",
        why=(
            "Entrpi's installer pins no revision of its EXL3_REPO (default brandonmusic/"
            "GLM-5.3-Flash-tr3-4bpw, the 'Brandon's K4' seed 004 measured). 5ab363a8 is the TR3 "
            "4bpw snapshot other recipes pin and measure (docs/stacks.md lists the stored copies "
            "that name it) and the one the installer's fallback "
            "Mia-AiLab/GLM-5.3-Flash-EXL3-TR3-4bpw@25a44fdbf16862a46b7cc9921142c6c81350af2f "
            "mirrors byte for byte (~164 GiB, 120 shards: install.sh's have_exl3 wants >= 120). "
            "Entrpi's own figures name no revision."
        ),
        license_note=(
            "ShapleyMcg License v1.0 (attribution required; the Hub card's licence: other)"
        ),
    ),
    drafter=Pin(
        repo="local-inference-lab/GLM-5.3-Flash-DFlash2-MXFP8",
        revision="62f758c0a0e19b9cb76fc098c911b8ed76daff5b",
        why="install.sh's DFLASH_REVISION: 'the validated commit of the default repo'",
        license_note=(
            "CC BY-NC-ND 4.0 as install.sh states it for the MXFP8 copy too (the copy's own "
            "model card was not read): needs drafter_license_accepted"
        ),
    ),
    env={
        # launcher, every rank; rank.env already has HF_HUB_OFFLINE, TRANSFORMERS_OFFLINE,
        # VLLM_ENGINE_READY_TIMEOUT_S=3600 and PYTORCH_CUDA_ALLOC_CONF with the same values
        "HF_HOME": "/cache/huggingface",
        "TORCH_CUDA_ARCH_LIST": "12.1a",
        "FLASHINFER_CUDA_ARCH_LIST": "12.1a",
        "FLASHINFER_DISABLE_VERSION_CHECK": "1",
        "VLLM_USE_B12X_FP8_GEMM": "1",
        "VLLM_DFLASH_FP8_DRAFT_HEAD": "1",
        "NCCL_MIN_NCHANNELS": "8",
        "NCCL_MAX_NCHANNELS": "8",
    },
    fork_env=FORK_ENV,
    fork_flags=FORK_FLAGS,
    serve_flags=SERVE_FLAGS,
    head_flags=(),
    # the recipe serves one configuration; sparkrig names it `single` (speculation only)
    profiles={
        "single": Profile(
            "single",
            speculative="dflash",
            num_speculative_tokens=7,
            doc="DFlash2 MXFP8 drafter, 7 tokens: the launcher's speculative config",
        )
    },
    # the recipe's API port, install.sh's PORT default, is 8000 as the api_port knob's (the frozen
    # launcher copy's 8888 is its own change)
    # the kit sets no key; stock vLLM's VLLM_API_KEY route (whether the fork kept vLLM's
    # authentication middleware unchanged was not read: lead)
    api_auth="vllm-api-key",
    readiness_path="/health",  # README: GET /health -> 200 (the installer polls /v1/models)
    # stock vLLM names (files/sparkhost/wedge.py); the fork's metrics were not read: lead
    progress_metrics=(RUNNING, GENERATION_TOKENS, PROMPT_TOKENS),
    # launcher: refuse when free(1)'s "used" column is above MEM_USED_MAX_GB x 1024 MiB (6 GiB),
    # polled up to 60 x 2 s after the old container is removed
    memory=MemoryGate("used", 6.0, source=LAUNCHER),
    caches={
        # the launcher's mounts under CACHE_HOST_PATH ("hash-keyed, so stale entries are inert")
        "/root/.triton": "Triton JIT kernels",
        "/root/.cache/flashinfer": "FlashInfer JIT kernels",
        "/root/.cache/b12x": "b12x JIT kernels",
        "/root/.cache/vllm": "vLLM torch.compile and CUDA graph caches",
        "/cache": "HF_HOME=/cache/huggingface (trust-remote-code modules)",
    },
    # install.sh and README: "always head down first, worker up first" (a new worker that
    # rendezvouses with the old head dies: docs/stacks-facts.md §E, stop)
    stop_order="head-first",
    figures=(
        # README v2.3: single request, median of five 400-token runs, greedy
        Figure("decode_tok_s_prose", 30.0, "tok/s", "entrpi-workloads", README),
        Figure("decode_tok_s_code", 42.0, "tok/s", "entrpi-workloads", README),
        Figure("decode_tok_s_json", 51.0, "tok/s", "entrpi-workloads", README),
        Figure("decode_tok_s_math", 45.0, "tok/s", "entrpi-workloads", README),
        Figure("decode_tok_s_structured", 71.0, "tok/s", "entrpi-workloads", README),
        Figure("prefill_tok_s_133k", 1490.0, "tok/s", "entrpi-workloads", README),
        # README v2.3, MiaAI's protocol (scripts/bench_decode_miaai.py)
        Figure("decode_tok_s_prose", 31.1, "tok/s", "miaai", README),
        Figure("decode_tok_s_structured", 74.7, "tok/s", "miaai", README),
        # seed 004 line 7: an operator's run of this kit on Brandon's K4 with the MXFP8 drafter,
        # in the bench's seed004 names (sparkrig/bench/seed004.py)
        Figure("prose_decode_tok_s", 27.4, "tok/s", "seed004", SEED_004, condition=SEED_004_RUN),
        Figure("code_low_decode_tok_s", 53.6, "tok/s", "seed004", SEED_004, condition=SEED_004_RUN),
        Figure("code_max_decode_tok_s", 62.7, "tok/s", "seed004", SEED_004, condition=SEED_004_RUN),
        Figure("prose_prefill_tok_s", 1369.0, "tok/s", "seed004", SEED_004, condition=SEED_004_RUN),
        Figure("code_prefill_tok_s", 1306.0, "tok/s", "seed004", SEED_004, condition=SEED_004_RUN),
        Figure("max_model_len", 524288, "tokens", "seed004", SEED_004, condition=SEED_004_RUN),
        # line 9: "that drafter kept more tokens per step, about 6.5, and about 7.4 once
        # reasoning was maxed": the mean acceptance length of the code calls
        Figure(
            "code_low_acceptance_length", 6.5, "tokens", "seed004", SEED_004, condition=SEED_004_RUN
        ),
        Figure(
            "code_max_acceptance_length", 7.4, "tokens", "seed004", SEED_004, condition=SEED_004_RUN
        ),
    ),  # fmt: skip
    sources=(BUILD, INSTALL, LAUNCHER, README, SEED_004, "docs/stacks-facts.md §E"),
)
