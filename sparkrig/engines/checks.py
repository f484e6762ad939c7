"""The argument checks every family adapter makes before it builds a rank's argv: the stack's
family, the rank and the head's address, the ports, the model directory and the extra
arguments."""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

from sparkrig.stacks.base import Stack


def check_port(name: str, port: int) -> None:
    if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
        raise ValueError(f"{name} must be a TCP port (1..65535), got {port!r}")


def check_rank(
    stack: Stack, family: str, rank: int, nnodes: int, master_addr: str, min_nodes: int, why: str
) -> None:
    """The stack is of ``family``; ``nnodes`` >= ``min_nodes`` (``why``: the family's reason);
    ``rank`` in 0..nnodes-1; ``master_addr`` an IPv4 address (the head's fabric address)."""
    if stack.family != family:
        raise ValueError(f"stack {stack.name!r} is of the {stack.family} family, not {family}")
    if not isinstance(nnodes, int) or nnodes < min_nodes:
        raise ValueError(f"nnodes must be >= {min_nodes}{why}, got {nnodes!r}")
    if not isinstance(rank, int) or not 0 <= rank < nnodes:
        raise ValueError(f"rank must be in 0..{nnodes - 1}, got {rank!r}")
    try:
        ipaddress.IPv4Address(master_addr)
    except ValueError:
        raise ValueError(f"master_addr must be an IPv4 address, got {master_addr!r}") from None


def check_inputs(model_dir: str, extra_args: Sequence[str]) -> None:
    """A model directory is given, and the operator's ``extra_args`` are a list of tokens (a
    string would be appended one character at a time)."""
    if not model_dir:
        raise ValueError("model_dir is required")
    if isinstance(extra_args, str):
        raise TypeError("extra_args must be a list of tokens, not a string")
