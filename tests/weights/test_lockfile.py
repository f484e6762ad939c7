"""Lockfile generation through the real huggingface_hub client against fakehub."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sparkrig.stacks.base import Pin
from tests import teststacks

from .conftest import FETCH, ROOT, Hub, fakehub, lockfile


def test_lock_matches_repo_bytes(model_lock: Path, hub_root: Path) -> None:
    lock = lockfile.load(str(model_lock))
    repo_dir = hub_root / fakehub.MODEL_REPO
    on_disk = sorted(
        str(p.relative_to(repo_dir))
        for p in repo_dir.rglob("*")
        if p.is_file()
        if p.name != fakehub.META
    )
    assert [f["path"] for f in lock["files"]] == on_disk
    meta = json.loads((repo_dir / fakehub.META).read_text())
    assert lock["commit"] == meta["commit"] and lock["revision"] == "main"
    for f in lock["files"]:
        size, sha1, sha256 = fakehub.hash_file(str(repo_dir / f["path"]))
        assert f["size"] == size
        if f["path"].endswith(".safetensors"):
            assert f["sha256"] == sha256 and "git_sha1" not in f
        else:
            assert f["git_sha1"] == sha1 and "sha256" not in f


def test_pagination_followed(hub_root: Path) -> None:
    h = Hub(hub_root, page=2)
    try:
        lock = lockfile.build_lock(fakehub.MODEL_REPO, "main", h.url)
        tree_calls = [r for r in h.log() if "/tree/" in r["path"]]
    finally:
        h.close()
    assert len(lock["files"]) == 8
    assert len(tree_calls) >= 4  # 9 entries (8 files + 1 dir) at 2 per page


def test_stable_text_and_diff(model_lock: Path, tmp_path: Path) -> None:
    lock = lockfile.load(str(model_lock))
    text = lockfile.dumps(lock)
    shuffled = dict(lock, files=list(reversed(lock["files"])))
    assert lockfile.dumps(shuffled) == text
    assert json.loads(text) == lock
    changed = json.loads(text)
    changed["files"][0]["size"] += 1
    changed["files"].pop()
    d = lockfile.diff(lock, changed)
    assert d["changed"] == [lock["files"][0]["path"]]
    assert d["removed"] == [lock["files"][-1]["path"]] and d["added"] == []


@pytest.mark.parametrize(
    "bad",
    [
        {"path": "../etc/passwd", "size": 1, "sha256": "0" * 64},
        {"path": "/abs", "size": 1, "sha256": "0" * 64},
        {"path": "x", "size": 1, "sha256": "abc"},
        {"path": "x", "size": 1},
        {"path": "model.safetensors.part", "size": 1, "sha256": "0" * 64},  # the fetcher's own
    ],
)
def test_validate_rejects(model_lock: Path, bad: dict[str, object]) -> None:
    lock = lockfile.load(str(model_lock))
    lock["files"].append(bad)
    with pytest.raises(lockfile.LockfileError):
        lockfile.validate(lock)
    # the fetcher on the host refuses it with the same validator, before touching a file
    bad_lock = model_lock.parent / "bad.lock.json"
    bad_lock.write_text(json.dumps(lock))
    dest = str(model_lock.parent / "d")
    out = subprocess.run(
        [sys.executable, FETCH, "verify", "--lock", str(bad_lock), "--dest", dest],
        capture_output=True, text=True,
    )  # fmt: skip
    assert out.returncode != 0 and "LockfileError" in out.stderr


def test_unknown_revision_and_repo(hub: Hub) -> None:
    from huggingface_hub.errors import RepositoryNotFoundError, RevisionNotFoundError

    with pytest.raises(RevisionNotFoundError):
        lockfile.build_lock(fakehub.MODEL_REPO, "no-such-branch", hub.url)
    with pytest.raises(RepositoryNotFoundError):
        lockfile.build_lock("nobody/nothing", "main", hub.url)


def refresh(
    h: Hub, tmp_path: Path, repo: str, **env: str
) -> tuple[subprocess.CompletedProcess[str], Path]:
    """``python3 -m sparkrig.lockfile refresh`` as the operator types it, with no token but the
    ones ``env`` gives (HF_HOME: where `hf auth login` wrote one)."""
    out = tmp_path / "locks" / "d.lock.json"
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING"))}
    clean.setdefault("HF_HOME", str(tmp_path / "no-login"))
    r = subprocess.run(
        [sys.executable, "-m", "sparkrig.lockfile", "refresh", "--repo", repo,
         "--endpoint", h.url, "--out", str(out)],
        cwd=ROOT, env={**clean, **env}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    return r, out


def logged_in(tmp_path: Path, token: str) -> str:
    """An HF_HOME where `hf auth login` stored ``token`` (its file: $HF_HOME/token)."""
    home = tmp_path / "hfhome"
    home.mkdir(exist_ok=True)
    (home / "token").write_text(token + "\n")
    return str(home)


def test_cli_refresh_uses_the_login_file_and_never_prints_the_token(
    hub_root: Path, tmp_path: Path
) -> None:
    token = "hf_SECRETtokenVALUE1234567890"
    h = Hub(hub_root, token=token)
    try:
        r, out = refresh(h, tmp_path, fakehub.DRAFTER_REPO, HF_HOME=logged_in(tmp_path, token))
        authed = [x["auth"] for x in h.log() if x["status"] != 401]
        h.clear()
        denied, _ = refresh(h, tmp_path, fakehub.DRAFTER_REPO)
    finally:
        h.close()
    assert r.returncode == 0, r.stderr
    assert token not in r.stdout + r.stderr and token not in out.read_text()
    assert authed and all(authed)
    assert lockfile.load(str(out))["repo"] == fakehub.DRAFTER_REPO
    assert denied.returncode == 1 and token not in denied.stdout + denied.stderr


def test_cli_refresh_takes_hf_token_before_the_login_file(hub_root: Path, tmp_path: Path) -> None:
    """huggingface_hub's order: HF_TOKEN, then the file `hf auth login` wrote."""
    h = Hub(hub_root, token="hf_fromTheEnvironment123")
    try:
        home = logged_in(tmp_path, "hf_fromTheLoginFile456")
        r, _ = refresh(h, tmp_path, fakehub.DRAFTER_REPO, HF_HOME=home)
        env, _ = refresh(
            h, tmp_path, fakehub.DRAFTER_REPO, HF_HOME=home, HF_TOKEN="hf_fromTheEnvironment123"
        )
    finally:
        h.close()
    assert r.returncode == 1  # the file's token is not the one the Hub takes
    assert env.returncode == 0, env.stderr


def test_a_gated_repo_without_a_token_is_refused_naming_the_repo(
    hub_root: Path, tmp_path: Path
) -> None:
    h = Hub(hub_root)
    h.state.gated[fakehub.DRAFTER_REPO] = "manual"
    try:
        r, out = refresh(h, tmp_path / "none", fakehub.DRAFTER_REPO)
        ok, locked = refresh(h, tmp_path / "env", fakehub.DRAFTER_REPO, HF_TOKEN="hf_" + "t" * 30)
        public, _ = refresh(h, tmp_path / "public", fakehub.MODEL_REPO)
    finally:
        h.close()
    assert r.returncode == 1 and not out.exists()
    assert f"{fakehub.DRAFTER_REPO} is gated on the Hub (manual approval)" in r.stderr
    assert "hf auth login" in r.stderr and "HF_TOKEN" in r.stderr
    assert ok.returncode == 0, ok.stderr
    assert lockfile.load(str(locked))["gated"] == "manual"  # the deploy reads it (config/rules.py)
    assert public.returncode == 0, public.stderr  # not gated: no token needed


def test_lockfiles_are_named_per_repo_and_the_legacy_name_is_still_read(tmp_path: Path) -> None:
    """Two stacks pin repos of one name under different owners (LibertAIDAI/ and nvidia/
    GLM-5.3-Flash-NVFP4): each gets owner--Name.lock.json; a lockfile of the name used before
    stacks (Name.lock.json) is read when it is this repo's, never another owner's."""
    from sparkrig.lockfile import lock_name, lock_path

    libertai, nvidia = "LibertAIDAI/GLM-5.3-Flash-NVFP4", "nvidia/GLM-5.3-Flash-NVFP4"
    assert lock_name(libertai) == "LibertAIDAI--GLM-5.3-Flash-NVFP4.lock.json"
    assert lock_name(libertai) != lock_name(nvidia)
    d = str(tmp_path)
    assert lock_path(d, nvidia) == tmp_path / lock_name(nvidia)  # neither: where to make it
    legacy = tmp_path / "GLM-5.3-Flash-NVFP4.lock.json"
    legacy.write_text(json.dumps({"repo": libertai, "commit": "a" * 40}))
    assert lock_path(d, libertai) == legacy  # the legacy name, this repo's: read
    assert lock_path(d, nvidia) == tmp_path / lock_name(nvidia)  # another owner's: not taken
    (tmp_path / lock_name(libertai)).write_text("{}")
    assert lock_path(d, libertai) == tmp_path / lock_name(libertai)  # the per-repo name first


def test_cli_refresh_against_an_endpoint_that_does_not_answer_names_it(tmp_path):
    """Issue 49: offline, the error named neither the endpoint nor the knob that sets it."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    r = subprocess.run(
        [sys.executable, "-m", "sparkrig.lockfile", "refresh", "--repo", "o/m",
         "--endpoint", url, "--out", str(tmp_path / "m.lock.json")],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={**os.environ, "HF_HOME": str(tmp_path / "no-login"), "HF_HUB_OFFLINE": "0"},
    )  # fmt: skip
    assert r.returncode == 1
    assert f"from {url} (--endpoint)" in r.stderr, r.stderr
    assert not (tmp_path / "m.lock.json").exists()


def test_cli_refresh_stack_makes_every_lockfile_the_stack_declares(
    hub_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """`refresh --stack NAME`: the stack's model and drafter, each at its pin, where the deploy
    reads them, so the deploy's lockfile check passes after one command (issue 49)."""
    commit = {r: json.loads((hub_root / r / fakehub.META).read_text())["commit"]
              for r in (fakehub.MODEL_REPO, fakehub.DRAFTER_REPO)}  # fmt: skip
    teststacks.register(
        monkeypatch, "test-fakehub", model=Pin(fakehub.MODEL_REPO, commit[fakehub.MODEL_REPO]),
        drafter=Pin(fakehub.DRAFTER_REPO, commit[fakehub.DRAFTER_REPO]),
    )  # fmt: skip
    monkeypatch.delenv("HF_TOKEN", raising=False)
    locks = tmp_path / "locks"
    h = Hub(hub_root)
    try:
        rc = lockfile.main(["refresh", "--stack", "test-fakehub", "--endpoint", h.url,
                            "--lockfile-dir", str(locks)])  # fmt: skip
    finally:
        h.close()
    assert rc == 0, capsys.readouterr().err
    made = sorted(p.name for p in locks.iterdir())
    assert made == sorted(lockfile.lock_name(r) for r in commit)
    found, refused = lockfile.checked_all(str(locks), commit.items(), h.url)
    assert refused == [] and {r: lock["commit"] for r, lock in found.items()} == commit
    with pytest.raises(SystemExit):  # the declaration's revisions, into --lockfile-dir only
        lockfile.main(["refresh", "--stack", "test-fakehub", "--revision", "main"])
