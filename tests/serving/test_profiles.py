"""serve_args: mandatory flags in every profile x rank, per-profile numbers, validation."""

from __future__ import annotations

import json
from itertools import product

import pytest
from serving_helpers import REPO  # noqa: F401  (puts the checkout on sys.path)

from sparkrig.profiles import (
    MANDATORY_FLAGS,
    PROFILES,
    flag_value,
    needs_drafter,
    serve_args,
    speculative_config,
)

BASE = dict(
    master_addr="192.168.100.10",
    master_port=29521,
    model_dir="/models/glm",
    engine_port=8000,
    served_name="glm-5.3-flash",
    drafter_dir="/models/drafter",
)


def build(profile: str, rank: int, nnodes: int = 2, **kw: object) -> list[str]:
    args = {**BASE, **kw}
    return serve_args(profile, rank=rank, nnodes=nnodes, **args)  # type: ignore[arg-type]


@pytest.mark.parametrize(("profile", "rank", "nnodes"), [
    (p, r, n) for p, n in product(PROFILES, (2, 3, 4)) for r in range(n)
])  # fmt: skip
def test_mandatory_flags_every_profile_and_rank(profile: str, rank: int, nnodes: int) -> None:
    a = build(profile, rank, nnodes)
    assert a[:3] == ["vllm", "serve", "/models/glm"]
    for flag in MANDATORY_FLAGS:
        assert flag in a, (profile, rank, flag)
    assert flag_value(a, "--tensor-parallel-size") == str(nnodes)
    assert flag_value(a, "--distributed-executor-backend") == "mp"
    assert flag_value(a, "--nnodes") == str(nnodes)
    assert flag_value(a, "--node-rank") == str(rank)
    assert flag_value(a, "--master-addr") == "192.168.100.10"
    assert flag_value(a, "--master-port") == "29521"
    assert flag_value(a, "--block-size") == "2304"
    assert flag_value(a, "--kv-cache-dtype") == "fp8_e4m3"
    assert flag_value(a, "--tool-call-parser") == "glm47"
    assert flag_value(a, "--max-model-len") == "262144"
    if rank == 0:
        assert "--headless" not in a
        assert flag_value(a, "--host") == "127.0.0.1"  # the front serves the LAN (docs/front.md)
        assert flag_value(a, "--port") == "8000"
        assert "--disable-fastapi-docs" in a
        assert flag_value(a, "--served-model-name") == "glm-5.3-flash"
    else:
        assert "--headless" in a
        for api in ("--host", "--port", "--served-model-name", "--disable-fastapi-docs"):
            assert api not in a


@pytest.mark.parametrize(
    ("profile", "seqs", "kv", "spec"),
    [
        ("single", "2", "3221225472", {"method": "dflash", "model": "/models/drafter",
                                       "num_speculative_tokens": 7}),
        ("shared", "8", "9663676416", {"method": "mtp", "num_speculative_tokens": 4}),
        ("guard", "8", "9663676416", None),
        ("long", "2", "9663676416", {"method": "mtp", "num_speculative_tokens": 4}),
    ],
)  # fmt: skip
def test_profile_numbers(profile: str, seqs: str, kv: str, spec: dict[str, object] | None) -> None:
    for rank in (0, 1):
        a = build(profile, rank)
        assert flag_value(a, "--max-num-seqs") == seqs
        assert flag_value(a, "--kv-cache-memory-bytes") == kv
        assert flag_value(a, "--max-num-batched-tokens") == "4096"
        raw = flag_value(a, "--speculative-config")
        assert (json.loads(raw) if raw else None) == spec


def test_guard_loads_logits_processor_without_speculation() -> None:
    a = build("guard", 0)
    assert flag_value(a, "--logits-processors") == "utf8_guard_lp:Utf8GuardLogitsProcessor"
    assert "--speculative-config" not in a
    for p in ("single", "shared", "long"):
        assert "--logits-processors" not in build(p, 0)


def test_needs_drafter() -> None:
    assert needs_drafter("single")
    assert not any(needs_drafter(p) for p in ("shared", "guard", "long"))
    with pytest.raises(ValueError, match="unknown profile"):
        needs_drafter("turbo")


def test_single_without_drafter_fails() -> None:
    with pytest.raises(ValueError, match="drafter"):
        build("single", 0, drafter_dir=None)
    assert speculative_config("shared") == '{"method":"mtp","num_speculative_tokens":4}'


def test_extra_args_appended_last_and_win() -> None:
    a = build("shared", 1, extra_args=["--max-num-seqs", "4", "--foo"])
    assert a[-3:] == ["--max-num-seqs", "4", "--foo"]
    assert flag_value(a, "--max-num-seqs") == "4"
    with pytest.raises(TypeError):
        build("shared", 1, extra_args="--foo")


def test_host_choice() -> None:
    assert flag_value(build("shared", 0, host="127.0.0.1"), "--host") == "127.0.0.1"


@pytest.mark.parametrize(
    "kw",
    [
        {"rank": 2},
        {"rank": -1},
        {"nnodes": 0},
        {"master_addr": "10.0.0.1/24"},
        {"master_addr": "head"},
        {"master_port": 0},
        {"engine_port": 70000},
        {"model_dir": ""},
    ],
)
def test_validation(kw: dict[str, object]) -> None:
    args: dict[str, object] = {**BASE, "rank": 0, "nnodes": 2, **kw}
    with pytest.raises(ValueError):
        serve_args("shared", **args)  # type: ignore[arg-type]


def test_flag_value_forms() -> None:
    assert flag_value(["--a", "1", "--a=2"], "--a") == "2"
    assert flag_value(["--a"], "--a") is None


def test_thinking_default_is_a_head_flag() -> None:
    head, worker = build("shared", 0), build("shared", 1)
    assert json.loads(flag_value(head, "--default-chat-template-kwargs") or "") == {
        "enable_thinking": False
    }
    assert flag_value(worker, "--default-chat-template-kwargs") is None  # API flag: head only
    on = build("shared", 0, thinking=True)
    assert json.loads(flag_value(on, "--default-chat-template-kwargs") or "")["enable_thinking"]
    assert "--default-chat-template-kwargs" not in build("shared", 0, thinking=None)
