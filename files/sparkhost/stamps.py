"""The fetcher's hashing and stamp DB: a file is verified once and confirmed by stat afterwards.

Shared by fetch, verify and state (a stamp is valid only while size, mtime, inode and ctime are
unchanged and its hash equals the lockfile's)."""

from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import json
import os
import stat as statmod
import threading
import time
from typing import Any

from sparkhost.lockfile import Entry

HASH_BUF = 8 << 20


def add_lock_args(p: argparse.ArgumentParser) -> None:
    """The arguments of every job that works on a lockfile's files."""
    p.add_argument("--lock", required=True, help="lockfile (JSON)")
    p.add_argument("--dest", required=True, help="directory the files land in")
    p.add_argument("--stamps", help="stamp DB (default <dest>.stamps.json)")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 2, help="hash threads")


def new_hasher(e: Entry) -> Any:
    if e.algo == "sha256":
        return hashlib.sha256()
    return hashlib.sha1(b"blob %d\0" % e.size)


def hash_into(h: Any, path: str, limit: int | None = None) -> int:
    """Feed a file (or its first `limit` bytes) into h; returns the bytes read."""
    buf = bytearray(HASH_BUF)
    mv = memoryview(buf)
    total = 0
    with open(path, "rb", buffering=0) as fh:
        while limit is None or total < limit:
            want = HASH_BUF if limit is None else min(HASH_BUF, limit - total)
            n = fh.readinto(mv[:want])
            if not n:
                break
            h.update(mv[:n])
            total += n
    return total


def hash_file(e: Entry, path: str) -> str:
    h = new_hasher(e)
    hash_into(h, path)
    return str(h.hexdigest())


class Stamps:
    """One JSON file: {"version":1, "files": {path: {size, mtime_ns, ino, ctime_ns, <algo>}}}.

    A stamp is valid only while size, mtime, inode and ctime are unchanged and its hash equals
    the lockfile's; ctime catches an in-place edit whose mtime was set back."""

    def __init__(self, path: str):
        self.path = path
        self.lock = threading.Lock()
        self.files: dict[str, dict[str, Any]] = {}
        try:
            with open(path) as fh:
                data = json.load(fh)
            if data.get("version") == 1:
                self.files = dict(data.get("files", {}))
        except (OSError, ValueError):
            pass

    def check(self, e: Entry, st: os.stat_result) -> bool:
        s = self.files.get(e.path)
        return bool(
            s
            and s.get("size") == st.st_size == e.size
            and s.get("mtime_ns") == st.st_mtime_ns
            and s.get("ino") == st.st_ino
            and s.get("ctime_ns") == st.st_ctime_ns
            and s.get(e.algo) == e.digest
        )

    def put(self, e: Entry, final: str) -> None:
        st = os.stat(final)
        with self.lock:
            self.files[e.path] = {
                "size": st.st_size,
                "mtime_ns": st.st_mtime_ns,
                "ino": st.st_ino,
                "ctime_ns": st.st_ctime_ns,
                e.algo: e.digest,
                "verified_at": int(time.time()),
            }

    def drop(self, path: str) -> None:
        with self.lock:
            self.files.pop(path, None)

    def save(self) -> None:
        with self.lock:
            data = json.dumps({"version": 1, "files": self.files}, sort_keys=True, indent=0)
            tmp = f"{self.path}.tmp.{os.getpid()}"
            with open(tmp, "w") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.path)


def default_stamps(dest: str) -> str:
    return os.path.abspath(dest).rstrip("/") + ".stamps.json"


def default_status(dest: str) -> str:
    return os.path.abspath(dest).rstrip("/") + ".fetch-status.json"


def classify(entries: list[Entry], dest: str, stamps: Stamps) -> dict[str, list[tuple[Entry, int]]]:
    """Stat-only classification. Kinds: verified, unverified (right size, no valid stamp),
    mismatched (wrong size), partial (.part present; int = its length), missing."""
    out: dict[str, list[tuple[Entry, int]]] = {
        k: [] for k in ("verified", "unverified", "mismatched", "partial", "missing")
    }
    for e in entries:
        final = os.path.join(dest, e.path)
        try:
            st = os.stat(final)
        except OSError:
            st = None
        if st is not None and statmod.S_ISREG(st.st_mode):
            if stamps.check(e, st):
                out["verified"].append((e, st.st_size))
            elif st.st_size == e.size:
                out["unverified"].append((e, st.st_size))
            else:
                out["mismatched"].append((e, st.st_size))
            continue
        try:
            have = os.stat(final + ".part").st_size
            out["partial"].append((e, min(have, e.size) if have <= e.size else 0))
        except OSError:
            out["missing"].append((e, 0))
    return out


def parallel_hash(items: list[Entry], dest: str, jobs: int) -> list[tuple[Entry, bool, str | None]]:
    """Hash files across threads (hashlib releases the GIL). [(entry, ok, error)]."""

    def one(e: Entry) -> tuple[Entry, bool, str | None]:
        try:
            return e, hash_file(e, os.path.join(dest, e.path)) == e.digest, None
        except OSError as ex:
            return e, False, str(ex)

    # largest first so the tail is short
    items = sorted(items, key=lambda e: -e.size)
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, jobs)) as ex:
        return list(ex.map(one, items))
