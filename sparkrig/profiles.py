"""Serve profiles: the `vllm serve` command line of every rank, as a pure function of typed inputs.

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

import ipaddress
import json
from collections.abc import Sequence
from dataclasses import dataclass

GUARD_LOGITS_PROCESSOR = "utf8_guard_lp:Utf8GuardLogitsProcessor"
BLOCK_SIZE = 2304
KV_CACHE_DTYPE = "fp8_e4m3"
TOOL_CALL_PARSER = "glm47"
REASONING_PARSER = "glm45"  # Entrpi, tonyd2wild (§2.1); himorishige uses deepseek_r1
GPU_MEMORY_UTILIZATION = "0.85"  # most recipes; 0.87 was unreachable on another pair (§1.3)
DEFAULT_HOST = "0.0.0.0"  # the API is the product: reachable from the LAN (operator firewalls)


@dataclass(frozen=True)
class Profile:
    name: str
    max_model_len: int
    max_num_seqs: int
    kv_cache_memory_bytes: int
    max_num_batched_tokens: int
    speculative: str | None  # "dflash", "mtp" or None
    num_speculative_tokens: int = 0
    logits_processors: tuple[str, ...] = ()
    doc: str = ""


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

DEFAULT_PROFILE = "shared"


def needs_drafter(profile: str) -> bool:
    """True when the profile loads the DFlash2 drafter (licence knob and drafter download)."""
    return _profile(profile).speculative == "dflash"


def _profile(name: str) -> Profile:
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown profile {name!r}; choose one of {', '.join(PROFILES)}") from None


def speculative_config(profile: str, drafter_dir: str | None = None) -> str | None:
    """The --speculative-config JSON of a profile, or None when it does not speculate."""
    p = _profile(profile)
    if p.speculative is None:
        return None
    cfg: dict[str, object] = {"method": p.speculative}
    if p.speculative == "dflash":
        if not drafter_dir:
            raise ValueError(f"profile {p.name!r} needs the drafter directory")
        cfg["model"] = drafter_dir
    cfg["num_speculative_tokens"] = p.num_speculative_tokens
    return json.dumps(cfg, separators=(",", ":"))


def _check_port(name: str, port: int) -> None:
    if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
        raise ValueError(f"{name} must be a TCP port (1..65535), got {port!r}")


def serve_args(
    profile: str,
    *,
    rank: int,
    nnodes: int,
    master_addr: str,
    master_port: int,
    model_dir: str,
    api_port: int = 8000,
    served_name: str = "glm-5.3-flash",
    drafter_dir: str | None = None,
    extra_args: Sequence[str] = (),
    host: str = DEFAULT_HOST,
    thinking: bool | None = False,
) -> list[str]:
    """argv of one rank: ``["vllm", "serve", MODEL_DIR, flags...]`` (the image's entrypoint is
    `vllm`, so a container gets ``argv[1:]`` after ``--entrypoint vllm``).

    ``thinking`` is the chat template's default ``enable_thinking`` (off, and a
    request turns it on with ``chat_template_kwargs: {"enable_thinking": true}``; None leaves the
    template's own default). ``master_addr`` is the head's fabric IPv4 without prefix length.
    ``extra_args`` are appended last, so they override earlier flags (argparse keeps the last).
    """
    p = _profile(profile)
    if not isinstance(nnodes, int) or nnodes < 1:
        raise ValueError(f"nnodes must be >= 1, got {nnodes!r}")
    if not isinstance(rank, int) or not 0 <= rank < nnodes:
        raise ValueError(f"rank must be in 0..{nnodes - 1}, got {rank!r}")
    try:
        ipaddress.IPv4Address(master_addr)
    except ValueError:
        raise ValueError(f"master_addr must be an IPv4 address, got {master_addr!r}") from None
    _check_port("master_port", master_port)
    _check_port("api_port", api_port)
    if not model_dir:
        raise ValueError("model_dir is required")
    if isinstance(extra_args, str):
        raise TypeError("extra_args must be a list of tokens, not a string")

    args = ["vllm", "serve", model_dir]
    args += [
        "--tensor-parallel-size", str(nnodes),
        "--distributed-executor-backend", "mp",
        "--nnodes", str(nnodes),
        "--node-rank", str(rank),
        "--master-addr", master_addr,
        "--master-port", str(master_port),
        "--block-size", str(BLOCK_SIZE),
        "--language-model-only",
        "--kv-cache-dtype", KV_CACHE_DTYPE,
        "--tool-call-parser", TOOL_CALL_PARSER,
        "--enable-auto-tool-choice",
        "--reasoning-parser", REASONING_PARSER,
        "--gpu-memory-utilization", GPU_MEMORY_UTILIZATION,
        "--moe-backend", "marlin",
        "--enforce-eager",
        "--max-model-len", str(p.max_model_len),
        "--max-num-seqs", str(p.max_num_seqs),
        "--kv-cache-memory-bytes", str(p.kv_cache_memory_bytes),
        "--max-num-batched-tokens", str(p.max_num_batched_tokens),
    ]  # fmt: skip
    spec = speculative_config(profile, drafter_dir)
    if spec is not None:
        args += ["--speculative-config", spec]
    if p.logits_processors:
        args += ["--logits-processors", *p.logits_processors]
    if rank == 0 and thinking is not None:
        kwargs = json.dumps({"enable_thinking": thinking}, separators=(",", ":"))
        args += ["--default-chat-template-kwargs", kwargs]
    if rank == 0:
        args += ["--host", host, "--port", str(api_port), "--served-model-name", served_name]
    else:
        args += ["--headless"]
    args += [str(a) for a in extra_args]
    return args


MANDATORY_FLAGS: tuple[str, ...] = (
    "--tensor-parallel-size",
    "--distributed-executor-backend",
    "--nnodes",
    "--node-rank",
    "--master-addr",
    "--master-port",
    "--block-size",
    "--language-model-only",
    "--kv-cache-dtype",
    "--tool-call-parser",
    "--enable-auto-tool-choice",
)


def flag_value(args: Sequence[str], flag: str) -> str | None:
    """Last value given for ``flag`` in an argv (None if absent or a bare switch at the end)."""
    value = None
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args) and not args[i + 1].startswith("--"):
            value = args[i + 1]
        elif a.startswith(flag + "="):
            value = a.split("=", 1)[1]
    return value
