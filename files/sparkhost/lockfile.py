"""Weights lockfiles: the one validator (the control side's sparkrig/lockfile.py makes them and
validates with this; the fetcher validates again on the host before trusting a path).

A lockfile pins a repo to a 40-hex commit and lists every file with its size and hash:
``sha256`` for LFS files, ``git_sha1`` (git blob sha1) for the small non-LFS ones."""

from __future__ import annotations

import json
import re
from typing import Any

LOCK_VERSION = 1
HEX40 = re.compile(r"^[0-9a-f]{40}$")
HEX64 = re.compile(r"^[0-9a-f]{64}$")


def installed_path(config_dir: str, name: str) -> str:
    """Where the deploy installs artifact ``name``'s lockfile ("model", "drafter") on a rank."""
    return f"{config_dir}/{name}.lock.json"


class LockfileError(ValueError):
    pass


def validate(lock: dict[str, Any]) -> None:
    """Raise LockfileError unless the lock is well formed (what the fetcher relies on): every
    path relative, inside the directory, not one of the fetcher's own working names."""
    if lock.get("version") != LOCK_VERSION:
        raise LockfileError(f"unsupported lockfile version {lock.get('version')!r}")
    if not isinstance(lock.get("repo"), str) or "/" not in lock["repo"]:
        raise LockfileError("repo must be 'org/name'")
    if not HEX40.match(str(lock.get("commit", ""))):
        raise LockfileError("commit must be 40 lowercase hex digits")
    if lock.get("gated", False) not in (False, "auto", "manual"):  # the Hub's own values
        raise LockfileError(f"gated must be false, 'auto' or 'manual', not {lock['gated']!r}")
    seen = set()
    for f in lock.get("files", []):
        p = f.get("path", "")
        if (
            not isinstance(p, str)
            or not p
            or p.startswith("/")
            or ".." in p.split("/")
            or "\0" in p
            or p.endswith(".part")
        ):
            raise LockfileError(f"unsafe path {p!r}")
        if p in seen:
            raise LockfileError(f"duplicate path {p!r}")
        seen.add(p)
        if not isinstance(f.get("size"), int) or f["size"] < 0:
            raise LockfileError(f"{p}: bad size")
        if "sha256" in f:
            if not HEX64.match(str(f["sha256"])):
                raise LockfileError(f"{p}: bad sha256")
        elif not HEX40.match(str(f.get("git_sha1", ""))):
            raise LockfileError(f"{p}: needs sha256 or git_sha1")
    if not seen:
        raise LockfileError("no files")


class Entry:
    """One file of a lockfile, as the fetcher works on it."""

    __slots__ = ("path", "size", "algo", "digest")

    def __init__(self, path: str, size: int, algo: str, digest: str):
        self.path = path
        self.size = size
        self.algo = algo  # "sha256" or "git_sha1"
        self.digest = digest


def entries(lock: dict[str, Any]) -> list[Entry]:
    """The files of a validated lock."""
    out = []
    for f in lock["files"]:
        if "sha256" in f:
            out.append(Entry(f["path"], f["size"], "sha256", f["sha256"]))
        else:
            out.append(Entry(f["path"], f["size"], "git_sha1", f["git_sha1"]))
    return out


def load(path: str) -> dict[str, Any]:
    """The lockfile at ``path``, validated (LockfileError names the file)."""
    with open(path) as fh:
        lock = json.load(fh)
    try:
        validate(lock)
    except LockfileError as e:
        raise LockfileError(f"{path}: {e}") from None
    return lock


def load_lock(path: str) -> tuple[dict[str, Any], list[Entry]]:
    """The validated lockfile at ``path`` and its files."""
    lock = load(path)
    return lock, entries(lock)
