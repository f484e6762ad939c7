"""The stacks sparkrig deploys, by the name the `stack` knob takes (docs/stacks.md).

Adding a stack is adding one module here with one ``Stack`` value and one line in ``STACKS``;
a new engine family also adds one module under ``sparkrig/engines/``."""

from __future__ import annotations

from sparkrig.stacks import entrpi_exl3, sfxnz_v13, tensorfold, tensorfold_ring, vllm_nvfp4
from sparkrig.stacks.base import Stack

DEFAULT_STACK = "vllm-nvfp4"

STACKS: dict[str, Stack] = {
    s.name: s
    for s in (
        vllm_nvfp4.STACK,
        entrpi_exl3.STACK,
        sfxnz_v13.STACK,
        tensorfold.STACK,
        tensorfold_ring.STACK,
    )
}


def get(name: str) -> Stack:
    """The declared stack ``name``; ValueError naming the declared ones."""
    try:
        return STACKS[name]
    except KeyError:
        raise ValueError(
            f"unknown stack {name!r}; choose one of {', '.join(sorted(STACKS))} (docs/stacks.md)"
        ) from None
