"""The real vLLM package (the pin in requirements-vllm.txt), set up for a CPU-only machine.

Importing vLLM here costs ~30 s once per pytest process. Two adjustments, both about this machine
and not about vLLM's logic: the platform is set to vLLM's own CpuPlatform (as `vllm bench` does in
entrypoints/cli/main.py; with no GPU vLLM cannot infer a device), and the V2 runner's buffers are
told there is no UVA (a CPU-only torch has no pinned-memory allocator), so they fall back to plain
tensors, as vLLM does on a platform without pinned memory.
"""

from __future__ import annotations

import importlib.util
from types import ModuleType
from typing import Any

import pytest

VLLM_PIN = "0.33.0"


def not_installed(name: str) -> str:
    """Why a test that needs one of vLLM's packages is skipped (and, under CI or
    SPARKRIG_NO_SKIPS=1, fails: tests/conftest.py)."""
    return (
        f"{name} is one of vLLM's packages (requirements-vllm.txt) and is not installed: a "
        "control-side venv (requirements.txt) has none; `make deps` installs them"
    )


def vllm_package(name: str) -> ModuleType:
    """Import one of vLLM's packages, or skip the test saying which and where it comes from."""
    return pytest.importorskip(name, reason=not_installed(name))


def skip_without_vllm_package(name: str) -> None:
    """The same, without importing it (importing vllm itself costs ~30 s)."""
    if importlib.util.find_spec(name) is None:
        pytest.skip(not_installed(name))


def vllm_cpu() -> ModuleType:
    """Import vllm on CPU (a missing vllm is a skip, and skips fail `make test`)."""
    vllm = vllm_package("vllm")
    from vllm import platforms
    from vllm.platforms.cpu import CpuPlatform

    if not isinstance(platforms.current_platform, CpuPlatform):
        platforms.current_platform = CpuPlatform()
    import vllm.v1.worker.gpu.buffer_utils as buffer_utils

    buffer_utils.is_uva_available = lambda: False  # type: ignore[attr-defined]
    return vllm


def request_states(max_num_reqs: int, max_model_len: int, vocab_size: int) -> Any:
    """A real Model Runner V2 RequestState on the CPU."""
    vllm_cpu()
    import torch
    from vllm.v1.worker.gpu.states import RequestState

    return RequestState(
        max_num_reqs, max_model_len, max_model_len, 0, vocab_size, torch.device("cpu")
    )


def commit(req_states: Any, slot: int, token_ids: list[int]) -> None:
    """Write a slot's committed history and length the way the runner's staged writes do (the
    write kernel itself is Triton, which a CPU machine does not run)."""
    import torch

    n = len(token_ids)
    req_states.all_token_ids.gpu[slot, :n] = torch.tensor(token_ids, dtype=torch.int32)
    req_states.total_len.gpu[slot] = n
