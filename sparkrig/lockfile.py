"""Weights lockfiles: one JSON file per artifact, made from the Hub's metadata API.

A lockfile pins a repo to a resolved 40-hex commit and lists every file with its size and hash:
``sha256`` for LFS files, ``git_sha1`` (git blob sha1) for the small non-LFS ones. It is written
sorted and stable, so a weights change shows up in review as a diff. The host-side fetcher
(files/sparkhost/fetch.py) reads the same format, validated by the same code
(files/sparkhost/lockfile.py); the deploy never needs the Hub API afterwards.

    python3 -m sparkrig.lockfile refresh --repo ORG/NAME --revision main \
        --endpoint https://huggingface.co --out locks/ORG--NAME.lock.json
    python3 -m sparkrig.lockfile refresh --stack vllm-nvfp4 --lockfile-dir locks
    python3 -m sparkrig.lockfile show locks/ORG--NAME.lock.json

``--stack NAME`` makes every lockfile the stack declares (sparkrig/stacks/: its model and its
drafter, whichever profile loads it), each as ``--repo`` would, into ``--lockfile-dir``. A pin
the operator set (model_revision, stack_pins) is not the declaration's: the deploy's refusal
then gives that lockfile's own ``--repo`` command.

Only huggingface_hub's metadata calls are used (``model_info`` to resolve the revision and read
whether the repo is gated, ``list_repo_tree(recursive=True, expand=True)`` for the file list). The
endpoint is always passed explicitly: HF_ENDPOINT is read at import time. The token is the one
huggingface_hub finds (sparkrig/hubtoken.py); a gated repo without one is refused, and the
lockfile records ``gated`` so the deploy refuses it too, before any host is touched.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import textwrap
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from pyinfra.api.exceptions import DeployError
from sparkhost import lockfile as host_lockfile
from sparkhost.lockfile import HEX40, LOCK_VERSION, LockfileError, validate

from sparkrig import hubtoken
from sparkrig.stacks import STACKS, get
from sparkrig.stacks.base import Pin


def _entries_from_tree(items: Iterable[Any]) -> list[dict[str, Any]]:
    from huggingface_hub.hf_api import RepoFile

    files = []
    for it in items:
        if not isinstance(it, RepoFile):
            continue
        entry: dict[str, Any] = {"path": it.path, "size": int(it.size)}
        if it.lfs is not None:
            entry["sha256"] = it.lfs.sha256
            if int(it.lfs.size) != entry["size"]:
                raise LockfileError(f"{it.path}: tree size {it.size} != lfs size {it.lfs.size}")
        else:
            entry["git_sha1"] = it.blob_id
        files.append(entry)
    return files


def build_lock(
    repo: str,
    revision: str,
    endpoint: str,
    token: str | None = None,
    repo_type: str = "model",
) -> dict[str, Any]:
    """Resolve ``revision`` to a commit, read whether the repo is gated and list the files at
    that commit."""
    from huggingface_hub import HfApi

    api = HfApi(endpoint=endpoint.rstrip("/"), token=token if token else False)
    if repo_type == "dataset":
        info: Any = api.dataset_info(repo, revision=revision, expand=["sha", "gated"])
    else:
        info = api.model_info(repo, revision=revision, expand=["sha", "gated"])
    commit = info.sha or ""
    if not HEX40.match(commit):
        raise LockfileError(f"{repo}@{revision}: the Hub returned no 40-hex commit ({commit!r})")
    tree = api.list_repo_tree(
        repo, revision=commit, recursive=True, expand=True, repo_type=repo_type
    )
    files = _entries_from_tree(tree)
    if not files:
        raise LockfileError(f"{repo}@{commit}: no files")
    lock = {
        "version": LOCK_VERSION,
        "repo": repo,
        "repo_type": repo_type,
        "revision": revision,
        "commit": commit,
        "gated": info.gated or False,  # "auto" or "manual": its files need a token
        "files": sorted(files, key=lambda f: f["path"]),
    }
    validate(lock)
    return lock


def dumps(lock: dict[str, Any]) -> str:
    """Stable text: sorted keys, files sorted by path, one file per line."""
    head = {k: v for k, v in lock.items() if k != "files"}
    lines = ["{"]
    for k in sorted(head):
        lines.append(f"  {json.dumps(k)}: {json.dumps(head[k])},")
    lines.append('  "files": [')
    files = sorted(lock["files"], key=lambda f: f["path"])
    for i, f in enumerate(files):
        comma = "," if i < len(files) - 1 else ""
        lines.append("    " + json.dumps(f, sort_keys=True) + comma)
    lines.append("  ]")
    lines.append("}")
    return "\n".join(lines) + "\n"


def load(path: str) -> dict[str, Any]:
    """The lockfile at ``path``, validated as the fetcher on the host validates it."""
    return host_lockfile.load(path)


def write(lock: dict[str, Any], path: str) -> None:
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    tmp = f"{path}.tmp"
    with open(tmp, "w") as fh:
        fh.write(dumps(lock))
    os.replace(tmp, path)


def summary(lock: dict[str, Any]) -> dict[str, Any]:
    files = lock["files"]
    return {
        "repo": lock["repo"],
        "commit": lock["commit"],
        "files": len(files),
        "lfs_files": sum(1 for f in files if "sha256" in f),
        "bytes": sum(f["size"] for f in files),
    }


def diff(old: dict[str, Any] | None, new: dict[str, Any]) -> dict[str, list[str]]:
    """Paths added, removed and changed (size or hash) between two lockfiles."""
    o = {f["path"]: f for f in (old or {}).get("files", [])}
    n = {f["path"]: f for f in new["files"]}
    return {
        "added": sorted(set(n) - set(o)),
        "removed": sorted(set(o) - set(n)),
        "changed": sorted(p for p in set(o) & set(n) if o[p] != n[p]),
    }


def lock_name(repo: str) -> str:
    """Default lockfile name for a repo: 'owner/Name' -> 'owner--Name.lock.json' (the Hub's own
    separator in its cache names). Two stacks may pin repos of one name under different owners
    (LibertAIDAI/ and nvidia/GLM-5.3-Flash-NVFP4): one lockfile_dir holds both."""
    return repo.replace("/", "--") + ".lock.json"


def legacy_lock_name(repo: str) -> str:
    """The name lockfiles had before stacks: 'owner/Name' -> 'Name.lock.json' (still read)."""
    return repo.split("/")[-1] + ".lock.json"


def lock_path(lockfile_dir: str, repo: str) -> Path:
    """The lockfile of ``repo`` in ``lockfile_dir``: ``owner--Name.lock.json``, else one of the
    legacy name ``Name.lock.json`` that is for ``repo`` (another owner's is not taken); the
    per-repo name when neither exists (where to make it)."""
    path = Path(lockfile_dir) / lock_name(repo)
    legacy = Path(lockfile_dir) / legacy_lock_name(repo)
    if path.exists() or not legacy.exists():
        return path
    try:
        owner = json.loads(legacy.read_text()).get("repo")
    except (OSError, ValueError, AttributeError):
        return legacy  # unreadable: checked() says why, naming it
    return legacy if owner == repo else path


def refresh_command(lockfile_dir: str, repo: str, revision: str, endpoint: str) -> str:
    """The command that makes the lockfile of ``repo`` at ``revision`` where the deploy reads it."""
    return (
        f"python3 -m sparkrig.lockfile refresh --repo {repo} --revision {revision} "
        f"--endpoint {endpoint} --out {Path(lockfile_dir) / lock_name(repo)}"
    )


def stack_refresh_command(stack: str, lockfile_dir: str, endpoint: str) -> str:
    """The command that makes every lockfile ``stack`` declares (``declared``) at once."""
    return (
        f"python3 -m sparkrig.lockfile refresh --stack {stack} --endpoint {endpoint} "
        f"--lockfile-dir {lockfile_dir}"
    )


def declared(stack: str) -> list[Pin]:
    """The artifacts ``stack`` declares, each pinned by a lockfile: its model and its drafter
    (whether or not the selected profile loads it: a profile change then needs no new one)."""
    st = get(stack)
    return [p for p in (st.model, st.drafter) if p is not None]


def checked(
    lockfile_dir: str, repo: str, revision: str, endpoint: str
) -> tuple[str, dict[str, Any]]:
    """The lockfile of ``repo`` in ``lockfile_dir`` (its text and content), checked against the
    pinned ``revision``; DeployError naming the command that makes it when it is missing, bad or
    for another commit (the deploy stops before any host command)."""
    path = lock_path(lockfile_dir, repo)
    refresh = refresh_command(lockfile_dir, repo, revision, endpoint)
    if not path.exists():
        raise DeployError(f"no lockfile {path} for {repo}; make it with:\n  {refresh}")
    try:
        lock = load(str(path))
    except (OSError, ValueError) as err:
        raise DeployError(f"lockfile {path}: {err}") from None
    if lock.get("repo") != repo or lock.get("commit") != revision:
        raise DeployError(
            f"lockfile {path} is for {lock.get('repo')}@{lock.get('commit')}, not "
            f"{repo}@{revision}; refresh it with:\n  {refresh}"
        )
    return path.read_text(), lock


def checked_all(
    lockfile_dir: str, wanted: Iterable[tuple[str, str]], endpoint: str
) -> tuple[dict[str, dict[str, Any]], list[tuple[str, str, str]]]:
    """Every (repo, revision) of ``wanted`` checked as ``checked`` checks one: the lockfiles that
    pass, by repo, and (repo, revision, why) for each that does not, all of them at once (one
    refusal per run cost the operator a run per artifact)."""
    locks: dict[str, dict[str, Any]] = {}
    refused = []
    for repo, revision in wanted:
        try:
            locks[repo] = checked(lockfile_dir, repo, revision, endpoint)[1]
        except DeployError as err:
            refused.append((repo, revision, str(err)))
    return locks, refused


def refusal(problems: Sequence[str], at_once: str | None = None) -> str:
    """One error for every lockfile problem, each its own sentence with its command;
    ``at_once``: one command that fixes them all (``stack_refresh_command``)."""
    if len(problems) == 1 and at_once is None:
        return problems[0]
    lines = [f"{len(problems)} lockfile problems, each with its fix:"]
    lines += [textwrap.indent(p, "  ") for p in problems]
    if at_once:
        lines.append(f"  or make all of them at once with:\n    {at_once}")
    return "\n".join(lines)


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.2f} GiB"


def refresh(repo: str, revision: str, endpoint: str, repo_type: str, out: str) -> int:
    """Make one lockfile from the Hub and say what changed against the one at ``out``; 1 (with
    the reason on stderr) when the Hub or the token refuses it."""
    try:
        lock = build_lock(repo, revision, endpoint, hubtoken.hub_token(), repo_type)
    except LockfileError as e:
        print(f"lockfile: {e}", file=sys.stderr)
        return 1
    except Exception as e:  # hub errors: print the class and message, never the token
        print(
            f"lockfile: {repo}@{revision} from {endpoint} (--endpoint): {type(e).__name__}: {e}",
            file=sys.stderr,
        )
        return 1
    if why := hubtoken.missing_for(repo, lock["gated"], endpoint):
        print(f"lockfile: {why}", file=sys.stderr)
        return 1
    old = None
    if os.path.exists(out):
        try:
            with open(out) as fh:
                old = json.load(fh)
        except (OSError, ValueError):
            old = None
    d = diff(old, lock)
    write(lock, out)
    s = summary(lock)
    print(
        f"{out}: {s['repo']}@{s['commit']} {s['files']} files ({s['lfs_files']} LFS), "
        f"{_gib(s['bytes'])}; added {len(d['added'])}, removed {len(d['removed'])}, "
        f"changed {len(d['changed'])}"
    )
    for k in ("added", "removed", "changed"):
        for p in d[k]:
            print(f"  {k}: {p}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python3 -m sparkrig.lockfile",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("refresh", help="(re)make a lockfile, or a stack's, from the Hub's metadata")
    which = r.add_mutually_exclusive_group(required=True)
    which.add_argument("--repo", help="one repository (owner/name)")
    which.add_argument(
        "--stack", choices=sorted(STACKS), help="every lockfile a stack declares (sparkrig/stacks/)"
    )
    r.add_argument("--revision", help="--repo: branch, tag or commit (resolved; default main)")
    r.add_argument("--endpoint", default="https://huggingface.co")
    r.add_argument("--repo-type", default="model", choices=["model", "dataset"])
    r.add_argument("--out", help="--repo: lockfile path (default locks/<owner>--<name>.lock.json)")
    r.add_argument("--lockfile-dir", default="locks", help="--stack: where (knob lockfile_dir)")
    sh = sub.add_parser("show", help="summarise a lockfile")
    sh.add_argument("lock")
    args = ap.parse_args(argv)

    if args.cmd == "show":
        lock = load(args.lock)
        print(json.dumps(summary(lock), sort_keys=True))
        return 0

    if args.stack is None:
        out = args.out or os.path.join("locks", lock_name(args.repo))
        return refresh(args.repo, args.revision or "main", args.endpoint, args.repo_type, out)
    if args.revision or args.out:
        ap.error("--stack takes each revision from the declaration and writes into --lockfile-dir")
    failed = [
        pin.repo
        for pin in declared(args.stack)
        if refresh(
            pin.repo,
            pin.revision,
            args.endpoint,
            "model",  # a stack pins Hub models (Pin)
            str(Path(args.lockfile_dir) / lock_name(pin.repo)),
        )
    ]
    if failed:
        print(f"lockfile: stack {args.stack}: not made: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
