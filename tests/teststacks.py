"""Test-only stacks: vllm-nvfp4's declaration under another name, registered in STACKS for one
test (pytest's monkeypatch takes it out again), so the stack layer is tested without depending on
which other stacks are declared."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from sparkrig.stacks import STACKS
from sparkrig.stacks.base import Pin, Stack
from sparkrig.stacks.vllm_nvfp4 import STACK as NVFP4

OTHER_IMAGE = "registry.example/other@sha256:" + "cd" * 32


def register(monkeypatch: Any, name: str = "test-other", **fields: Any) -> Stack:
    """A stack named ``name``: vllm-nvfp4's declaration with its own image, model and drafter
    pins (override any field with ``fields``), in STACKS until the test ends."""
    stack = replace(
        NVFP4,
        **{
            "name": name,
            "image": OTHER_IMAGE,
            "model": Pin("example/other-model", "1" * 40),
            "drafter": Pin("example/other-drafter", "2" * 40),
            **fields,
        },
    )
    monkeypatch.setitem(STACKS, name, stack)
    return stack
