"""The way back from a failed upgrade: the serving release's files kept, the run's one rollback
decision, the files put back.

When the wanted release differs from the recorded one (sparkrig/release.py ``change``), the deploy
first copies the files that make the recorded release on a rank to ``<file>.prev`` (only when they
are the recorded release's: a file left by an unfinished upgrade is never taken for the previous
release). The previous image stays (pruning keeps every recorded release's image) and so do its
weights (they live per revision: sparkrig/revisiondirs.py), so a rollback downloads nothing. If the
new release fails its NCCL smoke test (tasks/smoke.py), a rank fails to start (tasks/start.py), the
head fails to boot or a gate fails (tasks/verify.py), nothing more of it starts (those operations
run with ``_ignore_errors`` during an upgrade and are watched by ``rollback()``), every rank puts
the ``.prev`` files back and the pair restarts in order (worker(s), then the head), is verified by
the gates, and the run fails naming what failed and that the previous release serves again. A run
whose release does not change copies nothing, restarts nothing and rolls nothing back.

The rollback's ordered path, a group of these operations, is tasks/rollback.py.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Generator, Sequence
from typing import Any

from pyinfra import host, logger
from pyinfra.api import QuoteString, StringCommand, operation

from sparkrig.failing import fail_host
from sparkrig.runscope import Watch, watch

PREV = ".prev"

# ---------------------------------------------------------------------------------------------
# Commands (pure): keep, restore
# ---------------------------------------------------------------------------------------------


_SHA = 'sha() { [ -f "$1" ] && [ "$(sha256sum < "$1" | cut -c1-64)" = "$2" ]; }'


def keep_command(files: Sequence[tuple[str, str]]) -> str:
    """Copy each file of the serving release to ``<file>.prev`` unless that already holds it.
    A file that is neither (an earlier upgrade's, unfinished) fails: no rollback would be right."""
    lines = ["set -e", _SHA]
    for path, digest in files:
        p, prev, d = shlex.quote(path), shlex.quote(path + PREV), shlex.quote(digest)
        lines.append(
            f"if sha {prev} {d}; then :; elif sha {p} {d}; then cp -p {p} {prev}; else "
            f"echo {shlex.quote(f'{path} is not the recorded release and no {PREV} copy is')} "
            ">&2; exit 1; fi"
        )
    return "\n".join(lines)


def restore_command(files: Sequence[tuple[str, str]]) -> str:
    """Put every ``<file>.prev`` back (each checked against the record first), reload systemd."""
    lines = ["set -e", _SHA]
    for path, digest in files:
        prev, d = shlex.quote(path + PREV), shlex.quote(digest)
        lines.append(
            f"sha {prev} {d} || {{ echo {shlex.quote(f'cannot roll back: {path}{PREV} is not the previous release')} >&2; exit 1; }}"  # noqa: E501
        )
    lines += [f"cp -p {shlex.quote(p + PREV)} {shlex.quote(p)}" for p, _ in files]
    lines.append("systemctl daemon-reload")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Operations
# ---------------------------------------------------------------------------------------------


def _sh(script: str) -> StringCommand:
    return StringCommand("sh", "-c", QuoteString(script))


@operation()
def previous_kept(files: list[tuple[str, str]]) -> Generator[Any, None, None]:
    """
    Copy the serving release's files to ``<file>.prev`` while the release changes.

    + files: (path, sha256) of the recorded (serving) release's files; empty: the release does
      not change (or there is no record), nothing is kept
    """
    if not files:
        host.noop("the release does not change: nothing to keep")
        return
    yield _sh(keep_command(files))


@operation(is_idempotent=False)
def previous_restored(files: list[tuple[str, str]]) -> Generator[Any, None, None]:
    """
    Put the previous release's files back from ``<file>.prev`` (checked against the record).

    + files: (path, sha256) of the previous release's files; empty fails this host (nothing to
      roll back to)
    """
    if not files:
        yield fail_host(
            "cannot roll back: the release record of this rank lists no files of the previous "
            "release, so the failed release stays in place; read why it failed above, then fix "
            "the cause and run the deploy again, or set the knobs back to what last served "
            "(status.py shows it) and run it again"
        )
        return
    yield _sh(restore_command(files))


@operation(is_idempotent=False)
def previous_gates_passed(command: list[str]) -> Generator[Any, None, None]:
    """
    Run the four serving gates (exit 1 when one fails). Unlike ``serving_gates_passed`` it reads
    nothing while the run is prepared: it only ever runs after a failed upgrade.

    + command: the gate script's ``gates`` argv
    """
    yield StringCommand(*[QuoteString(a) for a in command])


# ---------------------------------------------------------------------------------------------
# The rollback decision: one for every host of the run
# ---------------------------------------------------------------------------------------------


class Rollback(Watch):
    """The run's one decision whether the pair rolls back: a watched operation of the new
    release failed on some rank (its NCCL smoke test, a rank's start, the head's boot wait, the
    gates). Those run with ``_ignore_errors`` during an upgrade, so the run goes on to the
    rollback operations (``_if=rollback()``)."""

    def __init__(self) -> None:
        super().__init__()
        self.decided_at: float | None = None  # monotonic time the failure was first seen

    def watch(self, what: str, meta: Any) -> Any:
        return self.add(what, meta)

    def failures(self) -> list[str]:
        """'<what>: <last lines of its output>' of every watched operation that failed."""
        out = []
        for what, meta in self.failed():
            lines = [x for x in meta.stderr_lines if x.strip()] or meta.stdout_lines
            out.append(f"{what}: {' / '.join(x.strip() for x in lines[-3:]) or 'failed'}")
        return out

    def __call__(self) -> bool:
        failed = bool(self.failures())
        if failed and self.decided_at is None:
            self.decided_at = time.monotonic()
        return failed


def rollback() -> Rollback:
    """The current run's rollback decision (one object for every host and phase)."""
    return watch("rollback", Rollback)


@operation(is_idempotent=False)
def upgrade_failed(release_change: str, previous: str) -> Generator[Any, None, None]:
    """
    Fail this rank after a rollback, naming what failed and that the previous release serves.

    + release_change: the release change that was attempted ('<old> -> <new>')
    + previous: the previous release's label
    """
    rolls_back = rollback()
    failures = rolls_back.failures()
    if not failures:  # --dry prepares every conditional op: nothing failed, nothing to say
        host.noop("no watched operation of the new release failed")
        return
    failed = "; ".join(failures)
    took = (
        f" {time.monotonic() - rolls_back.decided_at:.0f} s after the failure"
        if rolls_back.decided_at
        else ""
    )
    reason = (
        f"upgrade failed ({release_change}): {failed}. Rolled back: the previous release "
        f"({previous}) passed the four gates and serves again{took}"
    )
    logger.error(f"{host.print_prefix}{reason}")
    yield fail_host(reason)
