"""Releases: what a pair serves, kept until its successor passes the gates, and rolled back to.

A *release* is what an upgrade changes: the serving image (its tag hashes the base image digest
and every patch), the model and drafter revisions, and the serve profile. Each rank keeps a record
of the releases that passed the four gates, newest first (``<config_dir>/release.json``, written
after the gates pass, like Entrpi's install.sh stamp file), with the sha256 of the files that
make the release on that rank (the rank unit and the weights lockfiles).

When the wanted release differs from the recorded one, the deploy first copies those files to
``<file>.prev`` (only when they are the recorded release's: a file left by an unfinished upgrade
is never taken for the previous release). The previous image stays (pruning keeps every recorded
release's image) and so do its weights: they live per revision, ``<weights_dir>/<name>-<commit>``,
so a rollback downloads nothing. If the new release fails its NCCL smoke test, a rank fails to
start (tasks/service.py), the head fails to boot or a gate fails (tasks/verify.py), nothing more
of it starts (those operations run with ``_ignore_errors`` during an upgrade and are watched by
``rollback()``), every rank puts the ``.prev`` files back and the pair restarts in order
(worker(s), then the head), is verified by the gates, and the run fails naming what failed and
that the previous release serves again.

The env file (``rank.env``) is not part of a release: it holds no release field (the RoCE GID
index, the fabric and NCCL environment), and an older copy could only bring back a stale index.

After a success the record gains the new release and keeps ``keep_releases`` of them; images and
weights revisions of releases that fell out of it are pruned. A run whose release does not change
copies nothing, restarts nothing and rolls nothing back.

Everything here is read in the host's one state read (``ReleaseState``, a part of
sparkrig/stateread.py): the record and the entries of ``weights_dir``. The rollback's ordered
path, a group of these operations, is tasks/rollback.py.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import time
from collections.abc import Callable, Generator, Iterable, Sequence
from dataclasses import dataclass, replace
from io import BytesIO
from typing import Any

from pyinfra import host, logger
from pyinfra.api import FactBase, QuoteString, StringCommand, operation
from pyinfra.api.command import FileUploadCommand
from pyinfra.api.exceptions import FactProcessError
from sparkhost.lockfile import installed_path

from sparkrig.config.model import Settings
from sparkrig.factlines import END
from sparkrig.failing import fail_host
from sparkrig.image import local_base, serving_image
from sparkrig.owned import PathState, owned_of
from sparkrig.paths import paths
from sparkrig.runscope import Watch, watch
from sparkrig.stacks import DEFAULT_STACK
from sparkrig.stateread import Part, Values, read_here
from sparkrig.weights import Artifact

RECORD = "release.json"
PREV = ".prev"
LISTING = "##SPARKRIG-WEIGHTS-DIR"
REVISION_DIR = re.compile(r"^(?P<name>model|drafter)-(?P<commit>[0-9a-f]{40})$")
LEGACY_DIRS = ("model", "drafter")  # the layout before per-revision directories


def record_path(config_dir: str) -> str:
    return f"{config_dir.rstrip('/')}/{RECORD}"


# ---------------------------------------------------------------------------------------------
# The release and its record (pure)
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Release:
    """One release as a rank runs it. ``files``: (path, sha256) of the files that make it on the
    rank (``release_files``), known once it is installed; they do not take part in identity."""

    image: str
    base: str  # the local base tag the image was built from (kept with the image)
    model_revision: str
    drafter_revision: str  # "" when the profile needs no drafter
    profile: str
    files: tuple[tuple[str, str], ...] = ()
    # the NCCL smoke test's figure on this rank (sparkrig/busbw.py), as sorted (key, value) pairs;
    # no part of identity: the same release measured again keeps its newest figure
    fabric: tuple[tuple[str, Any], ...] = ()
    # (field, value) of the host baseline it passed the gates on (sparkrig/baseline.py); not
    # part of identity: a kernel or driver that moved is drift, not another release
    baseline: tuple[tuple[str, str], ...] = ()
    # the release gate's short-bench figures on the pair (sparkrig/benchgate.py), the same way
    bench: tuple[tuple[str, Any], ...] = ()
    # what the rank's engine loaded when it passed (sparkrig/runtime.py ``record_of``), likewise
    runtime: tuple[tuple[str, Any], ...] = ()
    # the soak gate's figure on the pair (sparkrig/soakgate.py), likewise
    soak: tuple[tuple[str, Any], ...] = ()
    # the stack it serves (knob `stack`): a stack change is a release change even where the
    # image and revisions stay; a record from before stacks holds the first one's releases
    stack: str = DEFAULT_STACK

    @property
    def identity(self) -> tuple[str, str, str, str, str]:
        return (self.stack, self.image, self.model_revision, self.drafter_revision, self.profile)

    @property
    def weights(self) -> tuple[str, ...]:
        """Its revision directories' names under weights_dir."""
        names = [f"model-{self.model_revision}"]
        if self.drafter_revision:
            names.append(f"drafter-{self.drafter_revision}")
        return tuple(names)

    def label(self) -> str:
        tag = self.image.rpartition(":")[2]
        drafter = f", drafter {self.drafter_revision[:12]}" if self.drafter_revision else ""
        return (
            f"stack {self.stack}, image {tag[:12]}, model {self.model_revision[:12]}{drafter}, "
            f"profile {self.profile}"
        )

    def to_json(self) -> dict[str, Any]:
        out = {
            "image": self.image,
            "base": self.base,
            "model_revision": self.model_revision,
            "drafter_revision": self.drafter_revision,
            "profile": self.profile,
            "stack": self.stack,
            "files": {path: sha for path, sha in self.files},
        }
        if self.fabric:  # absent when unmeasured: a record from before the figure stays as it is
            out["fabric"] = dict(self.fabric)
        if self.baseline:
            out["baseline"] = dict(self.baseline)
        if self.bench:
            out["bench"] = dict(self.bench)
        if self.runtime:
            out["runtime"] = dict(self.runtime)
        if self.soak:
            out["soak"] = dict(self.soak)
        return out


def release_from(raw: Any) -> Release:
    if not isinstance(raw, dict):
        raise ValueError(f"a release is not an object: {raw!r}")
    files = raw.get("files") or {}
    if not isinstance(files, dict):
        raise ValueError("a release's files are not an object")
    baseline = raw.get("baseline") or {}
    if not isinstance(baseline, dict):
        raise ValueError("a release's baseline is not an object")
    return Release(
        image=str(raw["image"]),
        base=str(raw.get("base", "")),
        model_revision=str(raw["model_revision"]),
        drafter_revision=str(raw.get("drafter_revision") or ""),
        profile=str(raw["profile"]),
        stack=str(raw.get("stack") or DEFAULT_STACK),
        files=tuple(sorted((str(p), str(h)) for p, h in files.items())),
        fabric=_items(raw.get("fabric")),
        baseline=tuple(sorted((str(k), str(v)) for k, v in baseline.items())),
        bench=_items(raw.get("bench")),
        runtime=_items(raw.get("runtime")),
        soak=_items(raw.get("soak")),
    )


def _items(raw: Any) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted(raw.items())) if isinstance(raw, dict) else ()


def record_text(releases: Sequence[Release]) -> str:
    """release.json as the deploy writes it (stable: equal records are equal bytes)."""
    data = {"version": 1, "releases": [r.to_json() for r in releases]}
    return json.dumps(data, indent=1, sort_keys=True) + "\n"


def parse_record(text: str) -> tuple[Release, ...]:
    """The releases of a release.json, newest first; ValueError when it is not one."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"not JSON: {err}") from None
    if not isinstance(data, dict) or data.get("version") != 1:
        raise ValueError("not a version 1 release record")
    try:
        return tuple(release_from(r) for r in data.get("releases") or [])
    except (KeyError, TypeError) as err:
        raise ValueError(f"a release lacks {err}") from None


def history(wanted: Release, recorded: Sequence[Release], keep: int) -> tuple[Release, ...]:
    """The record once ``wanted`` passed the gates: it first, then the older releases (one per
    identity), ``keep`` in all."""
    older = [r for r in recorded if r.identity != wanted.identity]
    unique: list[Release] = []
    for r in older:
        if all(u.identity != r.identity for u in unique):
            unique.append(r)
    return (wanted, *unique)[: max(keep, 1)]


def weights_kept(kept: Sequence[Release]) -> list[str]:
    """Revision directory names of the kept releases."""
    return sorted({name for r in kept for name in r.weights})


def weights_to_prune(entries: Iterable[tuple[str, str]], keep: Iterable[str]) -> list[str]:
    """Revision directories under weights_dir (``<name>-<commit>``, nothing else) not in
    ``keep`` (sorted)."""
    kept = set(keep)
    return sorted(
        name
        for kind, name in entries
        if kind == "dir" and REVISION_DIR.match(name) and name not in kept
    )


def images_kept(kept: Sequence[Release]) -> list[str]:
    """Images (and their local bases) of the kept releases: pruning leaves them."""
    return sorted({ref for r in kept for ref in (r.image, r.base) if ref})


# ---------------------------------------------------------------------------------------------
# The state read's part: the record and what weights_dir holds
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReleaseReport:
    """What a rank holds: its record (empty: none) and the entries of weights_dir (kind, name)."""

    releases: tuple[Release, ...] = ()
    entries: tuple[tuple[str, str], ...] = ()
    error: str = ""  # the record exists but cannot be read

    @property
    def serving(self) -> Release | None:
        """The release that last passed the gates here."""
        return self.releases[0] if self.releases else None

    def has_dir(self, name: str) -> bool:
        return ("dir", name) in self.entries


class ReleaseState(FactBase[ReleaseReport]):
    """The rank's release record and the entries of weights_dir (dir, link or file, by name)."""

    default = ReleaseReport

    def command(self, record: str, weights_dir: str) -> StringCommand:
        r, w = shlex.quote(record), shlex.quote(weights_dir)
        script = (
            f"cat {r} 2>/dev/null; echo; echo '{LISTING}'; "
            f'for p in {w}/*; do if [ -L "$p" ]; then t=link; elif [ -d "$p" ]; then t=dir; '
            f'elif [ -e "$p" ]; then t=file; else continue; fi; echo "$t ${{p##*/}}"; done; '
            f"echo '{END}'"
        )
        return StringCommand("sh", "-c", QuoteString(script))

    def process(self, output: list[str]) -> ReleaseReport:
        return parse_release_state(output)


def parse_release_state(lines: list[str]) -> ReleaseReport:
    if LISTING not in lines or END not in lines:
        raise FactProcessError("release state ended early (no marker)")
    cut = lines.index(LISTING)
    text = "\n".join(lines[:cut]).strip()
    entries = []
    for line in lines[cut + 1 : lines.index(END)]:
        kind, _, name = line.partition(" ")
        if kind not in ("dir", "link", "file") or not name:
            raise FactProcessError(f"release state: unexpected line {line!r}")
        entries.append((kind, name))
    releases: tuple[Release, ...] = ()
    error = ""
    if text:
        try:
            releases = parse_record(text)
        except ValueError as err:
            error = f"{RECORD} is unreadable ({err})"
    return ReleaseReport(releases=releases, entries=tuple(sorted(entries)), error=error)


# ---------------------------------------------------------------------------------------------
# What a rank wants, and what changes
# ---------------------------------------------------------------------------------------------


def release_files(s: Settings) -> list[str]:
    """The files that make a release on a rank: its unit (image, weights directories, serve
    flags), its env file (the stack's env) and the weights lockfiles. Kept as ``.prev`` during
    an upgrade, put back by a rollback: a failed stack change restores the previous stack's."""
    k, p = s.knobs, paths(s)
    files = [p.rank_unit, p.env_file, installed_path(k.config_dir, "model")]
    if s.needs_drafter:
        files.append(installed_path(k.config_dir, "drafter"))
    return files


def wanted(s: Settings, shas: dict[str, str] | None = None) -> Release:
    """The release this run installs; with ``shas`` (path -> sha256) its files' digests."""
    k = s.knobs
    files: tuple[tuple[str, str], ...] = ()
    if shas is not None:
        files = tuple(sorted((p, shas.get(p, "")) for p in release_files(s)))
    return Release(
        image=serving_image(s),
        base=local_base(k.image_repo, s.image_ref),
        model_revision=s.model.revision,
        drafter_revision=s.drafter.revision if s.needs_drafter and s.drafter else "",
        profile=k.profile,
        stack=k.stack,
        files=files,
    )


def change(s: Settings, report: ReleaseReport) -> str:
    """'<recorded> -> <wanted>' when this rank's recorded release is not the wanted one, else ''
    (no record: a first install, nothing to roll back to)."""
    serving = report.serving
    want = wanted(s)
    if serving is None or serving.identity == want.identity:
        return ""
    return f"{serving.label()} -> {want.label()}"


def bench_to_reach(want: Release, report: ReleaseReport) -> dict[str, Any]:
    """The short-bench figures a release change is held to (sparkrig/benchgate.py): each stack
    against its own. Within one stack, the serving release's (today's gate); across a stack
    switch, the newest kept release of the wanted stack that recorded figures (a switch back
    is held to what that stack measured here before), else none: the new stack's first figures
    become its baseline (another engine's speed is no floor for it)."""
    serving = report.serving
    if serving is None or serving.identity == want.identity:
        return {}
    if serving.stack == want.stack:
        return dict(serving.bench)
    mine = [r for r in report.releases if r.stack == want.stack and r.bench]
    return dict(mine[0].bench) if mine else {}


def stamped(s: Settings, report: ReleaseReport, shas: dict[str, str]) -> tuple[Release, ...]:
    """The record once the wanted release passed the gates, its files' digests from ``shas``."""
    return history(wanted(s, shas), report.releases, s.knobs.keep_releases)


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


# ---------------------------------------------------------------------------------------------
# Commands (pure): keep, restore, adopt, prune
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


def adopt_command(weights_dir: str, name: str, lock: str) -> str:
    """Rename a checkout of the old layout (``<weights_dir>/<name>``) to its revision's
    directory, read from the lockfile installed beside it; its stamps and status follow, so
    nothing is hashed or downloaded again (stamps key on relative paths, inode, mtime and ctime,
    which renaming the parent leaves alone)."""
    w, n, q = shlex.quote(weights_dir.rstrip("/")), shlex.quote(name), shlex.quote(lock)
    read = "import json,sys; print(json.load(open(sys.argv[1]))['commit'])"
    return "\n".join(
        [
            "set -e",
            f"old={w}/{n}",
            '[ -d "$old" ] && [ ! -L "$old" ] || exit 0',
            f"c=$(python3 -c {shlex.quote(read)} {q} 2>/dev/null || true)",
            'if ! printf %s "$c" | grep -qxE "[0-9a-f]{40}"; then',
            f'  echo "$old: no lockfile names its revision ({lock}); left in place" >&2; exit 0',
            "fi",
            f'new={w}/{n}-"$c"',
            'if [ -e "$new" ]; then echo "$old and $new both exist; left in place" >&2; exit 0; fi',
            'mv "$old" "$new"',
            'for x in stamps.json fetch-status.json; do [ ! -e "$old.$x" ] || mv "$old.$x" "$new.$x"; done',  # noqa: E501
            'echo "adopted $old as $new"',
        ]
    )


def prune_weights_command(weights_dir: str, names: Sequence[str]) -> str:
    w = weights_dir.rstrip("/")
    paths = []
    for name in names:
        base = shlex.quote(f"{w}/{name}")
        # the checkout, its stamps and status, and the fetcher's flock file (fetch.py: <dest>.lock)
        paths += [base, f"{base}.stamps.json", f"{base}.fetch-status.json", f"{base}.lock"]
    return "rm -rf " + " ".join(paths)


def release_part(s: Settings) -> Part:
    """The state read's part of the release record and the entries of weights_dir."""
    args = {"record": record_path(s.knobs.config_dir), "weights_dir": s.knobs.weights_dir}
    return Part("release", ReleaseState, tuple(sorted(args.items())))


def report_of(values: Values) -> ReleaseReport:
    """The release part of a host's state read; KeyError when it was read without it
    (``mine`` without "release"): an empty record there would write a history without the
    kept releases."""
    return values.get("release", ReleaseState)


# ---------------------------------------------------------------------------------------------
# Operations
# ---------------------------------------------------------------------------------------------


def _sh(script: str) -> StringCommand:
    return StringCommand("sh", "-c", QuoteString(script))


@operation()
def weights_adopted(weights_dir: str, artifact: str, lock: str) -> Generator[Any, None, None]:
    """
    Rename a checkout of the layout before per-revision directories to its revision's name.

    + weights_dir: where the weights live
    + artifact: model | drafter (the old directory's name)
    + lock: that artifact's lockfile on the host (names the checkout's revision; read before
      this run installs a new one)
    """
    if not report_of(read_here("release")).has_dir(artifact):
        host.noop(f"no {weights_dir}/{artifact} of the old layout")
        return
    yield _sh(adopt_command(weights_dir, artifact, lock))


def adoptable(art: Artifact, lock: PathState | None, record: ReleaseReport) -> bool:
    """A checkout of the old layout (``<weights_dir>/<name>``) that the weights phase adopts as
    ``art``'s revision: the lockfile installed beside it (``lock``, its state) is ``art``'s."""
    return bool(
        record.has_dir(art.name) and lock is not None and lock.sha256 == sha256_text(art.lock_text)
    )


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


@operation()
def record_stamped(
    path: str,
    release: Release,
    files: list[str],
    keep: int,
    fabric: Callable[[], dict[str, Any] | None] | None = None,
    bench: Callable[[], dict[str, Any] | None] | None = None,
    runtime: Callable[[], dict[str, Any] | None] | None = None,
    soak: Callable[[], dict[str, Any] | None] | None = None,
) -> Generator[Any, None, None]:
    """
    Record ``release`` (run only after the gates passed) first in the rank's release record,
    with its files' sha256 as they are now and the fabric's measured bandwidth, keeping ``keep``
    releases; a no-op when the record already says so.

    + path: release.json on the rank
    + release: the release the rank runs (its files unset)
    + files: the files that make it on the rank (``release_files``)
    + keep: releases the record keeps (knob keep_releases)
    + fabric: called when the operation runs: this run's NCCL smoke-test figure on the rank
      (sparkrig/busbw.py), None when none was measured (the recorded one of the release stays)
    + bench: likewise, the release gate's short-bench figures (sparkrig/benchgate.py)
    + runtime: likewise, what the rank's engine loaded (sparkrig/runtime.py)
    + soak: likewise, the soak gate's figure (sparkrig/soakgate.py)
    """
    state = read_here("release", "paths")
    have = report_of(state)
    owned = owned_of(state)
    digests = []
    for f in files:
        got = owned.file(f)
        if got is not None and got.sha256:
            digests.append((f, got.sha256))
    measured = fabric() if fabric is not None else None
    same = next((r for r in have.releases if r.identity == release.identity), None)
    benched = bench() if bench is not None else None
    loaded = runtime() if runtime is not None else None
    soaked = soak() if soak is not None else None
    now = replace(
        release,
        files=tuple(sorted(digests)),
        fabric=tuple(sorted(measured.items())) if measured else (same.fabric if same else ()),
        bench=tuple(sorted(benched.items())) if benched else (same.bench if same else ()),
        runtime=tuple(sorted(loaded.items())) if loaded else (same.runtime if same else ()),
        soak=tuple(sorted(soaked.items())) if soaked else (same.soak if same else ()),
    )
    text = record_text(history(now, have.releases, keep))
    if not have.error and record_text(have.releases) == text:
        host.noop(f"{path} already records this release")
        return
    tmp = f"{path}.sparkrig-new"
    yield FileUploadCommand(BytesIO(text.encode()), tmp)
    yield StringCommand("chmod 644", QuoteString(tmp))
    yield StringCommand("mv -f", QuoteString(tmp), QuoteString(path))


@operation()
def old_weights_pruned(weights_dir: str, keep: list[str]) -> Generator[Any, None, None]:
    """
    Remove weights revisions no kept release uses (call it only once the new pair is healthy).

    + weights_dir: where the revisions live
    + keep: revision directory names to keep (every kept release's)
    """
    names = weights_to_prune(report_of(read_here("release")).entries, keep)
    if not names:
        host.noop("no weights revision to prune")
        return
    logger.info(f"{host.print_prefix}weights: will remove {', '.join(names)}")
    yield prune_weights_command(weights_dir, names)


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
