"""The image phase's shell commands, run for real by /bin/sh against a fake docker CLI: the head
pulls and saves, the real sparkrig-fetch serves on loopback, the worker downloads with curl,
loads, checks layers and builds; the fact script's output parses back into what happened."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from sparkrig import image, imagebuild, imagecopy
from sparkrig.imagehash import context_files

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
BASE = "registry.example/vllm@sha256:" + "ab" * 32
REPO = "sparkrig/vllm-glm53"
LAYERS = ["sha256:" + "11" * 32, "sha256:" + "22" * 32]
SKIP = ["sm121-topk"]  # a base image without vLLM, as the lab's stand-in
TARGET = "model_executor/layers/sparse_attn_indexer_kpool.py"
DATA = HERE / "data"  # excerpts of the base image's file and of the fixed one (data/README.md)
BASE_FILE = (DATA / "sparse_attn_indexer_kpool.base.excerpt").read_text()
SM121_FILE = (DATA / "sparse_attn_indexer_kpool.sm121.excerpt").read_text()

pytestmark = pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl")


class Node:
    def __init__(self, root: Path, registry: Path) -> None:
        self.root = root
        (root / "bin").mkdir(parents=True)
        docker = root / "bin" / "docker"
        docker.write_text(f'#!/bin/sh\nexec {sys.executable} {HERE / "fake_docker.py"} "$@"\n')
        docker.chmod(0o755)
        self.env = {
            **os.environ,
            "PATH": f"{root / 'bin'}:{os.environ['PATH']}",
            "FAKE_DOCKER_STATE": str(root / "docker.json"),
            "FAKE_DOCKER_LOG": str(root / "docker.log"),
            "FAKE_DOCKER_REGISTRY": str(registry),
        }
        self.transfer = str(root / "transfer")
        self.build_dir = str(root / "build")

    def sh(self, script: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["sh", "-c", script], env=self.env, capture_output=True, text=True, check=False
        )

    def report(self, tag: str) -> image.ImageReport:
        cmd = image.ImageState().command(image_repo=REPO, base_image=BASE, tag=tag)
        out = subprocess.run(
            cmd.get_raw_value(), shell=True, env=self.env, capture_output=True, text=True
        )
        assert out.returncode == 0, out.stderr
        return image.parse_image_report(out.stdout.splitlines())

    def docker_calls(self) -> list[str]:
        log = self.root / "docker.log"
        return log.read_text().splitlines() if log.exists() else []

    def build(self, tag: str, skip: list[str] = SKIP) -> subprocess.CompletedProcess[str]:
        Path(self.build_dir).mkdir(exist_ok=True)
        files = context_files(ROOT / "files")
        (Path(self.build_dir) / "context.tar").write_bytes(imagebuild.context_tar(files))
        local = image.local_base(REPO, BASE)
        args = image.hashed_build_args(skip)
        return self.sh(imagebuild.build_command(self.build_dir, local, f"{REPO}:{tag}", tag, args))

    def files_of(self, ref: str) -> dict[str, str]:
        """The vllm files the fake image ``ref`` holds."""
        state = json.loads((self.root / "docker.json").read_text())
        return dict(state["images"][state["tags"][ref]].get("files", {}))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def make_pair(tmp_path: Path, vllm_files: dict[str, str] | None = None) -> tuple[Node, Node]:
    """Head and worker; the registry's base image holds ``vllm_files`` (none: no vLLM)."""
    registry = tmp_path / "registry.json"
    base: dict[str, object] = {"os": "linux", "arch": "arm64", "layers": LAYERS}
    if vllm_files is not None:
        base["files"] = vllm_files
    registry.write_text(json.dumps({BASE: base}))
    return Node(tmp_path / "head", registry), Node(tmp_path / "worker", registry)


@pytest.fixture
def pair(tmp_path):
    return make_pair(tmp_path)


def serve(head: Node, port: int) -> subprocess.Popen[bytes]:
    package = ROOT / "files" / "sparkhost"
    argv = [sys.executable, str(package), "serve", "--dir", head.transfer]
    argv += ["--listen", f"127.0.0.1:{port}", "--max-seconds", "60"]
    proc = subprocess.Popen(argv, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60  # generous: a loaded CI machine starts Python slowly
    while time.monotonic() < deadline and proc.poll() is None:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return proc
        time.sleep(0.05)
    proc.kill()
    raise AssertionError("sparkhost serve did not come up")


PACKAGE = [sys.executable, str(ROOT / "files" / "sparkhost")]


def saved_tar(head: Node, stem: str) -> imagecopy.SavedTar:
    """The head's record of its saved tar, as the deploy reads it over SSH."""
    out = head.sh(imagecopy.saved_tar_command(head.transfer, stem))
    assert out.returncode == 0, out.stderr
    saved = imagecopy.SavedTar.parse(out.stdout.splitlines())
    assert saved is not None, out.stdout
    return saved


def load_from(
    head: Node, worker: Node, saved: imagecopy.SavedTar
) -> subprocess.CompletedProcess[str]:
    local, stem = image.local_base(REPO, BASE), imagecopy.transfer_name(BASE)
    port = free_port()
    server = serve(head, port)
    try:
        return worker.sh(
            imagecopy.load_command(
                f"http://127.0.0.1:{port}", worker.transfer, stem,
                imagecopy.transfer_tag(REPO, BASE), local, saved, PACKAGE,
            )
        )  # fmt: skip
    finally:
        server.kill()
        server.wait()


def save_on(head: Node) -> imagecopy.SavedTar:
    local, stem = image.local_base(REPO, BASE), imagecopy.transfer_name(BASE)
    saved = head.sh(
        imagecopy.save_command(local, imagecopy.transfer_tag(REPO, BASE), head.transfer, stem)
    )
    assert saved.returncode == 0, saved.stderr
    return saved_tar(head, stem)


def copy_to_worker(head: Node, worker: Node) -> subprocess.CompletedProcess[str]:
    return load_from(head, worker, save_on(head))


def test_head_pulls_worker_copies_over_the_fabric_and_both_build(pair):
    head, worker = pair
    tag = image.patched_tag(BASE, SKIP)
    local = image.local_base(REPO, BASE)

    before = head.report(tag)
    assert before.answered and before.base is None and before.patched is None
    pulled = head.sh(imagecopy.pull_command(BASE, local, have_ref=False))
    assert pulled.returncode == 0, pulled.stderr
    mine = head.report(tag)
    assert mine.pulled(BASE) and mine.base is not None and list(mine.base.layers) == LAYERS

    plan = imagecopy.copy_plan(mine, {"worker": worker.report(tag)}, BASE)
    assert plan.missing == ["worker"] and plan.mismatched == []

    loaded = copy_to_worker(head, worker)
    assert loaded.returncode == 0, loaded.stderr
    theirs = worker.report(tag)
    assert theirs.base is not None and not theirs.pulled(BASE)  # no RepoDigests after load
    assert theirs.base.layers == mine.base.layers and theirs.base.id != mine.base.id
    assert theirs.base_ok(BASE, mine.layers(BASE))
    assert theirs.tags == (local,)  # the transfer tag is gone
    assert imagecopy.copy_plan(mine, {"worker": theirs}, BASE).missing == []
    assert not any(c.startswith("pull") for c in worker.docker_calls())
    assert not os.listdir(worker.transfer)  # tar and layer list removed after the load

    for node in (head, worker):
        built = node.build(tag)
        assert built.returncode == 0, built.stderr + built.stdout
        assert "sm121-topk: skipped" in built.stdout
        report = node.report(tag)
        assert report.patched is not None
        assert f"{REPO}:{tag}" in report.tags
        assert not Path(node.build_dir).exists()
        build = [c for c in node.docker_calls() if c.startswith("build ")]
        assert build and f"BASE={local}" in build[0] and "--network none" in build[0]

    # pruning keeps the serving image and its base, removes an older build
    old = f"{REPO}:h00000000000000000000"
    assert head.sh(f"docker tag {local} {old}").returncode == 0
    tags = head.report(tag).tags
    keep = [f"{REPO}:{tag}", local]
    commands = imagebuild.prune_commands(tags, keep)
    assert commands == [f"docker image rm {old} >/dev/null || echo 'kept {old}: still in use' >&2"]
    for c in commands:
        assert head.sh(c).returncode == 0
    assert sorted(head.report(tag).tags) == sorted(keep)
    assert imagebuild.prune_commands(head.report(tag).tags, keep) == []


def test_a_load_whose_layers_differ_from_the_heads_is_refused(pair):
    head, worker = pair
    local = image.local_base(REPO, BASE)
    assert head.sh(imagecopy.pull_command(BASE, local, have_ref=False)).returncode == 0
    saved = save_on(head)
    r = load_from(head, worker, replace(saved, layers="sha256:" + "99" * 32 + ","))
    assert r.returncode == 1
    assert "differ from the head's" in r.stderr
    report = worker.report(image.patched_tag(BASE, SKIP))
    assert report.base is None and report.tags == ()  # neither the base nor the transfer tag


def test_a_tar_whose_digest_differs_is_never_loaded(pair):
    """Tampered on the way (or on the head's disk after the save): refused before docker load."""
    head, worker = pair
    local = image.local_base(REPO, BASE)
    assert head.sh(imagecopy.pull_command(BASE, local, have_ref=False)).returncode == 0
    saved = save_on(head)
    r = load_from(head, worker, replace(saved, sha256="0" * 64))
    assert r.returncode == 1 and "sha256" in r.stderr, r.stderr
    assert not any(c.startswith("load") for c in worker.docker_calls())
    assert not os.listdir(worker.transfer)  # the refused tar is deleted
    assert worker.report(image.patched_tag(BASE, SKIP)).base is None


def test_a_tar_of_another_size_is_never_loaded(pair):
    head, worker = pair
    local = image.local_base(REPO, BASE)
    assert head.sh(imagecopy.pull_command(BASE, local, have_ref=False)).returncode == 0
    saved = save_on(head)
    r = load_from(head, worker, replace(saved, size=saved.size - 1))  # curl stops, or refused
    assert r.returncode != 0
    assert not any(c.startswith("load") for c in worker.docker_calls())


def test_worker_without_the_head_serving_fails_with_a_clear_message(pair):
    _, worker = pair
    local = image.local_base(REPO, BASE)
    saved = imagecopy.SavedTar("0" * 64, 10, "sha256:" + "1" * 64 + ",")
    cmd = imagecopy.load_command(
        f"http://127.0.0.1:{free_port()}", worker.transfer, "x", "r:t", local, saved, PACKAGE
    ).replace("--retry 10", "--retry 0")
    r = worker.sh(cmd)
    assert r.returncode == 1
    assert "not under --limit worker" in r.stderr


def test_build_without_the_local_base_fails_before_docker_build(pair):
    head, _ = pair
    r = head.build(image.patched_tag(BASE, SKIP))
    assert r.returncode == 1
    assert "is not on this node" in r.stderr
    assert not any(c.startswith("build ") for c in head.docker_calls())


def pulled_head(tmp_path: Path, indexer: str | None) -> Node:
    """A head that pulled a base whose vllm holds ``indexer`` as the indexer file (None: none)."""
    head, _ = make_pair(tmp_path, None if indexer is None else {TARGET: indexer})
    assert (
        head.sh(imagecopy.pull_command(BASE, image.local_base(REPO, BASE), False)).returncode == 0
    )
    return head


def test_the_build_makes_the_sm121_fix_from_the_base_images_own_file(tmp_path):
    head = pulled_head(tmp_path, BASE_FILE)
    tag = image.patched_tag(BASE)
    r = head.build(tag, skip=[])
    assert r.returncode == 0, r.stderr
    assert "sm121-topk: applied" in r.stdout
    assert head.files_of(f"{REPO}:{tag}") == {TARGET: SM121_FILE}
    assert head.files_of(image.local_base(REPO, BASE)) == {TARGET: BASE_FILE}  # base untouched


@pytest.mark.parametrize(
    ("indexer", "says"),
    [
        (None, "no such file"),
        (BASE_FILE.replace("select_k in (512, 1024, 2048):", "select_k in (512, 1024):"),
         "found 0 times"),
        (BASE_FILE + BASE_FILE, "found 2 times"),
    ],
    ids=["no-vllm-file", "anchor-missing", "anchors-doubled"],
)  # fmt: skip
def test_the_build_stops_naming_file_and_image_when_the_fix_does_not_fit(tmp_path, indexer, says):
    head = pulled_head(tmp_path, indexer)
    tag = image.patched_tag(BASE)
    r = head.build(tag, skip=[])
    assert r.returncode == 1
    local = image.local_base(REPO, BASE)
    assert f"{TARGET} of image {local}: " in r.stderr and says in r.stderr
    assert f"refusing to build a half-patched image from {local}" in r.stderr
    assert f"{REPO}:{tag}" not in head.sh(f"docker image ls {REPO}").stdout


def test_the_state_read_is_two_docker_calls_and_tells_images_apart_by_their_whole_tag(pair):
    """One inspect of the three references and one image ls (each docker start costs seconds
    under TCG); an image whose tag only begins with the wanted one is not the wanted one."""
    head, _ = pair
    tag = image.patched_tag(BASE, SKIP)
    local = image.local_base(REPO, BASE)
    assert head.sh(imagecopy.pull_command(BASE, local, have_ref=False)).returncode == 0
    assert head.sh(f"docker tag {local} {REPO}:{tag}0").returncode == 0  # a longer tag
    calls = len(head.docker_calls())
    report = head.report(tag)
    assert len(head.docker_calls()) - calls == 2, head.docker_calls()[calls:]
    assert report.patched is None and report.pulled(BASE)
    assert head.sh(f"docker tag {local} {REPO}:{tag}").returncode == 0
    assert head.report(tag).patched is not None
