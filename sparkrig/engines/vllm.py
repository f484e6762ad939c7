"""The vLLM family: the `vllm serve` command line of every rank, as a pure function of a stack's
declaration and typed inputs, and the family's ``Engine`` (``ENGINE``: sparkrig/engines/base.py).

The family adds what every vLLM stack on the pair needs: tensor parallel over the nodes with the
mp executor and ``--nnodes/--node-rank/--master-addr/--master-port`` (no Ray); then the stack's
own flags (``Stack.serve_flags``, every rank), the profile's numbers, its speculation and logits
processors, the chat template's thinking default and the stack's ``head_flags`` on rank 0, the API
flags (``--host 127.0.0.1 --port <engine_port> --served-model-name``, docs off) on rank 0 and
``--headless`` on the workers, and the operator's ``extra_serve_args`` last (argparse keeps the
last value of a flag).

vLLM splits the attention heads evenly over the ranks (GLM-5.3-Flash's 64: no three-rank pair) and
runs on no triangle or switchless ring (stock NCCL's tree connect, docs/rings.md)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from sparkrig import topology
from sparkrig.engines.base import ServeRequest
from sparkrig.engines.checks import check_inputs, check_port, check_rank
from sparkrig.engines.nccl import ring_graph_files
from sparkrig.stacks.base import Profile, Stack

# The fallback when a stack's argv sets no --gpu-memory-utilization (the memory gate derives its
# floor from it): the value most recipes pass (docs/sources.md, "vLLM serve flags and profiles").
GPU_MEMORY_UTILIZATION = "0.85"
# The engine listens on the head's loopback only: the API front (nginx, docs/front.md) serves the
# public api_port and checks the key on every route; vLLM's own key guards only /v1 /v2 /inference
# /cohere (docs/attack-surface-facts.md 1.1a), so the engine is never reachable from the LAN
DEFAULT_HOST = "127.0.0.1"
# FastAPI's /docs, /redoc and /openapi.json off (vLLM 0.33 launchers/app.py): nothing to browse
DOCS_OFF_FLAG = "--disable-fastapi-docs"

ENTRYPOINT = "vllm"
# What vLLM's tensor parallel divides by the rank count with no remainder: GLM-5.3-Flash's
# num_attention_heads = num_key_value_heads = 64 (docs/rings.md "Why TP=3 is hard": stock vLLM
# rejects TP3 for a 64-head model, vllm-project/vllm#52435)
GLM53_ATTENTION_HEADS = 64
RING_REFUSAL = (
    "stock NCCL dies in ncclTransportTreeConnect ('unhandled system error') on a switchless "
    "ring of four and needs NCCL_ALGO=Ring with a patched NCCL (NCCL_SKIP_TREE_CONNECT), "
    "which no vLLM stack here ships (docs/rings.md; research rings.md [I2, S13])"
)

# Flags the family puts on every rank of every vLLM stack (tests check each argv carries them).
DISTRIBUTED_FLAGS: tuple[str, ...] = (
    "--tensor-parallel-size",
    "--distributed-executor-backend",
    "--nnodes",
    "--node-rank",
    "--master-addr",
    "--master-port",
)


def speculative_config(stack: Stack, profile: str, drafter_dir: str | None = None) -> str | None:
    """The --speculative-config JSON of a profile, or None when it does not speculate."""
    p = stack.profile(profile)
    if p.speculative is None:
        return None
    cfg: dict[str, object] = {"method": p.speculative}
    if p.speculative == "dflash":
        if not drafter_dir:
            raise ValueError(f"profile {p.name!r} needs the drafter directory")
        cfg["model"] = drafter_dir
    cfg["num_speculative_tokens"] = p.num_speculative_tokens
    return json.dumps(cfg, separators=(",", ":"))


def profile_flags(p: Profile) -> list[str]:
    """The profile's numbers as flags (a None number adds none: the engine's default, or the
    stack's ``serve_flags``)."""
    numbers = (
        ("--max-model-len", p.max_model_len),
        ("--max-num-seqs", p.max_num_seqs),
        ("--kv-cache-memory-bytes", p.kv_cache_memory_bytes),
        ("--max-num-batched-tokens", p.max_num_batched_tokens),
    )
    return [word for flag, n in numbers if n is not None for word in (flag, str(n))]


def serve_args(
    stack: Stack,
    profile: str,
    *,
    rank: int,
    nnodes: int,
    master_addr: str,
    master_port: int,
    model_dir: str,
    engine_port: int = 8001,
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
    ``engine_port`` is the port the engine itself listens on, on ``host`` (the engine_port knob:
    the API front serves the public api_port, docs/front.md).
    """
    check_rank(stack, "vllm", rank, nnodes, master_addr, 1, "")
    p = stack.profile(profile)
    check_port("master_port", master_port)
    check_port("engine_port", engine_port)
    check_inputs(model_dir, extra_args)

    args = [ENTRYPOINT, "serve", model_dir]
    args += [
        "--tensor-parallel-size", str(nnodes),
        "--distributed-executor-backend", "mp",
        "--nnodes", str(nnodes),
        "--node-rank", str(rank),
        "--master-addr", master_addr,
        "--master-port", str(master_port),
    ]  # fmt: skip
    args += stack.serve_flags
    args += profile_flags(p)
    spec = speculative_config(stack, profile, drafter_dir)
    if spec is not None:
        args += ["--speculative-config", spec]
    if p.logits_processors:
        args += ["--logits-processors", *p.logits_processors]
    if rank == 0 and thinking is not None:
        kwargs = json.dumps({"enable_thinking": thinking}, separators=(",", ":"))
        args += ["--default-chat-template-kwargs", kwargs]
    if rank == 0:
        args += stack.head_flags
        args += ["--host", host, "--port", str(engine_port), "--served-model-name", served_name]
        args += [DOCS_OFF_FLAG]
    else:
        args += ["--headless"]
    args += [str(a) for a in extra_args]
    return args


def flag_value(args: Sequence[str], flag: str) -> str | None:
    """Last value given for ``flag`` in an argv (None if absent or a bare switch at the end)."""
    value = None
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args) and not args[i + 1].startswith("--"):
            value = args[i + 1]
        elif a.startswith(flag + "="):
            value = a.split("=", 1)[1]
    return value


def gpu_memory_utilization(args: Sequence[str]) -> str:
    """The --gpu-memory-utilization a rank's argv starts vLLM with (the memory gate's input)."""
    return flag_value(args, "--gpu-memory-utilization") or GPU_MEMORY_UTILIZATION


class VllmEngine:
    """The vLLM family as an ``Engine`` (sparkrig/engines/base.py)."""

    family = "vllm"
    progress_parser = "vllm-metrics"  # Prometheus /metrics

    def run_flags(self, stack: Stack) -> list[str]:
        return ["--entrypoint", ENTRYPOINT]

    def serve_args(self, stack: Stack, profile: str, request: ServeRequest) -> list[str]:
        return serve_args(stack, profile, **request.fields())

    def rendezvous_port(self, stack: Stack, master_port: int) -> int:
        return stack.master_port or master_port

    def topology_problem(self, stack: Stack, nnodes: int) -> str | None:
        if not GLM53_ATTENTION_HEADS % nnodes:
            return None
        return (
            "is vLLM tensor parallel over every rank, and "
            f"GLM-5.3-Flash's {GLM53_ATTENTION_HEADS} attention heads are not divisible by "
            f'{nnodes} (vLLM splits them evenly; docs/rings.md "vLLM on three '
            'Sparks"): use 2 or 4 Sparks, or a stack that serves on 3'
        )

    def ring_refusal(self, stack: Stack) -> str:
        return RING_REFUSAL

    def fabric_env_problems(
        self, stack: Stack, nnodes: int, fabric_env: Sequence[tuple[str, str]]
    ) -> list[str]:
        return []  # a vLLM rank takes the fabric env as it is

    def graph_files(self, plan: topology.Plan, rank: int) -> Mapping[str, str]:
        # settings refuse vLLM on a ring; the fabric phase still plans the files NCCL would read
        return ring_graph_files(plan, rank)


ENGINE = VllmEngine()
