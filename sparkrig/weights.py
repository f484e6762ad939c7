"""Which artifacts a rank needs and their lockfiles, read and checked on the control machine."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from pyinfra.api.exceptions import DeployError

from sparkrig import lockfile
from sparkrig.settings import Settings


@dataclass(frozen=True)
class Artifact:
    name: str  # model | drafter
    subdir: str  # under weights_dir
    lock_text: str
    remote_lock: str
    dest: str
    commit: str
    total_files: int
    total_bytes: int


def artifacts(s: Settings) -> list[Artifact]:
    """The model, plus the drafter when the profile needs it; each with its checked lockfile."""
    k = s.knobs
    wanted = [("model", k.model_repo, k.model_revision)]
    if s.needs_drafter:
        wanted.append(("drafter", k.drafter_repo, k.drafter_revision))
    out = []
    for name, repo, revision in wanted:
        path = Path(k.lockfile_dir) / lockfile.lock_name(repo)
        refresh = (
            f"python3 -m sparkrig.lockfile refresh --repo {repo} --revision {revision} "
            f"--endpoint {k.hub_endpoint} --out {path}"
        )
        if not path.exists():
            raise DeployError(f"no lockfile {path} for {repo}; make it with:\n  {refresh}")
        try:
            lock = lockfile.load(str(path))
        except (OSError, ValueError) as err:
            raise DeployError(f"lockfile {path}: {err}") from None
        if lock.get("repo") != repo or lock.get("commit") != revision:
            raise DeployError(
                f"lockfile {path} is for {lock.get('repo')}@{lock.get('commit')}, not "
                f"{repo}@{revision}; refresh it with:\n  {refresh}"
            )
        totals = lockfile.summary(lock)
        out.append(
            Artifact(
                name=name,
                subdir=name,
                lock_text=path.read_text(),
                remote_lock=f"{k.config_dir}/{name}.lock.json",
                dest=f"{k.weights_dir}/{name}",
                commit=revision,
                total_files=totals["files"],
                total_bytes=totals["bytes"],
            )
        )
    return out


def token_text(token_file: str) -> str | None:
    """The Hub token from the control machine (HF_TOKEN wins), or None when there is none."""
    env = os.environ.get("HF_TOKEN")
    if env:
        return env.strip() + "\n"
    path = Path(os.path.expanduser(token_file))
    return path.read_text().strip() + "\n" if path.is_file() else None
