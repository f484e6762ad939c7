"""Patched-image recipe: content-hash tag and the fail-closed patch applier."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from serving_helpers import REPO, load_path

from sparkrig import imagehash

ap = load_path("apply_patches", REPO / "files" / "patches" / "apply_patches.py")
DIGEST = "sha256:" + "ab" * 32
BASE = "ghcr.io/x/vllm@" + DIGEST


def test_base_digest() -> None:
    assert imagehash.base_digest(BASE) == DIGEST
    assert imagehash.base_digest(DIGEST) == DIGEST
    for bad in ("vllm:latest", "repo@sha256:abc", "", "repo@sha256:" + "AB" * 32):
        with pytest.raises(ValueError):
            imagehash.base_digest(bad)


def test_tag_is_stable_and_sensitive() -> None:
    files = {"Dockerfile": b"FROM x", "patches/a.py": b"1"}
    t = imagehash.image_tag(BASE, files)
    assert t == imagehash.image_tag(BASE, dict(reversed(list(files.items()))))
    assert t.startswith("h") and len(t) == 21
    assert t == imagehash.image_tag("other/repo@" + DIGEST, files)  # same content, same tag
    assert t != imagehash.image_tag("r@sha256:" + "cd" * 32, files)
    assert t != imagehash.image_tag(BASE, {**files, "patches/a.py": b"2"})
    assert t != imagehash.image_tag(BASE, {**files, "patches/b.py": b""})
    assert t != imagehash.image_tag(BASE, files, {"SPARKRIG_SKIP_PATCHES": "sm121-topk"})
    with pytest.raises(ValueError):
        imagehash.image_tag(BASE, {"../x": b""})
    assert imagehash.image_ref("sparkrig/vllm-glm53", t) == f"sparkrig/vllm-glm53:{t}"


def test_context_files_of_the_checkout(tmp_path: Path) -> None:
    ctx = imagehash.context_files(REPO / "files")
    assert {"Dockerfile", "utf8_guard_lp.py", "patches/manifest.json",
            "patches/apply_patches.py"} <= set(ctx)  # fmt: skip
    assert not any(k.startswith("sparkhost/") for k in ctx)  # mounted for the smoke test
    assert not any("__pycache__" in k for k in ctx)
    copy = tmp_path / "files"
    shutil.copytree(REPO / "files", copy)
    t1 = imagehash.tag_for_checkout(BASE, copy)
    (copy / "patches" / "APPLIED.json").write_text("{}")  # build output: not an input
    (copy / "sparkrig_other.py").write_text("x")  # not COPYed by the Dockerfile
    assert imagehash.tag_for_checkout(BASE, copy) == t1
    (copy / "patches" / "sm121_topk" / "sparse_attn_indexer_kpool.py").write_text("# patched\n")
    t2 = imagehash.tag_for_checkout(BASE, copy)
    assert t2 != t1
    (copy / "sparkhost" / "nccl_smoke.py").write_text("# another smoke test\n")
    assert imagehash.tag_for_checkout(BASE, copy) == t2  # no rebuild, no pair restart
    (copy / "utf8_guard_lp.py").unlink()
    with pytest.raises(FileNotFoundError):
        imagehash.context_files(copy)


def test_dockerfile_copies_what_the_hash_covers() -> None:
    text = (REPO / "files" / "Dockerfile").read_text()
    assert "ARG BASE" in text and "FROM ${BASE}" in text
    for name in imagehash.CONTEXT_TOP[1:]:
        assert name in text
    assert "COPY patches/" in text and "apply_patches.py" in text


def fake_vllm(tmp_path: Path, with_target: bool = True) -> Path:
    d = tmp_path / "site" / "vllm"
    (d / "model_executor" / "layers").mkdir(parents=True)
    if with_target:
        (d / "model_executor" / "layers" / "sparse_attn_indexer_kpool.py").write_text("# stock\n")
    return d


def patch_dir(tmp_path: Path, content: bytes | None, pin: str | None) -> Path:
    d = tmp_path / "patches"
    shutil.copytree(REPO / "files" / "patches", d)
    if content is not None:
        (d / "sm121_topk" / "sparse_attn_indexer_kpool.py").write_bytes(content)
    m = json.loads((d / "manifest.json").read_text())
    m["patches"][0]["sha256"] = pin
    (d / "manifest.json").write_text(json.dumps(m))
    return d


def run_applier(d: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(d / "apply_patches.py"), *args],
                          capture_output=True, text=True)  # fmt: skip


def test_shipped_manifest_fails_closed_without_the_drop_in(tmp_path: Path) -> None:
    res = run_applier(REPO / "files" / "patches", "--vllm-dir", str(fake_vllm(tmp_path)),
                      "--dry-run")  # fmt: skip
    assert res.returncode == 1
    assert "sparse_attn_indexer_kpool.py is missing" in res.stderr
    assert not (REPO / "files" / "patches" / "APPLIED.json").exists()


def test_applies_pinned_patch(tmp_path: Path) -> None:
    body = b"# patched top-k\n"
    d = patch_dir(tmp_path, body, hashlib.sha256(body).hexdigest())
    vllm = fake_vllm(tmp_path)
    res = run_applier(d, "--vllm-dir", str(vllm))
    assert res.returncode == 0, res.stderr
    target = vllm / "model_executor" / "layers" / "sparse_attn_indexer_kpool.py"
    assert target.read_bytes() == body
    applied = json.loads((d / "APPLIED.json").read_text())["patches"][0]
    assert applied["status"] == "applied"
    assert applied["stock_sha256"] == hashlib.sha256(b"# stock\n").hexdigest()


@pytest.mark.parametrize(
    ("content", "pin", "target", "msg"),
    [
        (b"x", None, True, "pins no sha256"),
        (b"x", "0" * 64, True, "!= pinned"),
        (b"x", hashlib.sha256(b"x").hexdigest(), False, "not in the base image"),
    ],
)
def test_fails_closed(tmp_path: Path, content: bytes, pin: str | None, target: bool,
                      msg: str) -> None:  # fmt: skip
    d = patch_dir(tmp_path, content, pin)
    res = run_applier(d, "--vllm-dir", str(fake_vllm(tmp_path, with_target=target)))
    assert res.returncode == 1 and msg in res.stderr
    assert not (d / "APPLIED.json").exists()


def test_no_vllm_and_skip(tmp_path: Path) -> None:
    d = patch_dir(tmp_path, b"x", hashlib.sha256(b"x").hexdigest())
    actions, errors = ap.plan(json.loads((d / "manifest.json").read_text()), str(d), None, set())
    assert any("no vllm package" in e for e in errors)
    res = run_applier(d, "--skip", "sm121-topk")  # the lab's stand-in image: nothing to patch
    assert res.returncode == 0, res.stderr
    assert json.loads((d / "APPLIED.json").read_text())["patches"][0]["status"] == "skipped"
    res = run_applier(d, "--skip", "nope")
    assert res.returncode == 1 and "unknown patch" in res.stderr
