"""Fixtures shared by the serving tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from serving_helpers import Proc


@pytest.fixture
def procs() -> Iterator[list[Proc]]:
    """The stand-ins a test started (it appends each ``Proc``): killed when the test ends."""
    started: list[Proc] = []
    yield started
    for p in started:
        p.stop()
