"""``vllm-nvfp4``: the NVFP4 vLLM v11 recipe of seeds 000-002, sparkrig's first stack (default).

The community v11 image (tonyd2wild) with sparkrig's patch layer on top (files/Dockerfile,
files/patches: the SM121 top-k fix, the UTF-8 guard), LibertAI's NVFP4 checkpoint, incoai's
DFlash2 drafter for the `single` profile, and the four profiles of seed 000. Facts and their
sources: docs/sources.md ("Image", "vLLM serve flags and profiles", "Memory gate"), docs/vllm.md.
"""

from __future__ import annotations

from sparkrig.stacks.base import Figure, MemoryGate, Pin, Profile, Stack

GUARD_LOGITS_PROCESSOR = "utf8_guard_lp:Utf8GuardLogitsProcessor"  # files/utf8_guard_lp.py
BLOCK_SIZE = 2304  # fp8 paged MQA page size: without it output is silently corrupt
KV_CACHE_DTYPE = "fp8_e4m3"
TOOL_CALL_PARSER = "glm47"  # the `glm` parser drops tool calls
REASONING_PARSER = "glm45"  # Entrpi, tonyd2wild (§2.1); himorishige uses deepseek_r1
GPU_MEMORY_UTILIZATION = "0.85"  # most recipes; 0.87 was unreachable on another pair (§1.3)

SEED_000 = "seed 000 (000_fd10cb76903debf3.txt, Classmethod, 2x DGX Spark, v11 image)"

PROFILES: dict[str, Profile] = {
    "single": Profile(
        "single", 262144, 2, 3221225472, 4096, "dflash", 7, (),
        "one user, DFlash2 drafter k=7: 30.8 tok/s single (seed 000 profile S)",
    ),
    "shared": Profile(
        "shared", 262144, 8, 9663676416, 4096, "mtp", 4, (),
        "several users, MTP k=4, 8 slots: 76.4 tok/s total at 8 parallel (seed 000)",
    ),
    "guard": Profile(
        "guard", 262144, 8, 9663676416, 4096, None, 0, (GUARD_LOGITS_PROCESSOR,),
        "UTF-8 guard, no speculation: 0 U+FFFD, ~14.6 tok/s single (seed 000)",
    ),
    "long": Profile(
        "long", 262144, 2, 9663676416, 4096, "mtp", 4, (),
        "long prompts: 2 slots over a 1.1M-token pool; 262K is the TP2 ceiling (§2.3)",
    ),
}  # fmt: skip

STACK = Stack(
    name="vllm-nvfp4",
    family="vllm",
    title="NVFP4 on the community vLLM v11 image + sparkrig's patch layer (seeds 000-002)",
    image=(
        "ghcr.io/tonyd2wild/vllm-glm53-flash"
        "@sha256:4def0ef644cb2e9814136dcffd5e385e21bc594f48f3b292234051904abe85a6"
    ),
    image_note=(
        "the v11 image every working two-Spark report used (docs/sources.md, 'Image'); it carries "
        "vLLM 0.1.dev20051+g487ecf187 (docs/vllm.md); sparkrig builds files/Dockerfile on it"
    ),
    patched=True,
    model=Pin(
        "LibertAIDAI/GLM-5.3-Flash-NVFP4",
        "caca4e6a4ebbd66f159d3d2fc256683fd6e27177",
        why="the NVFP4 checkpoint of seeds 000-002 (181 GiB in 123 LFS files)",
    ),
    drafter=Pin(
        "incoai/GLM-5.3-Flash-DFlash2",
        "7d74cdd881ed7e32c31175984a67823127b66cfe",
        why="the DFlash2 drafter of seed 000's profile S (~2.2 GB)",
        license_note="CC BY-NC-ND 4.0: needs drafter_license_accepted",
    ),
    # nothing beyond the runtime lines every rank's env file has (templates/rank.env.j2:
    # VLLM_ENGINE_READY_TIMEOUT_S=3600, VLLM_NO_USAGE_STATS=1, expandable segments)
    env={},
    profiles=PROFILES,
    default_profile="shared",  # seed 000's several-users profile, sparkrig's default since v1
    serve_flags=(
        "--block-size",
        str(BLOCK_SIZE),
        "--language-model-only",
        "--kv-cache-dtype",
        KV_CACHE_DTYPE,
        "--tool-call-parser",
        TOOL_CALL_PARSER,
        "--enable-auto-tool-choice",
        "--reasoning-parser",
        REASONING_PARSER,
        "--gpu-memory-utilization",
        GPU_MEMORY_UTILIZATION,
        "--moe-backend",
        "marlin",
        "--enforce-eager",
    ),  # fmt: skip
    api_port=8000,
    api_auth="vllm-api-key",
    readiness_path="/health",
    progress_metrics=(
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
    ),
    memory=MemoryGate(
        "memfree",
        None,
        "docs/sources.md 'Memory gate': MemFree (page cache counts as used on unified memory), "
        "the floor vLLM's start check implies (utilization x MemTotal) + memfree_margin_gib",
    ),
    caches={"/root/.cache": "triton, flashinfer and vllm JIT caches (docs/sources.md 'Image')"},
    # sparkrig's own since v1: the head's helpers first, then every rank in one step (the seeds
    # stop by hand; nothing orders the ranks' stops)
    stop_order="together",
    figures=(
        Figure("single_stream_tok_s", 30.84, "tok/s", "seed000", SEED_000, "single"),
        Figure("prefill_tok_s", 1391.0, "tok/s", "seed000", SEED_000, "single"),
        Figure("single_stream_tok_s", 25.67, "tok/s", "seed000", SEED_000, "shared"),
        Figure("decode_tok_s.8", 76.4, "tok/s", "seed000", SEED_000, "shared"),
        Figure("single_stream_tok_s", 14.6, "tok/s", "seed000", SEED_000, "guard"),
    ),
    sources=("docs/sources.md", "docs/vllm.md", SEED_000),
)
