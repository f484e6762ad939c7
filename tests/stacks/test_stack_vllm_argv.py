"""Each vllm-family stack's flags checked by vLLM 0.33.0 itself, as tests/serving/test_vllm_argv.py
checks today's profiles: its own `vllm serve` parser, its serve-arg checks, EngineArgs, and the
engine configs that validate values later (quantization, attention backend, cache, kernel and
load configs). The argv is the stack's serve_flags and head_flags plus the rank-independent and
per-rank flags the vllm family adds (topology, API, headless, the profile's speculative config).

The stock flags must pass every check; the fork-only pieces must be exactly what vLLM 0.33.0
refuses: flags its parser refuses, values its engine configs refuse (tests/stacks/data/
recipes.json, with sources). Every VLLM_* name a stack sets is a variable of vLLM 0.33.0 unless
it is allow-listed there as fork-only."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from stack_helpers import DECLARED, REPO, fork_only
from vllm_helpers import vllm_cpu

from sparkrig.engines import vllm as vllm_family
from sparkrig.profiles import flag_value
from sparkrig.scripts import load_script
from sparkrig.stacks.base import Stack

VLLM_STACKS = [s for s in DECLARED.values() if s.family == "vllm"]
IDS = [s.name for s in VLLM_STACKS]
CASES = [(s, n, r) for s in VLLM_STACKS for n in (2, 4) for r in (0, 1)]
CASE_IDS = [f"{s.name}-{n}nodes-rank{r}" for s, n, r in CASES]
MODEL_DIR = "/var/lib/sparkrig/models/model-0000000000000000000000000000000000000000"
DRAFTER_DIR = "/var/lib/sparkrig/models/drafter-0000000000000000000000000000000000000000"


@pytest.fixture(scope="module")
def vllm() -> Any:
    return vllm_cpu()  # a missing vllm is a skip, and skips fail `make test`


@pytest.fixture(scope="module")
def parser(vllm: Any) -> Any:
    extractor = load_script("extract_vllm_flags", REPO / "scripts" / "extract-vllm-flags.py")
    return extractor.serve_parser()[0]


@pytest.fixture(scope="module")
def chat_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real file where the stack's --chat-template points (vLLM checks that a path-like
    template exists; the rank's container has the recipe's file there)."""
    path = tmp_path_factory.mktemp("stack") / "chat_template.jinja"
    path.write_text("{{ messages }}")
    return path


def argv(stack: Stack, nnodes: int, rank: int, chat_template: Path) -> list[str]:
    """`vllm serve` argv (without the entrypoint) of one rank, as the vllm family adapter
    (sparkrig/engines/vllm.py) builds it for the stack's one profile; the head's
    container path of a --chat-template is replaced by a real file (vLLM checks it exists)."""
    cmd = vllm_family.serve_args(
        stack, next(iter(stack.profiles)), rank=rank, nnodes=nnodes,
        master_addr="192.168.100.10", master_port=29521, model_dir=MODEL_DIR,
        engine_port=8001, drafter_dir=DRAFTER_DIR,  # the engine_port knob's default
    )[1:]  # fmt: skip
    if "--chat-template" in cmd:
        cmd[cmd.index("--chat-template") + 1] = str(chat_template)
    return cmd


def engine_refusals(vllm: Any, args: Any) -> set[str]:
    """The flag=value pieces vLLM 0.33.0's engine configs refuse (they pass argparse and
    AsyncEngineArgs, and fail when the engine config is built: facts §E.4)."""
    from vllm.config import AttentionConfig, CacheConfig, KernelConfig
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS
    from vllm.model_executor.model_loader import LoadFormats

    ea = AsyncEngineArgs.from_cli_args(args)
    refused: set[str] = set()
    if ea.quantization is not None and ea.quantization not in QUANTIZATION_METHODS:
        refused.add(f"--quantization={ea.quantization}")
    if ea.load_format not in LoadFormats.__args__:
        refused.add(f"--load-format={ea.load_format}")
    checks = {
        "--attention-backend": (lambda: AttentionConfig(backend=ea.attention_backend),
                                ea.attention_backend),
        "--moe-backend": (lambda: KernelConfig(moe_backend=ea.moe_backend), ea.moe_backend),
        "--linear-backend": (lambda: KernelConfig(linear_backend=ea.linear_backend),
                             ea.linear_backend),
    }  # fmt: skip
    for flag, (build, value) in checks.items():
        try:
            build()
        except ValueError:  # pydantic's ValidationError is a ValueError
            refused.add(f"{flag}={value}")
    CacheConfig(
        block_size=ea.block_size, gpu_memory_utilization=ea.gpu_memory_utilization,
        kv_cache_memory_bytes=ea.kv_cache_memory_bytes, cache_dtype=ea.kv_cache_dtype,
        kv_cache_dtype_skip_layers=ea.kv_cache_dtype_skip_layers,
        prefix_match_unit=ea.prefix_match_unit,
    )  # fmt: skip
    return refused


@pytest.mark.parametrize(("stack", "nnodes", "rank"), CASES, ids=CASE_IDS)
def test_argv_parses_and_validates(
    vllm: Any, parser: Any, chat_template: Path, stack: Stack, nnodes: int, rank: int
) -> None:
    from vllm.config import ParallelConfig
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.common.cli_args import validate_parsed_serve_args

    cmd = argv(stack, nnodes, rank, chat_template)
    args = parser.parse_args(cmd)  # argparse exits 2 on an unknown flag or a bad value
    validate_parsed_serve_args(args)
    assert args.headless is (rank > 0)
    ea = AsyncEngineArgs.from_cli_args(args)
    assert (ea.nnodes, ea.node_rank, ea.tensor_parallel_size) == (nnodes, rank, nnodes)
    assert ea.block_size == int(flag_value(stack.serve_flags, "--block-size") or 0)
    kv = flag_value(stack.serve_flags, "--kv-cache-memory-bytes")
    assert ea.kv_cache_memory_bytes == int(kv or 0)
    pc = ParallelConfig(
        tensor_parallel_size=ea.tensor_parallel_size, nnodes=ea.nnodes, node_rank=ea.node_rank,
        master_addr=ea.master_addr, master_port=ea.master_port,
        distributed_executor_backend=ea.distributed_executor_backend,
    )  # fmt: skip
    assert pc.world_size == nnodes
    if rank == 0 and stack.head_flags:
        assert args.chat_template == str(chat_template)


@pytest.mark.parametrize("stack", VLLM_STACKS, ids=IDS)
def test_fork_only_values_are_exactly_what_the_engine_refuses(
    vllm: Any, parser: Any, chat_template: Path, stack: Stack
) -> None:
    args = parser.parse_args(argv(stack, 2, 0, chat_template))
    assert engine_refusals(vllm, args) == set(fork_only(stack)["values"])


@pytest.mark.parametrize("stack", VLLM_STACKS, ids=IDS)
def test_fork_only_flags_are_refused_by_the_parser(
    parser: Any, chat_template: Path, stack: Stack
) -> None:
    cmd = argv(stack, 2, 0, chat_template)
    for flag in fork_only(stack)["flags"]:
        with pytest.raises(SystemExit):
            parser.parse_args([*cmd, flag, "1"])
    assert parser.parse_args(cmd)  # the stack's own argv, without them, parses


def test_the_engine_checks_have_teeth(vllm: Any, parser: Any, chat_template: Path) -> None:
    """A stock value a typo breaks is refused too, so an empty refusal set means something."""
    stack = DECLARED["sfxnz-v13"]
    cmd = argv(stack, 2, 0, chat_template)
    for flag, bad in (("--moe-backend", "marlln"), ("--attention-backend", "B12X_MLA"),
                      ("--quantization", "exl2"), ("--load-format", "instant")):  # fmt: skip
        try:
            args = parser.parse_args([*cmd, flag, bad])
        except SystemExit:
            continue  # argparse's choices caught it first: refused all the same
        assert f"{flag}={bad}" in engine_refusals(vllm, args), flag


@pytest.mark.parametrize("stack", VLLM_STACKS, ids=IDS)
def test_speculative_config_is_the_recipes(parser: Any, chat_template: Path, stack: Stack) -> None:
    spec = json.loads(flag_value(argv(stack, 2, 0, chat_template), "--speculative-config") or "{}")
    assert spec == {"method": "dflash", "model": DRAFTER_DIR, "num_speculative_tokens": 7}


@pytest.mark.parametrize("stack", VLLM_STACKS, ids=IDS)
def test_vllm_env_names_are_stock_or_allow_listed_fork_only(vllm: Any, stack: Stack) -> None:
    import vllm.envs as envs

    stock = set(envs.environment_variables)
    allowed = set(fork_only(stack)["env"])
    unknown = {n for n in stack.env if n.startswith("VLLM_") and n not in stock}
    assert unknown <= allowed, f"not variables of vllm 0.33.0 nor allow-listed: {unknown - allowed}"
    assert not allowed & stock, f"allow-listed as fork-only but stock: {sorted(allowed & stock)}"
