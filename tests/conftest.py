"""Suite-wide rules.

Under SPARKRIG_NO_SKIPS=1 (set by `make test`, which CI runs) a skipped test is a failure: a
missing dependency (torch, root for network namespaces, the qemu lab) must turn CI red, never
quietly shrink what a green run proves. Outside it, skips are listed with reasons (-rs)."""

from __future__ import annotations

import os
from collections.abc import Generator
from typing import Any

import pytest

NO_SKIPS = os.environ.get("SPARKRIG_NO_SKIPS") == "1"


def skip_reason(longrepr: Any) -> str:
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator:
    outcome = yield
    report = outcome.get_result()
    if NO_SKIPS and report.skipped and not hasattr(report, "wasxfail"):
        report.outcome = "failed"
        report.longrepr = (
            f"{item.nodeid} would be skipped ({skip_reason(report.longrepr)}), and skips are "
            "failures under SPARKRIG_NO_SKIPS=1 (make test, CI): install what it needs"
        )
