"""sparkrig's bench: the seed articles' measurement protocol as one command
(``python3 -m sparkrig.bench``), against the inventory's head or any OpenAI-compatible endpoint.
docs/bench.md says how to read each figure against the seeds'."""

from __future__ import annotations

from .client import Endpoint, StreamResult
from .protocol import SHORT, Protocol, measure, short_bench

__all__ = ["SHORT", "Endpoint", "Protocol", "StreamResult", "measure", "short_bench"]
