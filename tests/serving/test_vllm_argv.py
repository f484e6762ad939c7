"""Every profile's `vllm serve` argv checked by the pinned vLLM itself (requirements-vllm.txt):
its own serve parser and serve-arg checks, EngineArgs, the parallel and cache configs, the
speculative config's fields and method, the tool/reasoning parser registries; and every VLLM_*
variable sparkrig sets exists in that vLLM's envs. The default image carries an older dev build
(docs/vllm.md): what this proves is "valid for vLLM 0.33.0"."""

from __future__ import annotations

import dataclasses
import json
import re
import typing
from itertools import product
from pathlib import Path
from typing import Any

import pytest
from serving_helpers import REPO
from vllm_helpers import VLLM_PIN, vllm_cpu

from sparkrig.profiles import PROFILES, flag_value, serve_args
from sparkrig.scripts import load_script

CASES = [(p, n, r) for p, n in product(PROFILES, (2, 4)) for r in (0, 1)]


@pytest.fixture(scope="module")
def vllm() -> Any:
    return vllm_cpu()


@pytest.fixture(scope="module")
def extractor(vllm: Any) -> Any:
    return load_script("extract_vllm_flags", REPO / "scripts" / "extract-vllm-flags.py")


@pytest.fixture(scope="module")
def parser(extractor: Any) -> Any:
    return extractor.serve_parser()[0]


def argv(profile: str, nnodes: int, rank: int) -> list[str]:
    return serve_args(profile, rank=rank, nnodes=nnodes, master_addr="192.168.100.10",
                      master_port=29521, model_dir="/var/lib/sparkrig/models/glm",
                      drafter_dir="/var/lib/sparkrig/models/drafter")  # fmt: skip


def test_the_pinned_version_is_installed(vllm: Any) -> None:
    assert vllm.__version__ == VLLM_PIN
    assert f"vllm=={VLLM_PIN}\n" in (REPO / "requirements-vllm.txt").read_text()


@pytest.mark.parametrize(("profile", "nnodes", "rank"), CASES)
def test_argv_parses_and_validates(parser: Any, profile: str, nnodes: int, rank: int) -> None:
    from vllm.config import CacheConfig, ParallelConfig
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.common.cli_args import validate_parsed_serve_args

    cmd = argv(profile, nnodes, rank)
    assert cmd[:2] == ["vllm", "serve"]
    args = parser.parse_args(cmd[1:])  # argparse exits 2 on an unknown flag or a bad value
    assert args.subparser == "serve" and args.model_tag == cmd[2]
    validate_parsed_serve_args(args)
    assert args.headless is (rank > 0)
    ea = AsyncEngineArgs.from_cli_args(args)
    assert (ea.nnodes, ea.node_rank, ea.tensor_parallel_size) == (nnodes, rank, nnodes)
    assert ea.distributed_executor_backend == "mp" and ea.block_size == 2304
    pc = ParallelConfig(
        tensor_parallel_size=ea.tensor_parallel_size, nnodes=ea.nnodes, node_rank=ea.node_rank,
        master_addr=ea.master_addr, master_port=ea.master_port,
        distributed_executor_backend=ea.distributed_executor_backend,
    )  # fmt: skip
    assert pc.world_size == nnodes and pc.world_size % pc.nnodes == 0
    cc = CacheConfig(
        block_size=ea.block_size, gpu_memory_utilization=ea.gpu_memory_utilization,
        kv_cache_memory_bytes=ea.kv_cache_memory_bytes, cache_dtype=ea.kv_cache_dtype,
    )  # fmt: skip
    assert cc.kv_cache_memory_bytes == PROFILES[profile].kv_cache_memory_bytes
    if PROFILES[profile].logits_processors:
        assert ea.logits_processors == list(PROFILES[profile].logits_processors)
        assert ea.speculative_config is None  # the guard runs without speculation


@pytest.mark.parametrize("profile", [p for p in PROFILES if PROFILES[p].speculative])
def test_speculative_config_fields_and_method(vllm: Any, profile: str) -> None:
    from vllm.config import SpeculativeConfig
    from vllm.config.speculative import SpeculativeMethod

    spec = json.loads(flag_value(argv(profile, 2, 0), "--speculative-config") or "{}")
    fields = {f.name for f in dataclasses.fields(SpeculativeConfig)}
    assert set(spec) <= fields, set(spec) - fields
    assert spec["method"] in typing.get_args(SpeculativeMethod)


@pytest.mark.parametrize(("flag", "kind"), [("--tool-call-parser", "tool"),
                                            ("--reasoning-parser", "reasoning")])  # fmt: skip
def test_parser_names_are_registered(vllm: Any, flag: str, kind: str) -> None:
    from vllm.reasoning import ReasoningParserManager
    from vllm.tool_parsers import ToolParserManager

    names = {flag_value(argv(p, 2, 0), flag) for p in PROFILES}
    for name in names:
        assert name
        if kind == "tool":
            assert isinstance(ToolParserManager.get_tool_parser(name), type)
        else:
            assert isinstance(ReasoningParserManager.get_reasoning_parser(name), type)


def test_unknown_flag_and_bad_values_are_refused(parser: Any) -> None:
    """The check has teeth: vLLM's parser rejects what a typo would produce."""
    cmd = argv("shared", 2, 0)
    with pytest.raises(SystemExit):
        parser.parse_args([*cmd[1:], "--kv-cache-bytes", "1"])
    with pytest.raises(SystemExit):
        parser.parse_args([*cmd[1:], "--block-size", "big"])
    # argparse abbreviations are on: tonyd2wild's `--kv-cache-memory` is --kv-cache-memory-bytes
    assert parser.parse_args([*cmd[1:], "--kv-cache-memory", "5"]).kv_cache_memory_bytes == 5


def _vllm_env_names() -> set[str]:
    """Every VLLM_* variable sparkrig sets: the env files and units of the golden renders,
    the templates, the Python that builds container arguments, and every declared stack's env
    (less the names it declares fork-only: ``Stack.fork_env``)."""
    from sparkrig.stacks import STACKS

    names = {
        name
        for stack in STACKS.values()
        for name in stack.env
        if name.startswith("VLLM_") and name not in stack.fork_env
    }
    rx = re.compile(r"\b(VLLM_[A-Z0-9_]+)\s*=")
    roots = [REPO / "tests" / "golden", REPO / "templates", REPO / "sparkrig", REPO / "tasks"]
    for root in roots:
        for path in Path(root).rglob("*"):
            if path.is_file():
                names |= set(rx.findall(path.read_text(errors="replace")))
    return names


def test_every_vllm_env_variable_exists(vllm: Any) -> None:
    import vllm.envs as envs

    names = _vllm_env_names()
    assert {"VLLM_HOST_IP", "VLLM_ENGINE_READY_TIMEOUT_S"} <= names
    missing = sorted(n for n in names if n not in envs.environment_variables)
    assert not missing, f"not variables of vllm {VLLM_PIN}: {missing}"


def test_flag_file_equals_a_fresh_extraction(extractor: Any) -> None:
    assert extractor.FLAGS_FILE.read_text() == extractor.render(), (
        "lab/vllm-flags.txt is stale: run scripts/extract-vllm-flags.py"
    )


def test_config_values_file_equals_a_fresh_extraction(extractor: Any) -> None:
    """The stand-in's stock flavour refuses `--quantization exl3` at the config stage from this
    file (lab/standin_flavour.py): it must be the pinned vLLM's own lists."""
    text = extractor.VALUES_FILE.read_text()
    assert text == extractor.render_values(), (
        "lab/vllm-values.txt is stale: run scripts/extract-vllm-flags.py"
    )
    assert "quantization modelopt_fp4\n" in text and "quantization exl3\n" not in text
    assert "attention-backend B12X\n" in text and "attention-backend B12X_MLA_SPARSE\n" not in text
