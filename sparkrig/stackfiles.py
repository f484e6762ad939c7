"""Stack-provided files: what a recipe ships beside its image (``Stack.files``, e.g. sfxnz-v13's
chat template), on the ranks that use them.

The head downloads each file once from its GitHub repository at the pinned commit (the raw URL at
a commit serves that commit's bytes only), with the host's own python3 and no proxy, as the
weights fetcher and the reach check connect; a known sha256 is checked before the file takes its
name, and the digest fetched is printed either way. The file lives under install_dir, in a
directory named by its commit, so a new pin is a new path: the rank unit (which mounts it)
changes and the pair restarts. A head-only file (a chat template: the API is rank 0's) is
fetched and mounted by the head alone; no other rank gets it. A file every rank mounts would
have to reach the workers the way the weights do: no stack declares one (``check``, which the
declaration tests run on every stack, refuses it).
Preflight asks the head's reach of each URL while a file is missing there (sparkrig/reach.py).

Nothing here runs for a stack without files: the default stack's plan has no operation more.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from pyinfra import host
from pyinfra.api import QuoteString, StringCommand, operation
from pyinfra.facts.files import File, Sha256File

from sparkrig.config.model import Settings
from sparkrig.hostpkg import PYTHON
from sparkrig.stacks.base import Stack, StackFile

# Download one URL to a path, no proxy; check the sha256 when one is given; print the digest.
_FETCH_SCRIPT = """
import hashlib, os, sys, urllib.request
url, dest, want = sys.argv[1], sys.argv[2], sys.argv[3]
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
with opener.open(url, timeout=60) as r:
    data = r.read()
got = hashlib.sha256(data).hexdigest()
if want and got != want:
    sys.exit(f"{url}: sha256 {got}, the stack declares {want}: not installed")
os.makedirs(os.path.dirname(dest), exist_ok=True)
with open(dest + ".part", "wb") as fh:
    fh.write(data)
os.chmod(dest + ".part", 0o644)
os.replace(dest + ".part", dest)
print(f"{dest}: {len(data)} bytes, sha256 {got} ({url})")
"""


def check(stack: Stack) -> list[str]:
    """What is wrong with a stack's files (tests/stacks runs it on every declaration)."""
    out = []
    for f in stack.files:
        if not f.head_only:
            out.append(f"stack {stack.name}: file {f.name} is for every rank; only head-only "
                       "files are fetched (the head alone downloads)")  # fmt: skip
        if len(f.commit) != 40:
            out.append(f"stack {stack.name}: file {f.name} must be pinned to a 40-hex commit")
    return out


def host_path(s: Settings, f: StackFile) -> str:
    """Where the head keeps a file: ``<install_dir>/stack-files/<commit>/<name>``."""
    return f"{s.knobs.install_dir}/stack-files/{f.commit}/{f.name}"


def mounted(s: Settings) -> list[StackFile]:
    """The stack's files this rank mounts: the head-only ones on rank 0, none elsewhere."""
    return [f for f in s.stack.files if s.me.is_head or not f.head_only]


def volumes(s: Settings) -> list[str]:
    """``--volume`` options of the files this rank mounts (read-only)."""
    out: list[str] = []
    for f in mounted(s):
        out += ["--volume", f"{host_path(s, f)}:{f.container_path}:ro"]
    return out


def fetch_command(f: StackFile, dest: str) -> StringCommand:
    return StringCommand(
        PYTHON, "-c", QuoteString(_FETCH_SCRIPT), QuoteString(f.url), QuoteString(dest),
        QuoteString(f.sha256 or ""),
    )  # fmt: skip


def missing(s: Settings) -> list[StackFile]:
    """The files the head must still download (read with pyinfra's file facts)."""
    return [f for f in mounted(s) if not host.get_fact(File, path=host_path(s, f))]


def wanted_urls(s: Settings) -> dict[str, str]:
    """url -> what the head must download from it (preflight's reach check)."""
    return {
        f.url: f"the stack's file {f.name} ({f.repo}@{f.commit[:8]}: {f.why or 'the recipe'})"
        for f in (missing(s) if s.me.is_head else [])
    }


@operation()
def stack_file_present(f: StackFile, dest: str) -> Generator[Any, None, None]:
    """
    The stack's file at ``dest``: downloaded from its repository at the pinned commit when it is
    missing, or when its bytes are not the declared sha256.

    + f: the declared file (repository, commit, path, sha256)
    + dest: its path on this host
    """
    if host.get_fact(File, path=dest):
        if f.sha256 is None:
            host.noop(f"{dest} is {f.repo}@{f.commit[:12]}:{f.path}")
            return
        if host.get_fact(Sha256File, path=dest) == f.sha256:
            host.noop(f"{dest} has sha256 {f.sha256[:12]}")
            return
    yield fetch_command(f, dest)
