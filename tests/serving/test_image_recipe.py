"""Patched-image recipe: content-hash tag and the fail-closed patch applier (the SM121 fix made
from the base image's own file)."""

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
IMAGE = "sparkrig/vllm-glm53:base-" + "ab" * 32  # what the Dockerfile passes: the local base
TARGET = "model_executor/layers/sparse_attn_indexer_kpool.py"
# Excerpts of the v11 base image's file and of tonyd2wild's fixed file (tests/image/data/README.md)
DATA = REPO / "tests" / "image" / "data"
BASE_FILE = (DATA / "sparse_attn_indexer_kpool.base.excerpt").read_text()
SM121_FILE = (DATA / "sparse_attn_indexer_kpool.sm121.excerpt").read_text()
# The whole files' sha256 (docs/sm121.md): the v11 base's and tonyd2wild's
V11_BASE_FILE_SHA256 = "ab5972fdea99fb19e78d2e34ff364012dd43e0b9314869854c279d0b26e30065"
TONYD2WILD_FILE_SHA256 = "8a3ecfb0bab2441dd7417ed00a10d142191496149f88e5fe79fcfaea4b160980"


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
    with open(copy / "patches" / "sm121_topk" / "places.py", "a") as fh:
        fh.write("# another transformation\n")
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
    after_from = text.split("FROM ${BASE}", 1)[1]  # the applier names the base image
    assert "ARG BASE\n" in after_from and '--image "${BASE}"' in after_from


def fake_vllm(tmp_path: Path, body: str | None = BASE_FILE) -> Path:
    """A vllm package directory holding ``body`` as the indexer file (None: no such file)."""
    d = tmp_path / "site" / "vllm"
    (d / "model_executor" / "layers").mkdir(parents=True)
    if body is not None:
        (d / TARGET).write_text(body)
    return d


def patch_dir(tmp_path: Path, pins: dict[str, str] | None = None) -> Path:
    """A copy of files/patches; ``pins`` replaces the shipped entry's pins."""
    d = tmp_path / "patches"
    shutil.copytree(REPO / "files" / "patches", d)
    if pins is not None:
        m = json.loads((d / "manifest.json").read_text())
        m["patches"][0]["pins"] = pins
        (d / "manifest.json").write_text(json.dumps(m))
    return d


def run_applier(d: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(d / "apply_patches.py"), *args],
                          capture_output=True, text=True)  # fmt: skip


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def test_the_shipped_patch_makes_the_sm121_fix_from_the_base_file(tmp_path: Path) -> None:
    d, vllm = patch_dir(tmp_path), fake_vllm(tmp_path)
    res = run_applier(d, "--vllm-dir", str(vllm), "--image", IMAGE)
    assert res.returncode == 0, res.stderr
    assert (vllm / TARGET).read_text() == SM121_FILE  # tonyd2wild's lines, byte for byte
    applied = json.loads((d / "APPLIED.json").read_text())
    assert applied["image"] == IMAGE
    entry = applied["patches"][0]
    assert entry["status"] == "applied" and entry["pinned"] is False  # an excerpt: no pin
    assert entry["stock_sha256"] == sha(BASE_FILE) and entry["applied_sha256"] == sha(SM121_FILE)
    assert f"{sha(BASE_FILE)} -> {sha(SM121_FILE)}, UNPINNED" in res.stdout


def test_a_pinned_base_file_must_give_its_pin(tmp_path: Path) -> None:
    d = patch_dir(tmp_path, {sha(BASE_FILE): sha(SM121_FILE)})
    res = run_applier(d, "--vllm-dir", str(fake_vllm(tmp_path)), "--image", IMAGE)
    assert res.returncode == 0, res.stderr
    assert json.loads((d / "APPLIED.json").read_text())["patches"][0]["pinned"] is True
    assert ", pinned)" in res.stdout

    d = patch_dir(tmp_path / "b", {sha(BASE_FILE): "0" * 64})
    vllm = fake_vllm(tmp_path / "b")
    res = run_applier(d, "--vllm-dir", str(vllm), "--image", IMAGE)
    assert res.returncode == 1
    assert f"gave {sha(SM121_FILE)}, pinned {'0' * 64}" in res.stderr
    assert (vllm / TARGET).read_text() == BASE_FILE
    assert not (d / "APPLIED.json").exists()


def test_the_shipped_pin_is_tonyd2wilds_file_from_the_v11_base_file() -> None:
    m = json.loads((REPO / "files" / "patches" / "manifest.json").read_text())
    assert m["patches"][0]["pins"] == {V11_BASE_FILE_SHA256: TONYD2WILD_FILE_SHA256}


DISPATCH = "        if current_platform.is_cuda() and select_k in (512, 1024, 2048):\n"
INIT = "            pool_topk = torch.full(\n"


@pytest.mark.parametrize(
    ("body", "found"),
    [
        (BASE_FILE.replace(DISPATCH, ""), "top-k dispatch (persistent_topk only on >= 78 SMs): "
         "found 0 times"),
        (BASE_FILE + DISPATCH, "top-k dispatch (persistent_topk only on >= 78 SMs): "
         "found 2 times"),
        (SM121_FILE, "found 0 times"),  # already patched: not the file the fix is for
        (BASE_FILE.replace(INIT, "            pool_topk = torch.empty(\n"),  # the day-0 file
         "-1 initialisation of the decode pool top-k: found 0 times"),
    ],
    ids=["dispatch-missing", "dispatch-doubled", "already-patched", "no-minus-one-init"],
)  # fmt: skip
def test_an_anchor_not_found_exactly_once_stops_the_build_naming_file_and_image(
    tmp_path: Path, body: str, found: str
) -> None:
    d, vllm = patch_dir(tmp_path), fake_vllm(tmp_path, body)
    res = run_applier(d, "--vllm-dir", str(vllm), "--image", IMAGE)
    assert res.returncode == 1
    assert f"{vllm / TARGET} of image {IMAGE}: " in res.stderr and found in res.stderr
    assert f"refusing to build a half-patched image from {IMAGE}" in res.stderr
    assert (vllm / TARGET).read_text() == body  # nothing written
    assert not (d / "APPLIED.json").exists()


def test_a_base_without_the_file_or_without_vllm_stops_the_build(tmp_path: Path) -> None:
    d = patch_dir(tmp_path)
    res = run_applier(d, "--vllm-dir", str(fake_vllm(tmp_path, None)), "--image", IMAGE)
    assert res.returncode == 1 and f"of image {IMAGE}: no such file" in res.stderr
    m = json.loads((d / "manifest.json").read_text())
    _, _, errors = ap.plan(m, str(d), None, set(), IMAGE)
    assert errors == [f"patch sm121-topk: no vllm package in image {IMAGE} to patch"]


def test_rewrite_finds_and_replaces_every_anchor_in_the_original_text() -> None:
    places = [("a", "x", "yy"), ("b", "y", "z")]  # "y" appears only after the first replacement
    assert ap.rewrite("x", places) == ("x", ["b: found 0 times, needs exactly 1"])
    assert ap.rewrite("xy", places) == ("yyz", [])
    assert ap.rewrite("abc", [("p", "ab", "X"), ("q", "bc", "Y")]) == ("abc", ["q: overlaps p"])


def test_a_file_that_parsed_must_still_parse(tmp_path: Path) -> None:
    d = patch_dir(tmp_path)
    (d / "sm121_topk" / "places.py").write_text('PLACES = [("x", "a = 1\\n", "a = (\\n")]\n')
    res = run_applier(d, "--vllm-dir", str(fake_vllm(tmp_path, "a = 1\n")), "--image", IMAGE)
    assert res.returncode == 1 and "the transformed file does not parse" in res.stderr


def test_skip(tmp_path: Path) -> None:
    d = patch_dir(tmp_path)
    res = run_applier(d, "--skip", "sm121-topk")  # the lab's stand-in image: nothing to patch
    assert res.returncode == 0, res.stderr
    assert json.loads((d / "APPLIED.json").read_text())["patches"][0]["status"] == "skipped"
    res = run_applier(d, "--skip", "nope")
    assert res.returncode == 1 and "unknown patch" in res.stderr
