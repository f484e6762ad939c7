"""Engine families: what turns a stack's declaration into a rank's engine command line, and what
the engine itself decides about a run (its rendezvous port, the rank counts and fabrics it
refuses, its fabric env, its progress reader).

One module per family (``Stack.family``), each an ``Engine`` (``base.py``) registered here by its
family name: ``vllm`` and ``tensorfold``. The layers above ask ``engine_of(stack)``; a new family
is one module and one entry in ``ENGINES``."""

from __future__ import annotations

from sparkrig.engines import tensorfold, vllm
from sparkrig.engines.base import Engine
from sparkrig.stacks.base import Stack

__all__ = ["ENGINES", "Engine", "engine_of", "progress_parser"]

ENGINES: dict[str, Engine] = {e.family: e for e in (vllm.ENGINE, tensorfold.ENGINE)}


def engine_of(stack: Stack) -> Engine:
    """The engine of ``stack``'s family; ValueError naming the registered ones."""
    try:
        return ENGINES[stack.family]
    except KeyError:
        raise ValueError(
            f"stack {stack.name!r} is of the {stack.family!r} family, which no engine serves; "
            f"the engines: {', '.join(sorted(ENGINES))}"
        ) from None


def progress_parser(stack: Stack) -> str:
    """How the watchdog reads ``stack``'s progress: its own declaration, else its engine's."""
    return stack.progress_parser or engine_of(stack).progress_parser
