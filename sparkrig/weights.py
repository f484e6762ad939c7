"""The weights: which artifacts a rank needs and their lockfiles (read and checked on the control
machine), what a rank holds of them (``WeightsState``, the ``state`` job in one command), and
the operations that fetch, copy, re-hash and serve them (the host package's jobs do the work on
the host: files/sparkhost)."""

from __future__ import annotations

import json
import shlex
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

from pyinfra import host, logger
from pyinfra.api import FactBase, QuoteString, StringCommand, operation
from pyinfra.api.exceptions import FactProcessError
from sparkhost.lockfile import installed_path
from sparkhost.units import transient_command

from sparkrig import lockfile
from sparkrig.config.model import Settings
from sparkrig.failing import fail_host
from sparkrig.hostpkg import PYTHON
from sparkrig.hubtoken import hub_token
from sparkrig.paths import revision_dir
from sparkrig.shown import ShownCommand
from sparkrig.stateread import Part, Values, read_here

PROGRESS_EVERY_S = 60  # a fetch's progress line in the deploy's output: one a minute at most


@dataclass(frozen=True)
class Artifact:
    name: str  # model | drafter
    subdir: str  # under weights_dir: <name>-<commit>, one directory per revision
    lock_text: str
    remote_lock: str
    dest: str
    commit: str
    total_files: int
    total_bytes: int
    gated: object = False  # the Hub's ``gated`` as the lockfile records it: a token fetches it


def artifacts(s: Settings) -> list[Artifact]:
    """The model, plus the drafter when the profile needs it; each with its checked lockfile."""
    k = s.knobs
    out = []
    for name, repo, revision in s.locked_artifacts:
        text, lock = lockfile.checked(k.lockfile_dir, repo, revision, k.hub_endpoint)
        totals = lockfile.summary(lock)
        out.append(
            Artifact(
                name=name,
                subdir=f"{name}-{revision}",
                lock_text=text,
                remote_lock=installed_path(k.config_dir, name),
                dest=revision_dir(k.weights_dir, name, revision),
                commit=revision,
                total_files=totals["files"],
                total_bytes=totals["bytes"],
                gated=lock.get("gated", False),
            )
        )
    return out


def token_text() -> str | None:
    """The control machine's Hub token as the head's token file holds it (found the way
    huggingface_hub finds it: sparkrig/hubtoken.py), or None when there is none."""
    token = hub_token()
    return token + "\n" if token else None


# ---------------------------------------------------------------------------------------------
# The fact: weights on disk, judged against a lockfile
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WeightsReport:
    ok: bool = False
    error: str = ""
    commit: str = ""  # of the lockfile on the host
    total_files: int = 0
    total_bytes: int = 0
    verified: int = 0
    unverified: int = 0  # right size, no valid stamp: hashed before deciding
    missing: int = 0
    partial: int = 0
    mismatched: int = 0
    files_to_fetch: int = -1
    bytes_to_fetch: int = 0
    fetch_state: str = ""

    @property
    def complete(self) -> bool:
        return self.ok and self.files_to_fetch == 0

    def summary(self) -> str:
        if not self.ok:
            return f"state unknown ({self.error or 'no answer'})"
        return (
            f"fetch {self.files_to_fetch} of {self.total_files} files, "
            f"{self.bytes_to_fetch / 1024**3:.2f} GiB ({self.verified} verified, "
            f"{self.unverified} to re-hash, {self.missing} missing, {self.partial} partial, "
            f"{self.mismatched} mismatched)"
        )


_NO_WEIGHTS_STATE = '{"ok": false, "error": "fetcher or lockfile not installed"}'


class WeightsState(FactBase[WeightsReport]):
    """
    What is on disk against the lockfile (the host package's ``state`` job: stamps, sizes,
    partials), in one read-only command; "unknown" before the package and lockfile are installed.
    """

    default = WeightsReport

    def command(self, sparkhost: str, lock: str, dest: str) -> StringCommand:
        return StringCommand(
            "test -f", QuoteString(f"{sparkhost}/state.py"), "&& test -f", QuoteString(lock),
            "&&", PYTHON, QuoteString(sparkhost), "state --lock", QuoteString(lock),
            "--dest", QuoteString(dest), "2>/dev/null || echo", QuoteString(_NO_WEIGHTS_STATE),
        )  # fmt: skip

    def process(self, output: list[str]) -> WeightsReport:
        try:
            raw = json.loads("\n".join(output))
        except json.JSONDecodeError as err:
            raise FactProcessError(f"weights state is not JSON: {err}") from None
        fields = {k: raw[k] for k in WeightsReport.__dataclass_fields__ if k in raw}
        fields["fetch_state"] = str((raw.get("fetch") or {}).get("state") or "")
        return WeightsReport(**fields)


# ---------------------------------------------------------------------------------------------
# Operations
# ---------------------------------------------------------------------------------------------


def weights_key(lock: str) -> str:
    return f"weights:{lock}"


def weights_parts(s: Settings, sparkhost: str) -> list[Part]:
    """The state read's parts of the weights: one per artifact, judged by the host package's
    ``state`` job (installed under ``sparkhost``) against its lockfile on the host."""
    parts = []
    for a in artifacts(s):
        args = {"sparkhost": sparkhost, "lock": a.remote_lock, "dest": a.dest}
        parts.append(Part(weights_key(a.remote_lock), WeightsState, tuple(sorted(args.items()))))
    return parts


def weights_of(values: Values, lock: str) -> WeightsReport:
    """What ``values`` say of the weights of the lockfile ``lock`` (on the host)."""
    return values.get(weights_key(lock), WeightsState)


@operation()
def weights_present(
    fetcher: list[str],
    lock: str,
    dest: str,
    unit: str,
    source: list[str],
    commit: str,
    total_files: int,
    total_bytes: int,
    source_absent: str = "",
) -> Generator[Any, None, None]:
    """
    Make ``dest`` hold every file of the lockfile, sha256-verified, fetching what is missing.

    The fetch runs as a transient systemd unit, so it survives a dropped SSH session or a
    Ctrl-C of pyinfra; the deploy prints its progress lines (bytes, rate per uplink, ETA) at
    every verbosity, one a minute at most, and a re-run re-attaches to it.
    Verified files are confirmed by their stamps: a change here is a real fetch (a restart
    trigger); a full re-hash is ``weights_rehashed``, run before this and never a trigger.

    + fetcher: argv of the host package (its fetch and follow jobs: sparkrig/hostpkg.py)
    + lock: lockfile path on the host
    + dest: directory the files land in
    + unit: transient unit name for the fetch
    + source: fetcher arguments naming where bytes come from (``--endpoint``/``--base-url``,
      ``--uplink`` lanes, ``--token-file``)
    + commit: the lockfile's commit; a host lockfile of another commit (a revision bump not
      uploaded yet, at prepare) is judged as "everything may need fetching"
    + total_files: the lockfile's file count, for that summary
    + total_bytes: the lockfile's size, for that summary
    + source_absent: non-empty when the source is not in this run (the head, under --limit
      worker): fail with this as the reason instead of fetching from no one
    """
    state = weights_of(read_here(weights_key(lock)), lock)
    current = state.ok and state.commit == commit
    if current and state.complete:
        host.noop(f"{dest}: all {state.total_files} files of {commit[:12]} verified")
        return
    summary = (
        state.summary()
        if current
        else f"lockfile {commit[:12]} not judged on the host yet: up to {total_files} files, "
        f"{total_bytes / 1024**3:.2f} GiB"
    )
    if source_absent:
        logger.error(f"{host.print_prefix}{dest}: {summary}; {source_absent}")
        yield fail_host(f"{dest}: {summary}; {source_absent}")
        return
    logger.info(f"{host.print_prefix}{dest}: {summary}")
    fetch = [*fetcher, "fetch", "--lock", lock, "--dest", dest, "--verify", "quick", *source]
    follow = [*fetcher, "follow", "--unit", unit, "--status", f"{dest}.fetch-status.json",
              "--print-every", str(PROGRESS_EVERY_S)]  # fmt: skip
    yield ShownCommand(transient_command(unit, fetch, replace=False), "&&", shlex.join(follow))


@operation(is_idempotent=False)
def weights_rehashed(fetcher: list[str], lock: str, dest: str) -> Generator[Any, None, None]:
    """
    Re-hash every file of the lockfile (weights_verify = "full"); a file that fails loses its
    stamp, so ``weights_present`` fetches it again (that fetch, not this, restarts the pair).
    Preflight refuses it beside a serving rank (never through the page cache of a live
    pair: docs/sources.md, "Memory gate").

    + fetcher: argv of the host package (its verify job: sparkrig/hostpkg.py)
    + lock: lockfile path on the host
    + dest: directory the files are in
    """
    yield StringCommand(
        *[QuoteString(a) for a in fetcher], "verify --mode full --lock", QuoteString(lock),
        "--dest", QuoteString(dest), "||", "echo",
        QuoteString("files failed the re-hash: they are fetched again next"),
    )  # fmt: skip


@operation(is_idempotent=False)
def transient_unit_started(unit: str, command: list[str]) -> Generator[Any, None, None]:
    """
    Run ``command`` as a transient systemd unit (replacing one of the same name).

    + unit: unit name
    + command: argv
    """
    yield StringCommand(transient_command(unit, command))
