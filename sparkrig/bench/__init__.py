"""sparkrig's bench: the seed articles' measurement protocols as one command
(``python3 -m sparkrig.bench``: seed 000's in protocol.py, seed 004's in seed004.py), against the
inventory's head or any OpenAI-compatible endpoint, and ``python3 -m sparkrig.bench compare`` for
several stacks' results side by side (compare.py). docs/bench.md says how to read each figure
against the seeds'."""

from __future__ import annotations

from .client import Endpoint, StreamResult
from .protocol import SHORT, Protocol, measure, short_bench

__all__ = ["SHORT", "Endpoint", "Protocol", "StreamResult", "measure", "short_bench"]
