"""Suite-wide rules.

Under SPARKRIG_NO_SKIPS=1 (set by `make test`) or CI=true a skipped test is a failure: a missing
dependency (torch, root for network namespaces, the qemu lab) must turn CI red, never quietly
shrink what a green run proves. Outside it, skips are listed with reasons (-rs).

The plan tests drive pyinfra's CLI in-process, and importing it gevent-patches threading and
sockets for the whole process. `make test` gives them a process of their own; when one pytest
run holds both (a bare `pytest`), they run last, and any other test that would run in a patched
process fails instead of running differently than alone."""

from __future__ import annotations

import os
from collections.abc import Generator
from typing import Any

import pytest

NO_SKIPS = os.environ.get("SPARKRIG_NO_SKIPS") == "1" or os.environ.get("CI") == "true"
PLAN = ("tests/plan/", "tests/image/test_plan_image.py")


def is_plan(item: pytest.Item) -> bool:
    return item.nodeid.startswith(PLAN)


# pytest-timeout's bound for one test (pyproject: timeout = 600 s) suits the quick suites; a lab
# test boots or converges VMs under qemu TCG (the first one holds the lab's boot; a first converge
# took 26 min on the loaded lab, docs/lab.md), an install test fills fresh venvs from the index.
# A marker of the test's own (@pytest.mark.timeout) wins.
LAB_TIMEOUT_S = 2700
INSTALL_TIMEOUT_S = 1800


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=is_plan)  # stable: the plan tests last, each group in its own order
    for item in items:
        if item.get_closest_marker("timeout") is not None:
            continue
        if item.get_closest_marker("lab") is not None:
            item.add_marker(pytest.mark.timeout(LAB_TIMEOUT_S))
        elif item.get_closest_marker("install") is not None:
            item.add_marker(pytest.mark.timeout(INSTALL_TIMEOUT_S))


def pytest_runtest_setup(item: pytest.Item) -> None:
    if is_plan(item):
        return
    from gevent import monkey

    if monkey.is_module_patched("threading") or monkey.is_module_patched("socket"):
        pytest.fail(
            "threading/sockets are gevent-patched (pyinfra_cli was imported): this test would "
            "not run as it does alone; run the plan tests in their own process (make unit)"
        )


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


@pytest.fixture(autouse=True)
def _fake_bench(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """The plan tests' @fake heads answer no HTTP: the release gate's short bench answers with
    tests/plan/fakebench.py's canned results (tests/plan/test_bench_gate.py sets its own)."""
    if is_plan(request.node):
        from tests.plan import fakebench

        fakebench.stub(monkeypatch)
