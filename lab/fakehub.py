#!/usr/bin/env python3
"""A small Hugging Face Hub-compatible HTTP server for tests, benchmarks and the lab (stdlib only).

It serves what huggingface_hub's metadata calls and plain `resolve/` downloads need:

- ``GET /api/models/{org}/{name}[/revision/{rev}]`` (``?blobs=true`` adds size/blobId/lfs)
- ``GET /api/models/{org}/{name}/tree/{rev}[/{path}]?recursive=&expand=`` paginated with
  ``Link: <...>; rel="next"`` (1000 entries a page, 50 with expand; ``--page-size`` overrides)
- ``POST /api/models/{org}/{name}/paths-info/{rev}`` (form ``paths=a&paths=b&expand=``)
- ``HEAD|GET /{org}/{name}/resolve/{rev}/{path}`` with ``X-Repo-Commit`` and ``ETag`` (git blob
  sha1) or, for LFS files, ``X-Linked-Etag``/``X-Linked-Size`` and (with ``--cdn-listen``) a 302 to
  a second "CDN" origin whose responses carry no ``X-*`` headers. Range requests get 206.
- 404 with ``X-Error-Code`` (RepoNotFound, RevisionNotFound, EntryNotFound); 401 when
  ``--token-file`` is set and the bearer token is wrong (the CDN never checks tokens).
  ``HubState.gated`` (tests) marks repos gated ("auto"/"manual") in model_info, as the Hub does.

Test hooks (hub origin only):

- ``GET /_control/whoami``: the client's address as JSON.
- ``GET /_control/log`` / ``DELETE /_control/log``: every request (origin, client ip, method,
  path, range, status, body bytes sent, whether an Authorization header came).
- ``POST /_control/faults`` with a JSON list of faults, ``DELETE /_control/faults`` clears them.
  A fault: ``{"path": "<repo path>" | "*", "drop_after": N, "corrupt_offset": N,
  "throttle_bps": N, "ignore_range": true, "status": 503, "stall_s": S, "times": K}``. It
  applies to body-serving responses (hub or CDN) of that file; ``times`` limits how many.
  In-process only (tests holding the server object): ``"hold": threading.Event`` keeps the body
  from being sent until the event is set, so a test can observe a transfer in flight.

Repos live under ``--root`` as directories holding a ``.fakehub.json`` (``{"repo_id",
"commit", "branches", "lfs_min_size"}``); ``generate_repos`` makes the deterministic test repos.

    python3 lab/fakehub.py --listen 127.0.0.1:8900 --root /tmp/hub [--cdn-listen 127.0.0.1:8901]
    python3 lab/fakehub.py --root /tmp/hub --generate-only [--shard-mb 4,4,2,1]
    python3 lab/fakehub.py --root /tmp/hub --generate-stacks   # a model + drafter per stack
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import socket
import ssl
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

META = ".fakehub.json"
LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")
MODEL_REPO = "sparkrig-test/tiny-model"
DRAFTER_REPO = "sparkrig-test/tiny-drafter"
# The lab's small stand-ins for each stack's target and drafter (lab/__main__.py puts them in the
# inventory's stack_pins): vllm-nvfp4 keeps the standard pair; each repo gets its own lockfile
# in one lockfile_dir (sparkrig.lockfile.lock_name: owner--Name.lock.json).
STACK_REPOS = {
    "vllm-nvfp4": (MODEL_REPO, DRAFTER_REPO),
    "entrpi-exl3": ("sparkrig-test/tiny-exl3", "sparkrig-test/tiny-drafter-mxfp8"),
    "sfxnz-v13": ("sparkrig-test/tiny-nvfp4-v13", "sparkrig-test/tiny-dflash2-v13"),
    # the tensorfold stack's EXL3 target and DFlash2 drafter pins
    "tensorfold": ("sparkrig-test/tiny-exl3-tensorfold", "sparkrig-test/tiny-dflash2-tensorfold"),
}
STACK_REPOS["tensorfold-ring"] = STACK_REPOS["tensorfold"]  # the N-rank build: the same pins
CHUNK = 64 * 1024
COMMIT_DATE = "2025-01-01T00:00:00.000Z"


# --------------------------------------------------------------------------------------------
# repository model


class RepoFileInfo:
    def __init__(self, path: str, abspath: str, size: int, git_sha1: str, sha256: str | None):
        self.path = path
        self.abspath = abspath
        self.size = size
        self.git_sha1 = git_sha1
        self.sha256 = sha256  # None for non-LFS files

    @property
    def lfs(self) -> bool:
        return self.sha256 is not None

    def tree_entry(self, expand: bool, commit: str) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "type": "file",
            "oid": self.git_sha1 if not self.lfs else pointer_oid(self),
            "size": self.size,
            "path": self.path,
        }
        if self.lfs:
            entry["lfs"] = {"oid": self.sha256, "size": self.size, "pointerSize": 134}
        if expand:
            entry["lastCommit"] = {"id": commit, "title": "fakehub", "date": COMMIT_DATE}
        return entry

    def sibling(self, blobs: bool) -> dict[str, Any]:
        s: dict[str, Any] = {"rfilename": self.path}
        if blobs:
            s["size"] = self.size
            s["blobId"] = self.git_sha1 if not self.lfs else pointer_oid(self)
            if self.lfs:
                s["lfs"] = {"sha256": self.sha256, "size": self.size, "pointerSize": 134}
        return s


def pointer_oid(f: RepoFileInfo) -> str:
    """git blob sha1 of the LFS pointer file (what the Hub reports as an LFS file's oid)."""
    pointer = (
        f"version https://git-lfs.github.com/spec/v1\noid sha256:{f.sha256}\nsize {f.size}\n"
    ).encode()
    return hashlib.sha1(b"blob %d\0" % len(pointer) + pointer).hexdigest()


def hash_file(path: str) -> tuple[int, str, str]:
    size = os.path.getsize(path)
    s1 = hashlib.sha1(b"blob %d\0" % size)
    s256 = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(8 << 20):
            s1.update(block)
            s256.update(block)
    return size, s1.hexdigest(), s256.hexdigest()


class Repo:
    def __init__(self, directory: str):
        with open(os.path.join(directory, META)) as fh:
            meta = json.load(fh)
        self.directory = directory
        self.repo_id: str = meta["repo_id"]
        self.commit: str = meta["commit"]
        self.branches: dict[str, str] = dict(meta.get("branches", {"main": self.commit}))
        lfs_min = int(meta.get("lfs_min_size", 10 << 20))
        self.files: dict[str, RepoFileInfo] = {}
        for ap in repo_files(directory):
            rel = os.path.relpath(ap, directory).replace(os.sep, "/")
            size, sha1, sha256 = hash_file(ap)
            is_lfs = rel.endswith(LFS_SUFFIXES) or size >= lfs_min
            self.files[rel] = RepoFileInfo(rel, ap, size, sha1, sha256 if is_lfs else None)
        self.dirs = sorted(
            {"/".join(p.split("/")[:i]) for p in self.files for i in range(1, p.count("/") + 1)}
        )

    def resolve(self, rev: str) -> str | None:
        if rev == self.commit:
            return rev
        return self.branches.get(rev)

    def listing(self, prefix: str, recursive: bool) -> list[tuple[str, str]]:
        """[(kind, path)] under prefix ('' = root), dirs before files like the Hub."""
        out: list[tuple[str, str]] = []
        base = prefix + "/" if prefix else ""
        for d in self.dirs:
            if d.startswith(base) and (recursive or "/" not in d[len(base) :]):
                out.append(("directory", d))
        for p in sorted(self.files):
            if p.startswith(base) and (recursive or "/" not in p[len(base) :]):
                out.append(("file", p))
        return out

    def entry(self, kind: str, path: str, expand: bool) -> dict[str, Any]:
        if kind == "file":
            return self.files[path].tree_entry(expand, self.commit)
        e: dict[str, Any] = {
            "type": "directory",
            "oid": hashlib.sha1(path.encode()).hexdigest(),
            "size": 0,
            "path": path,
        }
        if expand:
            e["lastCommit"] = {"id": self.commit, "title": "fakehub", "date": COMMIT_DATE}
        return e


def load_repos(root: str) -> dict[str, Repo]:
    repos: dict[str, Repo] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        if META in filenames:
            r = Repo(dirpath)
            repos[r.repo_id] = r
            dirnames[:] = []
        dirnames.sort()
    return repos


# --------------------------------------------------------------------------------------------
# deterministic generated repos


def _write_random(path: str, size: int, seed: str) -> None:
    rng = random.Random(seed)
    with open(path, "wb") as fh:
        left = size
        while left:
            n = min(left, 1 << 20)
            fh.write(rng.randbytes(n))
            left -= n


def repo_files(directory: str) -> Iterator[str]:
    """Every file of a repository directory but its metadata, in a stable order."""
    for dirpath, dirnames, filenames in os.walk(directory):
        dirnames.sort()
        for name in sorted(filenames):
            if name != META:
                yield os.path.join(dirpath, name)


def _finish_repo(directory: str, repo_id: str, lfs_min_size: int) -> str:
    digest = hashlib.sha1(repo_id.encode())
    for ap in repo_files(directory):
        digest.update(os.path.relpath(ap, directory).encode() + b"\0")
        digest.update(hash_file(ap)[2].encode())
    commit = digest.hexdigest()
    meta = {
        "repo_id": repo_id,
        "commit": commit,
        "branches": {"main": commit},
        "lfs_min_size": lfs_min_size,
    }
    with open(os.path.join(directory, META), "w") as fh:
        json.dump(meta, fh, indent=1, sort_keys=True)
    return commit


def generate_repo(
    root: str, repo_id: str, shard_sizes: list[int], extra_small: bool = True, seed: str = "s0"
) -> str:
    """Create a model repo of random .safetensors shards (LFS) plus small git files; returns the
    commit. Same arguments give the same bytes and the same commit."""
    directory = os.path.join(root, *repo_id.split("/"))
    os.makedirs(directory, exist_ok=True)
    n = len(shard_sizes)
    index: dict[str, Any] = {"metadata": {"total_size": sum(shard_sizes)}, "weight_map": {}}
    for i, size in enumerate(shard_sizes, 1):
        name = f"model-{i:05d}-of-{n:05d}.safetensors"
        _write_random(os.path.join(directory, name), size, f"{seed}:{repo_id}:{name}")
        index["weight_map"][f"layer.{i}.weight"] = name
    with open(os.path.join(directory, "config.json"), "w") as fh:
        json.dump({"model_type": "fake", "repo": repo_id, "shards": n}, fh, indent=1)
    with open(os.path.join(directory, "model.safetensors.index.json"), "w") as fh:
        json.dump(index, fh, indent=1, sort_keys=True)
    if extra_small:
        os.makedirs(os.path.join(directory, "extra dir"), exist_ok=True)
        with open(os.path.join(directory, "extra dir", "notes #1.txt"), "w") as fh:
            fh.write("a path with a space and a hash sign, to test quoting\n")
        _write_random(os.path.join(directory, "tokenizer.json"), 300_000, f"{seed}:tok")
    return _finish_repo(directory, repo_id, 10 << 20)


def generate_repos(root: str, shard_sizes: list[int] | None = None) -> dict[str, str]:
    """The standard test pair: a model (default 4+4+2+1 MiB shards) and a drafter (1.5 MiB)."""
    sizes = shard_sizes or [4 << 20, 4 << 20, 2 << 20, 1 << 20]
    return {
        MODEL_REPO: generate_repo(root, MODEL_REPO, sizes),
        DRAFTER_REPO: generate_repo(root, DRAFTER_REPO, [3 << 19], extra_small=False, seed="d"),
    }


def generate_stack_repos(root: str) -> dict[str, dict[str, str]]:
    """The standard pair plus a smaller model (2+2+1 MiB) and drafter (1.5 MiB) per other stack,
    each with its own bytes; returns {stack: {model_repo, model_revision, drafter_repo,
    drafter_revision}}. Deterministic, like generate_repos."""
    commits = generate_repos(root)
    for stack, (model, drafter) in STACK_REPOS.items():
        if model not in commits:
            commits[model] = generate_repo(root, model, [2 << 20, 2 << 20, 1 << 20], seed=stack)
        if drafter not in commits:
            commits[drafter] = generate_repo(root, drafter, [3 << 19], False, seed=f"{stack}:d")
    return {
        stack: {"model_repo": model, "model_revision": commits[model],
                "drafter_repo": drafter, "drafter_revision": commits[drafter]}
        for stack, (model, drafter) in STACK_REPOS.items()
    }  # fmt: skip


# --------------------------------------------------------------------------------------------
# server


class HubState:
    def __init__(self, root: str, page_size: int | None, token: str | None, cdn: str | None):
        self.root = root
        self.repos = load_repos(root)
        self.by_sha: dict[str, RepoFileInfo] = {}
        for r in self.repos.values():
            for f in r.files.values():
                if f.sha256:
                    self.by_sha[f.sha256] = f
        self.page_size = page_size
        self.token = token
        self.gated: dict[str, str] = {}  # repo id -> the Hub's "auto"/"manual" (model_info)
        self.cdn = cdn  # "http://host:port" or ":port" (host taken from the request)
        self.lock = threading.Lock()
        self.log: list[dict[str, Any]] = []
        self.faults: list[dict[str, Any]] = []

    def take_fault(self, path: str) -> dict[str, Any] | None:
        with self.lock:
            for f in self.faults:
                if f.get("path") in (path, "*") and f.get("times", 1) != 0:
                    if "times" in f:
                        f["times"] -= 1
                    return dict(f)
        return None


def parse_range(header: str | None, size: int) -> tuple[int, int] | None:
    """(start, end inclusive) for a single 'bytes=a-b' / 'bytes=a-' / 'bytes=-n' range."""
    if not header or not header.startswith("bytes=") or "," in header:
        return None
    a, _, b = header[6:].strip().partition("-")
    if a == "":
        n = int(b)
        return (max(0, size - n), size - 1)
    start = int(a)
    end = int(b) if b else size - 1
    return (start, min(end, size - 1))


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "fakehub/1"
    hub: HubState
    origin = "hub"
    scheme = "http"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        if os.environ.get("FAKEHUB_VERBOSE"):
            super().log_message(format, *args)

    # -- helpers -------------------------------------------------------------------------------
    def _record(self, status: int, sent: int, **extra: Any) -> None:
        if self.path.startswith("/_control"):
            return
        rec = {
            "origin": self.origin,
            "client": self.client_address[0],
            "method": self.command,
            "path": unquote(urlsplit(self.path).path),
            "range": self.headers.get("Range"),
            "status": status,
            "sent": sent,
            "auth": "Authorization" in self.headers,
            "t": time.time(),
        }
        rec.update(extra)
        with self.hub.lock:
            self.hub.log.append(rec)

    def _send_json(
        self, obj: Any, status: int = 200, headers: dict[str, str] | None = None
    ) -> None:
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
        self._record(status, len(body))

    def _error(self, status: int, code: str | None, message: str) -> None:
        headers = {"X-Error-Code": code} if code else {}
        if code:
            headers["X-Error-Message"] = message
        self._send_json({"error": message}, status, headers)

    def _authorized(self) -> bool:
        if self.hub.token is None:
            return True
        return self.headers.get("Authorization") == f"Bearer {self.hub.token}"

    def _base(self) -> str:
        host = self.headers.get("Host")
        if not host:
            addr = self.connection.getsockname()
            host = f"{addr[0]}:{addr[1]}"
        return f"{self.scheme}://{host}"

    def _repo(self, org: str, name: str) -> Repo | None:
        r = self.hub.repos.get(f"{org}/{name}")
        if r is None:
            self._error(404, "RepoNotFound", f"Repository {org}/{name} not found")
        return r

    # -- dispatch ------------------------------------------------------------------------------
    def do_HEAD(self) -> None:
        self._dispatch()

    def do_GET(self) -> None:
        self._dispatch()

    def do_POST(self) -> None:
        self._dispatch()

    def do_DELETE(self) -> None:
        self._dispatch()

    def _dispatch(self) -> None:
        try:
            self._route()
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _route(self) -> None:
        url = urlsplit(self.path)
        parts = [unquote(p) for p in url.path.split("/")[1:]]
        query = parse_qs(url.query)
        if self.origin == "cdn":
            if len(parts) == 2 and parts[0] == "blobs" and parts[1] in self.hub.by_sha:
                f = self.hub.by_sha[parts[1]]
                return self._serve_body(f, None)
            return self._error(404, None, "no such blob")
        if parts[:1] == ["_control"]:
            return self._control(parts[1:])
        if not self._authorized():
            return self._error(401, None, "Invalid credentials in Authorization header")
        if parts[:2] == ["api", "models"] and len(parts) >= 4:
            repo = self._repo(parts[2], parts[3])
            if repo is None:
                return
            rest = parts[4:]
            if not rest or rest[0] == "revision":
                rev = rest[1] if len(rest) > 1 else "main"
                return self._model_info(repo, rev, query)
            if rest[0] == "tree" and len(rest) >= 2:
                return self._tree(repo, rest[1], "/".join(rest[2:]), query)
            if rest[0] == "paths-info" and len(rest) >= 2 and self.command == "POST":
                return self._paths_info(repo, rest[1])
            return self._error(404, None, "unknown api route")
        if len(parts) >= 5 and parts[2] == "resolve":
            repo = self._repo(parts[0], parts[1])
            if repo is None:
                return
            return self._resolve(repo, parts[3], "/".join(parts[4:]))
        return self._error(404, None, "not found")

    # -- api -------------------------------------------------------------------------------------
    def _model_info(self, repo: Repo, rev: str, query: dict[str, list[str]]) -> None:
        commit = repo.resolve(rev)
        if commit is None:
            return self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
        blobs = query.get("blobs", ["false"])[0].lower() == "true"
        info = {
            "_id": hashlib.sha1(repo.repo_id.encode()).hexdigest()[:24],
            "id": repo.repo_id,
            "modelId": repo.repo_id,
            "author": repo.repo_id.split("/")[0],
            "sha": commit,
            "private": False,
            "gated": self.hub.gated.get(repo.repo_id, False),
            "disabled": False,
            "tags": [],
            "lastModified": COMMIT_DATE,
            "createdAt": COMMIT_DATE,
            "siblings": [repo.files[p].sibling(blobs) for p in sorted(repo.files)],
        }
        if "expand" in query:
            keep = set(query["expand"]) | {"id", "_id"}
            info = {k: v for k, v in info.items() if k in keep}
        self._send_json(info)

    def _tree(self, repo: Repo, rev: str, prefix: str, query: dict[str, list[str]]) -> None:
        if repo.resolve(rev) is None:
            return self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
        recursive = query.get("recursive", ["false"])[0].lower() in ("true", "1")
        expand = query.get("expand", ["false"])[0].lower() in ("true", "1")
        if prefix and prefix not in repo.dirs:
            return self._error(404, "EntryNotFound", f"{prefix} does not exist on {rev}")
        items = repo.listing(prefix, recursive)
        page = self.hub.page_size or (50 if expand else 1000)
        cursor = int(query.get("cursor", ["0"])[0])
        chunk = items[cursor : cursor + page]
        headers = {}
        if cursor + page < len(items):
            path = urlsplit(self.path).path
            nxt = (
                f"{self._base()}{path}?recursive={str(recursive).lower()}"
                f"&expand={str(expand).lower()}&cursor={cursor + page}"
            )
            headers["Link"] = f'<{nxt}>; rel="next"'
        self._send_json([repo.entry(k, p, expand) for k, p in chunk], headers=headers)

    def _paths_info(self, repo: Repo, rev: str) -> None:
        if repo.resolve(rev) is None:
            return self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length).decode()
        if "json" in (self.headers.get("Content-Type") or ""):
            body = json.loads(raw or "{}")
            paths = body.get("paths", [])
            expand = bool(body.get("expand", False))
        else:
            form = parse_qs(raw)
            paths = form.get("paths", [])
            expand = form.get("expand", ["False"])[0].lower() == "true"
        out = []
        for p in paths:
            p = p.strip("/")
            if p in repo.files:
                out.append(repo.entry("file", p, expand))
            elif p in repo.dirs:
                out.append(repo.entry("directory", p, expand))
        self._send_json(out)

    def _resolve(self, repo: Repo, rev: str, path: str) -> None:
        commit = repo.resolve(rev)
        if commit is None:
            return self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
        f = repo.files.get(path)
        if f is None:
            return self._error(404, "EntryNotFound", f"{path} does not exist on {rev}")
        common = {"X-Repo-Commit": commit}
        if f.lfs:
            common["X-Linked-Etag"] = f'"{f.sha256}"'
            common["X-Linked-Size"] = str(f.size)
        if f.lfs and self.hub.cdn is not None:
            cdn = self.hub.cdn
            if cdn.startswith(":"):
                host = (self.headers.get("Host") or "127.0.0.1").rsplit(":", 1)[0]
                cdn = f"{self.scheme}://{host}{cdn}"
            loc = f"{cdn}/blobs/{f.sha256}?expires=4102444800&sig=fake"
            self.send_response(302)
            for k, v in common.items():
                self.send_header(k, v)
            self.send_header("ETag", f'"{pointer_oid(f)}"')
            self.send_header("Location", loc)
            self.send_header("Content-Length", "0")
            self.end_headers()
            self._record(302, 0)
            return
        etag = f.sha256 if f.lfs else f.git_sha1
        common["ETag"] = f'"{etag}"'
        self._serve_body(f, common)

    # -- bodies ------------------------------------------------------------------------------------
    def _serve_body(self, f: RepoFileInfo, headers: dict[str, str] | None) -> None:
        fault = self.hub.take_fault(f.path) or {}
        if fault.get("hold") is not None:
            fault["hold"].wait(600)
        if fault.get("stall_s"):
            time.sleep(float(fault["stall_s"]))
        if fault.get("status"):
            return self._error(int(fault["status"]), None, "injected failure")
        rng = None if fault.get("ignore_range") else self.headers.get("Range")
        try:
            span = parse_range(rng, f.size)
        except ValueError:
            span = None
        if span is not None and span[0] >= f.size:
            self.send_response(416)
            self.send_header("Content-Range", f"bytes */{f.size}")
            self.send_header("Content-Length", "0")
            self.end_headers()
            self._record(416, 0)
            return
        start, end = span if span else (0, f.size - 1)
        length = end - start + 1 if f.size else 0
        self.send_response(206 if span else 200)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Length", str(length))
        self.send_header("Content-Type", "application/octet-stream")
        if span:
            self.send_header("Content-Range", f"bytes {start}-{end}/{f.size}")
        self.end_headers()
        sent = 0
        if self.command == "HEAD":
            self._record(206 if span else 200, 0)
            return
        drop_after = fault.get("drop_after")
        corrupt = fault.get("corrupt_offset")
        bps = fault.get("throttle_bps")
        t0 = time.monotonic()
        if not (drop_after is not None or corrupt is not None or bps):
            # no fault: let the kernel send it (no per-chunk wakeups on a busy machine)
            status = 206 if span else 200
            try:
                with open(f.abspath, "rb") as fh:
                    self.wfile.flush()
                    sent = self.connection.sendfile(fh, start, length)
            finally:
                self._record(status, sent, dropped=sent < length)
            if sent < length:
                self.close_connection = True
            return
        status = 206 if span else 200
        try:
            with open(f.abspath, "rb") as fh:
                fh.seek(start)
                while sent < length:
                    n = min(CHUNK, length - sent)
                    if drop_after is not None:
                        n = min(n, int(drop_after) - sent)
                        if n <= 0:
                            break
                    block = bytearray(fh.read(n))
                    if not block:
                        break
                    if corrupt is not None:
                        off = int(corrupt) - (start + sent)
                        if 0 <= off < len(block):
                            block[off] ^= 0xFF
                    self.wfile.write(block)
                    sent += len(block)
                    if bps:
                        ahead = sent / float(bps) - (time.monotonic() - t0)
                        if ahead > 0:
                            time.sleep(ahead)
        finally:
            self._record(status, sent, dropped=sent < length)
        if sent < length:
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    # -- control -----------------------------------------------------------------------------------
    def _control(self, rest: list[str]) -> None:
        what = rest[0] if rest else ""
        if what == "whoami":
            return self._send_json({"client": self.client_address[0]})
        if what == "log":
            if self.command == "DELETE":
                with self.hub.lock:
                    self.hub.log.clear()
                return self._send_json({"ok": True})
            with self.hub.lock:
                data = list(self.hub.log)
            return self._send_json(data)
        if what == "faults":
            if self.command == "POST":
                length = int(self.headers.get("Content-Length") or 0)
                faults = json.loads(self.rfile.read(length) or b"[]")
                if isinstance(faults, dict):
                    faults = [faults]
                with self.hub.lock:
                    self.hub.faults.extend(faults)
            elif self.command == "DELETE":
                with self.hub.lock:
                    self.hub.faults.clear()
            with self.hub.lock:
                current = list(self.hub.faults)
            return self._send_json(current)
        if what == "repos":
            return self._send_json(
                {
                    rid: {"commit": r.commit, "files": len(r.files)}
                    for rid, r in self.hub.repos.items()
                }
            )
        return self._error(404, None, "unknown control route")


def _split_addr(spec: str) -> tuple[str, int]:
    host, _, port = spec.rpartition(":")
    return host.strip("[]") or "0.0.0.0", int(port)


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 64


def make_servers(
    hub: HubState, listen: tuple[str, int], cdn_listen: tuple[str, int] | None
) -> list[Server]:
    servers = []
    hub_handler = type("HubHandler", (Handler,), {"hub": hub, "origin": "hub"})
    servers.append(Server(listen, hub_handler))
    if cdn_listen is not None:
        cdn_handler = type("CdnHandler", (Handler,), {"hub": hub, "origin": "cdn"})
        servers.append(Server(cdn_listen, cdn_handler))
    return servers


def enable_tls(servers: Iterable[Server], cert: str, key: str) -> None:
    """Serve HTTPS on every origin (the handshake happens in the handler thread)."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    for srv in servers:
        srv.socket = ctx.wrap_socket(srv.socket, server_side=True, do_handshake_on_connect=False)
        srv.RequestHandlerClass.scheme = "https"  # type: ignore[attr-defined]


def serve(servers: Iterable[Server]) -> None:
    threads = []
    for s in servers:
        t = threading.Thread(target=s.serve_forever, daemon=True)
        t.start()
        threads.append(t)
    for t in threads:
        t.join()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", required=True, help="directory holding the repos")
    ap.add_argument("--listen", help="hub origin ADDR:PORT")
    ap.add_argument("--cdn-listen", help="second 'CDN' origin ADDR:PORT; LFS resolves redirect")
    ap.add_argument("--cdn-url", help="base URL put in Location (default http://<Host>:<cdn port>)")
    ap.add_argument("--page-size", type=int, help="tree entries per page (default 1000/50)")
    ap.add_argument("--token-file", help="require this bearer token on the hub origin")
    ap.add_argument("--tls-cert", help="serve HTTPS with this certificate (PEM)")
    ap.add_argument("--tls-key", help="private key for --tls-cert")
    ap.add_argument("--generate", action="store_true", help="generate the test repos first")
    ap.add_argument("--generate-only", action="store_true", help="generate the repos and exit")
    ap.add_argument("--shard-mb", help="comma list of model shard sizes in MiB (generate)")
    ap.add_argument(
        "--generate-stacks",
        action="store_true",
        help="generate a model + drafter repo per stack, print their pins and exit",
    )
    args = ap.parse_args(argv)
    if args.generate_stacks:
        print(json.dumps(generate_stack_repos(args.root), sort_keys=True), flush=True)
        return 0
    if args.generate or args.generate_only:
        sizes = (
            [int(float(x) * (1 << 20)) for x in args.shard_mb.split(",")] if args.shard_mb else None
        )
        commits = generate_repos(args.root, sizes)
        print(json.dumps(commits, sort_keys=True), flush=True)
        if args.generate_only:
            return 0
    if not args.listen:
        ap.error("--listen is required unless --generate-only")
    token = None
    if args.token_file:
        with open(args.token_file) as fh:
            token = fh.read().strip()
    listen = _split_addr(args.listen)
    cdn_listen = _split_addr(args.cdn_listen) if args.cdn_listen else None
    scheme = "https" if args.tls_cert else "http"
    cdn = args.cdn_url or (f":{cdn_listen[1]}" if cdn_listen else None)
    if cdn_listen and cdn_listen[0] not in ("0.0.0.0", "::") and not args.cdn_url:
        cdn = f"{scheme}://{cdn_listen[0]}:{cdn_listen[1]}"
    hub = HubState(args.root, args.page_size, token, cdn)
    servers = make_servers(hub, listen, cdn_listen)
    if args.tls_cert:
        enable_tls(servers, args.tls_cert, args.tls_key or args.tls_cert)
    h = servers[0].server_address
    where = f"fakehub: hub on {scheme}://{h[0]!s}:{h[1]!s}"
    if cdn_listen:
        c = servers[1].server_address
        where += f", cdn on {scheme}://{c[0]!s}:{c[1]!s}"
    print(f"{where}, repos: {', '.join(sorted(hub.repos))}", flush=True)
    try:
        serve(servers)
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
