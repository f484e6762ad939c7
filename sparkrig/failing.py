"""Failing one host, and only it, with its reasons (pyinfra's other hosts carry on to the barrier
and ``FAIL_PERCENT = 0`` stops the run there)."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from pyinfra import host, logger
from pyinfra.api import QuoteString, StringCommand, operation


def fail_host(reason: str) -> StringCommand:
    """A command that fails this host (only this one) and prints ``reason`` as the error."""
    return StringCommand("printf", "'%s\\n'", QuoteString(reason), ">&2;", "exit", "1")


@operation(is_idempotent=False)
def problems_absent(
    problems: list[str],
    heading: str = "preflight failed",
    passed: str = "every preflight check passes",
) -> Generator[Any, None, None]:
    """
    Fail this host with every reason it may not be converged, before anything on it changes.

    + problems: human-readable reasons; empty means the host passes
    + heading: first line of the failure (the reasons follow, one per line)
    + passed: the no-op reason when there is no problem
    """
    if not problems:
        host.noop(passed)
        return
    for problem in problems:
        logger.error(f"{host.print_prefix}{problem}")
    yield fail_host(f"{heading}:\n  " + "\n  ".join(problems))
