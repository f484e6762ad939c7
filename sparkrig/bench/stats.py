"""The spread of repeated measurements: median and p10 (the figure a run in ten falls below)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100), linear between the closest ranks (numpy's default): p10 of
    three runs lies a fifth of the way from the lowest to the middle one."""
    if not values:
        raise ValueError("no values")
    xs = sorted(float(v) for v in values)
    pos = (len(xs) - 1) * q / 100
    low = int(pos)
    high = min(low + 1, len(xs) - 1)
    return xs[low] + (xs[high] - xs[low]) * (pos - low)


def spread(values: Sequence[float]) -> dict[str, Any]:
    """``{"median", "p10", "n"}`` of the values, rounded as the bench's figures are."""
    return {
        "median": round(statistics.median(values), 2),
        "p10": round(percentile(values, 10), 2),
        "n": len(values),
    }
