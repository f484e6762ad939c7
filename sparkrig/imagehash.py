"""Content hash of the patched image: base image digest + build context files + build args.

The deploy builds `<image_repo>:<image_tag(...)>` on the node from files/ (Dockerfile, patches/,
utf8_guard_lp.py). Same inputs -> same tag -> no rebuild and no restart; any changed
byte -> new tag. Pure functions; `context_files` only reads the local checkout.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

HASH_VERSION = "sparkrig-image-v1"
TAG_HEX = 20
DIGEST_RE = re.compile(r"^(?:(?P<repo>[^@\s]+)@)?(?P<digest>sha256:[0-9a-f]{64})$")
# what the Dockerfile COPYs (relative to files/): keep in step with files/Dockerfile
CONTEXT_TOP = ("Dockerfile", "utf8_guard_lp.py")
CONTEXT_DIRS = ("patches",)
_SKIP_PARTS = {"__pycache__", "APPLIED.json"}


def base_digest(ref: str) -> str:
    """ "sha256:<64 hex>" of a pinned reference "repo@sha256:..." (or a bare digest)."""
    m = DIGEST_RE.match(ref.strip())
    if not m:
        raise ValueError(f"base image must be pinned by digest (repo@sha256:<64 hex>), got {ref!r}")
    return m.group("digest")


def image_tag(
    base: str, files: Mapping[str, bytes], build_args: Mapping[str, str] | None = None
) -> str:
    """Tag for the patched image: "h" + 20 hex of sha256 over version, base digest, every file
    (sorted relative path, size, sha256) and every build arg (sorted)."""
    h = hashlib.sha256()
    h.update(f"{HASH_VERSION}\nbase {base_digest(base)}\n".encode())
    for name in sorted(files):
        if name.startswith("/") or ".." in Path(name).parts:
            raise ValueError(f"context file names must be relative: {name!r}")
        data = files[name]
        h.update(f"file {name} {len(data)} {hashlib.sha256(data).hexdigest()}\n".encode())
    for key in sorted(build_args or {}):
        h.update(f"arg {key}={(build_args or {})[key]}\n".encode())
    return "h" + h.hexdigest()[:TAG_HEX]


def image_ref(repo: str, tag: str) -> str:
    return f"{repo}:{tag}"


def _wanted(rel: Path) -> bool:
    return not (set(rel.parts) & _SKIP_PARTS) and rel.suffix != ".pyc"


def context_files(root: str | Path, extra: Iterable[str] = ()) -> dict[str, bytes]:
    """The build context's files under ``root`` (files/), as {relative posix path: bytes}.
    A missing top-level file is an error: the Dockerfile COPYs it."""
    root = Path(root)
    out: dict[str, bytes] = {}
    for name in (*CONTEXT_TOP, *extra):
        p = root / name
        if not p.is_file():
            raise FileNotFoundError(f"build context file missing: {p}")
        out[name] = p.read_bytes()
    for d in CONTEXT_DIRS:
        for p in sorted((root / d).rglob("*")):
            rel = p.relative_to(root)
            if p.is_file() and _wanted(rel):
                out[rel.as_posix()] = p.read_bytes()
    return out


def tag_for_checkout(
    base: str, files_dir: str | Path, build_args: Mapping[str, str] | None = None
) -> str:
    return image_tag(base, context_files(files_dir), build_args)
