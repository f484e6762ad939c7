"""Releases: what a pair serves, and each rank's record of the releases that passed the gates.

A *release* is what an upgrade changes: the serving image (its tag hashes the base image digest
and every patch), the model and drafter revisions, and the serve profile. Each rank keeps a record
of the releases that passed the four gates, newest first (``<config_dir>/release.json``, written
after the gates pass, like Entrpi's install.sh stamp file), with the sha256 of the files that
make the release on that rank (the rank unit and the weights lockfiles).

The env file (``rank.env``) is not part of a release: it holds no release field (the RoCE GID
index, the fabric and NCCL environment), and an older copy could only bring back a stale index.

After a success the record gains the new release and keeps ``keep_releases`` of them; images and
weights revisions of releases that fell out of it are pruned (sparkrig/imagebuild.py,
sparkrig/revisiondirs.py). When the wanted release differs from the recorded one, the way back
to the recorded one is sparkrig/rollback.py's.

The record and the entries of ``weights_dir`` are read in the host's one state read
(``ReleaseState``, a part of sparkrig/stateread.py).
"""

from __future__ import annotations

import hashlib
import json
import shlex
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, replace
from io import BytesIO
from typing import Any

from pyinfra import host
from pyinfra.api import FactBase, QuoteString, StringCommand, operation
from pyinfra.api.command import FileUploadCommand
from pyinfra.api.exceptions import FactProcessError
from sparkhost.lockfile import installed_path

from sparkrig.config.model import Settings
from sparkrig.factlines import END
from sparkrig.image import local_base, serving_image
from sparkrig.owned import owned_of
from sparkrig.paths import paths
from sparkrig.stacks import DEFAULT_STACK
from sparkrig.stateread import Part, Values, read_here

RECORD = "release.json"
LISTING = "##SPARKRIG-WEIGHTS-DIR"


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


def rolling_refusal(pairs: Sequence[str]) -> str:
    """Why a run that takes several serving pairs to a new release at once is refused (``change``
    is "" where nothing serves yet: a first deploy takes every pair at once, no request lost)."""
    return (
        f"the release changes on pairs {', '.join(pairs)} at once: behind one endpoint a release "
        "goes one pair at a time while the others serve; run `python3 -m sparkrig roll "
        "inventory.py` with the same --data (it runs the deploy with --limit one pair after the "
        "other), or the deploy with --limit <pair> yourself"
    )


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
