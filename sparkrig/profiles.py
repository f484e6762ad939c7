"""Serve profiles of the default stack (``vllm-nvfp4``): the `vllm serve` command line of every
rank, as a pure function of typed inputs. The declaration lives in sparkrig/stacks/vllm_nvfp4.py
and the argv builder in sparkrig/engines/vllm.py; this module keeps their names for the
callers that speak of one stack (the serving tests, the stand-in's checks).

Numbers and flags: docs/sources.md, "vLLM serve flags and profiles". Every profile carries the
flags the recipes call mandatory: tensor parallel over the nodes with the mp executor,
--nnodes/--node-rank/--master-addr/--master-port, --block-size 2304 (fp8 paged MQA page size;
without it output is silently corrupt), --language-model-only (saves 15.7 GiB),
--tool-call-parser glm47 with --enable-auto-tool-choice (the `glm` parser drops tool calls),
--kv-cache-dtype fp8_e4m3. Workers (rank > 0) add --headless and get no API flags
(--host/--port/--served-model-name).

Profiles (knob `profile`):
- single: 262144 context, 2 sequences, KV 3221225472 B, 4096 batched tokens, DFlash2 k=7 with the
  drafter directory (profile S; the drafter is CC BY-NC-ND 4.0, so it needs the licence knob).
- shared (default): 262144 context, 8 sequences, KV 9663676416 B (9 GiB = 1,103,764 tokens), MTP
  k=4 (76.4 tok/s total at 8 parallel; no drafter).
- guard: no speculation (vLLM's V1 runner and the guard itself refuse custom logits processors
  with it; the guard loads on the V1 and the V2 runner, docs/vllm.md) and the UTF-8 guard logits
  processor `utf8_guard_lp:Utf8GuardLogitsProcessor` (baked into the patched image on PYTHONPATH).
  Slots and pool as `shared`: without speculation nothing else competes for the pool.
- long: 262144 context (1M at TP2 starved the KV pool and crashed the recipe fleet three times,
  §2.3), 2 sequences with the 9 GiB pool (1.1M tokens: two concurrent 200K prompts, the seed's
  long test, fit without preemption), MTP k=4 (no drafter licence needed; judge by TTFT/prefill).
"""

from __future__ import annotations

from typing import Any

from sparkrig.engines import vllm
from sparkrig.engines.vllm import DEFAULT_HOST, DISTRIBUTED_FLAGS, flag_value
from sparkrig.stacks.base import Profile
from sparkrig.stacks.vllm_nvfp4 import (
    BLOCK_SIZE,
    GPU_MEMORY_UTILIZATION,
    GUARD_LOGITS_PROCESSOR,
    KV_CACHE_DTYPE,
    REASONING_PARSER,
    TOOL_CALL_PARSER,
)
from sparkrig.stacks.vllm_nvfp4 import (
    STACK as NVFP4,
)

__all__ = [
    "BLOCK_SIZE",
    "DEFAULT_HOST",
    "GPU_MEMORY_UTILIZATION",
    "GUARD_LOGITS_PROCESSOR",
    "KV_CACHE_DTYPE",
    "MANDATORY_FLAGS",
    "PROFILES",
    "REASONING_PARSER",
    "TOOL_CALL_PARSER",
    "Profile",
    "flag_value",
    "needs_drafter",
    "serve_args",
    "speculative_config",
]

PROFILES: dict[str, Profile] = dict(NVFP4.profiles)
DEFAULT_PROFILE = "shared"

MANDATORY_FLAGS: tuple[str, ...] = (
    *DISTRIBUTED_FLAGS,
    "--block-size",
    "--language-model-only",
    "--kv-cache-dtype",
    "--tool-call-parser",
    "--enable-auto-tool-choice",
)


def needs_drafter(profile: str) -> bool:
    """True when the profile loads the DFlash2 drafter (licence knob and drafter download)."""
    return NVFP4.needs_drafter(profile)


def speculative_config(profile: str, drafter_dir: str | None = None) -> str | None:
    """The --speculative-config JSON of a profile, or None when it does not speculate."""
    return vllm.speculative_config(NVFP4, profile, drafter_dir)


def serve_args(profile: str, **kw: Any) -> list[str]:
    """argv of one rank of the default stack (``engines/vllm.py serve_args``'s keywords)."""
    return vllm.serve_args(NVFP4, profile, **kw)
