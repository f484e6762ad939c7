"""Pure helpers of the image phase: the content-hash tag, the fact's parser, the copy plan."""

from __future__ import annotations

import io
import runpy
import shutil
import tarfile
from pathlib import Path
from typing import Any

import pytest
from pyinfra.api.exceptions import FactProcessError

from sparkrig import image, imagebuild, imagecopy
from sparkrig.config.inventory import InventoryView, build
from sparkrig.imagehash import context_files
from tests.image.fakeimage import LAYERS, image_state

ROOT = Path(__file__).resolve().parents[2]
BASE = "registry.example/vllm@sha256:" + "ab" * 32
OTHER = "registry.example/vllm@sha256:" + "cd" * 32
REPO = "sparkrig/vllm-glm53"


@pytest.fixture
def files(tmp_path) -> Path:
    dest = tmp_path / "files"
    shutil.copytree(ROOT / "files", dest, ignore=shutil.ignore_patterns("__pycache__"))
    return dest


def settings(**knobs: Any):
    data = runpy.run_path(str(ROOT / "group_data/all.py"))
    base = {k: v for k, v in data.items() if not k.startswith("__")}
    base.update(base_image=BASE, **knobs)
    hosts = [
        (f"spark-{i}", {**base, "fabric_interface": "enp1s0f1np1",
                        "fabric_address": f"192.168.100.{10 + i}/24"})
        for i in range(2)
    ]  # fmt: skip
    return build(InventoryView({"head": hosts[:1], "worker": hosts[1:]}))


# --- the tag ----------------------------------------------------------------------------------


def test_tag_is_stable_and_follows_every_input(files):
    tag = image.patched_tag(BASE, (), files)
    assert tag == image.patched_tag(BASE, (), files)
    assert tag.startswith("h") and len(tag) == 21
    assert image.patched_tag(OTHER, (), files) != tag
    assert image.patched_tag(BASE, ["sm121-topk"], files) != tag
    places = files / "patches" / "sm121_topk" / "places.py"
    places.write_text(places.read_text() + "# another place\n")
    changed = image.patched_tag(BASE, (), files)
    assert changed != tag
    places.write_text(places.read_text() + "#")
    assert image.patched_tag(BASE, (), files) != changed


def test_tag_ignores_build_leftovers_and_skip_order(files):
    tag = image.patched_tag(BASE, ["b", "a"], files)
    (files / "patches" / "APPLIED.json").write_text("{}")
    (files / "patches" / "__pycache__").mkdir()
    (files / "patches" / "__pycache__" / "x.pyc").write_bytes(b"\0")
    assert image.patched_tag(BASE, ["a", "b"], files) == tag
    assert image.hashed_build_args([]) == {}  # production tags carry no skip argument


def test_serving_image_is_the_patched_tag_and_the_lab_skip_changes_it():
    prod = settings()
    ref = image.serving_image(prod["spark-0"])
    assert ref == f"{REPO}:{image.patched_tag(BASE)}"
    assert image.serving_image(prod["spark-1"]) == ref  # same on every rank
    lab = settings(image_skip_patches=["sm121-topk"])
    lab_tag = image.patched_tag(BASE, ["sm121-topk"])
    assert image.serving_image(lab["spark-0"]) == f"{REPO}:{lab_tag}"
    assert image.serving_image(lab["spark-0"]) != ref
    keep = imagebuild.images_to_keep(prod["spark-0"])
    assert keep == [ref, f"{REPO}:base-{'ab' * 32}"]


def test_names_carry_the_full_digest():
    assert image.local_base(REPO, BASE) == f"{REPO}:base-{'ab' * 32}"
    assert imagecopy.transfer_tag(REPO, BASE) == f"{REPO}:transfer-{'ab' * 32}"
    assert imagecopy.transfer_name(BASE) == f"base-{'ab' * 32}"
    with pytest.raises(ValueError, match="pinned by digest"):
        image.local_base(REPO, "vllm/vllm-openai:latest")


def test_context_tar_is_deterministic_and_holds_what_the_dockerfile_copies():
    files = context_files(ROOT / "files")
    data = imagebuild.context_tar(files)
    assert data == imagebuild.context_tar(dict(reversed(list(files.items()))))
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        names = tar.getnames()
        assert {"Dockerfile", "patches", "patches/manifest.json"} <= set(names)
        for name, body in files.items():
            member = tar.extractfile(name)
            assert member is not None and member.read() == body
        assert all(m.mtime == 0 and m.uid == 0 for m in tar.getmembers())


# --- the fact ---------------------------------------------------------------------------------


def test_fact_output_of_the_head_after_a_pull():
    r = image.parse_image_report(image_state(BASE, patched=False))
    assert r.answered
    assert r.pulled(BASE) and r.base_ok(BASE) and r.layers(BASE) == LAYERS
    assert r.base is not None and r.base.platform == "linux/arm64"
    assert r.patched is None and r.tags == (image.local_base(REPO, BASE),)
    assert not r.pulled(OTHER)


def test_fact_output_of_a_worker_after_a_verified_copy():
    r = image.parse_image_report(image_state(BASE, pulled=False))
    assert r.ref is None and r.base is not None and not r.pulled(BASE)
    assert r.base_ok(BASE, LAYERS)  # by content: the head's layers
    assert r.base_ok(BASE, None)  # head unknown: the digest-named tag exists only once verified
    assert not r.base_ok(BASE, ("sha256:" + "99" * 32,))
    assert r.patched is not None


def test_fact_default_and_bad_output():
    empty = image.ImageReport()
    assert not empty.answered and empty.base is None and not empty.base_ok(BASE)
    bare = image.parse_image_report(["ref=", "base=", "patched=", "tags=", image.END])
    assert bare.answered and bare.base is None and bare.tags == ()
    with pytest.raises(FactProcessError, match="no end marker"):
        image.parse_image_report(["ref="])
    with pytest.raises(FactProcessError, match="unexpected inspect line"):
        image.parse_image_report(["base=[]", image.END])


def test_fact_command_names_every_image_and_the_marker():
    cmd = image.ImageState().command(image_repo=REPO, base_image=BASE, tag="h1").get_raw_value()
    assert image.MARKER in cmd and BASE in cmd
    assert f"{REPO}:base-{'ab' * 32}" in cmd and f"{REPO}:h1" in cmd
    assert image.MARKER in image.RepoTags().command(image_repo=REPO).get_raw_value()
    assert image.RepoTags().process(image_state(BASE)) == sorted(
        [image.local_base(REPO, BASE), f"{REPO}:{image.patched_tag(BASE)}"]
    )


# --- cross-node plan and commands -------------------------------------------------------------


def test_copy_plan_judges_workers_by_layers_not_ids():
    head = image.parse_image_report(image_state(BASE))
    ok = image.parse_image_report(image_state(BASE, pulled=False))
    bare = image.parse_image_report(image_state(BASE, base=False, patched=False))
    odd = image.parse_image_report(image_state(BASE, pulled=False, layers=("sha256:" + "99" * 32,)))
    plan = imagecopy.copy_plan(head, {"w1": ok, "w2": bare, "w3": odd}, BASE)
    assert plan.missing == ["w2"] and plan.mismatched == ["w3"]
    nothing = image.ImageReport()  # first run: the head has not pulled yet
    plan = imagecopy.copy_plan(nothing, {"w1": ok, "w2": bare}, BASE)
    assert plan.missing == ["w2"] and plan.mismatched == []


def test_commands_never_send_a_worker_to_the_registry():
    local, transfer = image.local_base(REPO, BASE), imagecopy.transfer_tag(REPO, BASE)
    saved = imagecopy.SavedTar("a" * 64, 123, "sha256:" + "1" * 64 + ",")
    load = imagecopy.load_command(
        "http://192.168.100.10:29701", "/d", "base-x", transfer, local, saved, ["sparkhost"]
    )
    assert f"--sha256 {'a' * 64} --size 123" in load and "--max-filesize 123" in load
    assert load.index("imageload") > load.index("curl")  # checked after the download, and
    assert "docker load" not in load  # loaded only by imageload, after its checks
    assert "docker pull" not in load and "registry.example" not in load
    assert "http://192.168.100.10:29701/base-x.tar" in load
    assert imagecopy.pull_command(BASE, local, have_ref=True) == f"docker tag {BASE} {local}"
    assert imagecopy.pull_command(BASE, local, have_ref=False).startswith(
        f"docker pull --quiet {BASE}"
    )
    build_cmd = imagebuild.build_command(
        "/b", local, f"{REPO}:h1", "h1", {"SPARKRIG_SKIP_PATCHES": "x"}
    )
    assert "DOCKER_BUILDKIT=0 docker build --network none" in build_cmd
    assert f"--build-arg BASE={local}" in build_cmd and "SPARKRIG_SKIP_PATCHES=x" in build_cmd
    assert "docker pull" not in build_cmd and "--pull" not in build_cmd
    save = imagecopy.save_command(local, transfer, "/d", "base-x")
    assert "--platform" in save and "/d/base-x.tar.part" in save


def test_prune_keeps_what_it_is_told():
    tags = [f"{REPO}:h1", f"{REPO}:h2", f"{REPO}:base-x"]
    assert imagebuild.prune_commands(tags, tags) == []
    cmds = imagebuild.prune_commands(tags, [f"{REPO}:h2", f"{REPO}:base-x"])
    assert len(cmds) == 1 and cmds[0].startswith(f"docker image rm {REPO}:h1 ")


def test_the_head_records_each_base_it_pulls_once(tmp_path: Path) -> None:
    """The pull (or naming) of a base adds its reference to the pulled-images record, once per
    reference, whatever stack it is for: uninstall.py removes every one of them."""
    import subprocess

    record = tmp_path / "etc" / "pulled-images"
    other = "registry.example/other@sha256:" + "cd" * 32
    for ref in (BASE, BASE, other):
        line = imagecopy.pulled_record_line(ref, str(record))
        assert subprocess.run(["sh", "-c", line], check=False).returncode == 0
    assert record.read_text().splitlines() == [BASE, other]
    local = image.local_base(REPO, BASE)
    cmd = imagecopy.pull_command(BASE, local, have_ref=False, record=str(record))
    assert cmd.startswith(f"docker pull --quiet {BASE} && docker tag ")
    assert cmd.endswith(imagecopy.pulled_record_line(BASE, str(record)))
