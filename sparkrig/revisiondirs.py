"""The weights' per-revision directories under ``weights_dir`` (``<name>-<commit>``): a checkout of
the layout before them (``<weights_dir>/model``, ``<weights_dir>/drafter``) adopted as its
revision's, and the revisions no kept release uses pruned once the new pair is healthy. A kept
release's weights stay, so a rollback downloads nothing.

What ``weights_dir`` holds is read in the release part of the state read (sparkrig/release.py).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Generator, Iterable, Sequence
from typing import Any

from pyinfra import host, logger
from pyinfra.api import QuoteString, StringCommand, operation

from sparkrig.owned import PathState
from sparkrig.release import Release, ReleaseReport, report_of, sha256_text
from sparkrig.stateread import read_here
from sparkrig.weights import Artifact

REVISION_DIR = re.compile(r"^(?P<name>model|drafter)-(?P<commit>[0-9a-f]{40})$")
LEGACY_DIRS = ("model", "drafter")  # the layout before per-revision directories


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


# ---------------------------------------------------------------------------------------------
# Commands (pure): adopt, prune
# ---------------------------------------------------------------------------------------------


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
