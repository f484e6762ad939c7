"""The image phase through the real CLI on @fake hosts: who pulls, who copies, who builds, in
which order, and that a node holding everything gets no image command."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from sparkrig.image import MARKER, local_base, patched_tag
from tests.image import fakeimage
from tests.plan import fakehosts
from tests.plan.harness import Run, run

INVENTORY = "tests/image/inventory.py"
HEAD, WORKER = "@fake/spark-a", "@fake/spark-b"
BASE = fakehosts.IMAGE
TAG = patched_tag(BASE)
LOCAL = local_base(fakeimage.REPO, BASE)
OPS = [
    "Pull the pinned base image on the head",
    "Serve the base image to the workers over the fabric",
    "Copy the base image from the head over the fabric",
    "Stop serving the base image",
    "Build the patched serving image",
]
IMAGE_VERBS = re.compile(
    r"docker (pull|save|load|tag|build|buildx build|image rm)\b|curl |sparkrig-image-serve|"
    r" imageload "
)


@pytest.fixture(autouse=True)
def _clean_state():
    fakeimage.STATE.clear()
    yield
    fakeimage.STATE.clear()


def apply(monkeypatch, *extra: str) -> Run:
    return run(["-y", *extra, INVENTORY, "deploy.py"], monkeypatch)


def image_commands(r: Run, host: str) -> list[str]:
    return [c for c in r.commands.get(host, []) if MARKER not in c and IMAGE_VERBS.search(c)]


def position(r: Run, name: str) -> int:
    matches = [i for i, op in enumerate(r.op_order) if op.endswith(name)]
    assert matches, f"no operation named {name!r} in {r.op_order}"
    return matches[0]


def set_image_state(**per_host: dict[str, Any]) -> None:
    for short, kwargs in per_host.items():
        fakeimage.STATE[short] = fakeimage.converged_image_state(BASE, **kwargs)


def test_bare_nodes_head_pulls_worker_copies_over_the_fabric_both_build(monkeypatch):
    r = apply(monkeypatch)
    assert r.exit_code == 0, r.output
    assert [position(r, op) for op in OPS] == sorted(position(r, op) for op in OPS)

    head = image_commands(r, HEAD)
    assert any(f"docker pull --quiet {BASE}" in c for c in head)
    # the head records what it pulled (uninstall.py removes every recorded base)
    pull = next(c for c in head if f"docker pull --quiet {BASE}" in c)
    assert f"echo {BASE} >> /etc/sparkrig/pulled-images" in pull
    assert any("docker save" in c and "/var/lib/sparkrig/images/base-" in c for c in head)
    assert any(
        "systemd-run" in c
        and "sparkrig-image-serve" in c
        and "192.168.100.10:29701" in c
        and "--bind-device enp1s0f1np1" in c
        for c in head
    )
    assert any("systemctl stop sparkrig-image-serve" in c for c in head)

    worker = image_commands(r, WORKER)
    assert not any("docker pull" in c for c in r.commands[WORKER])  # never the registry
    assert not any("registry.example" in c for c in worker)
    copy = [c for c in worker if "curl " in c]
    assert copy and "http://192.168.100.10:29701/base-" in copy[0] and " imageload " in copy[0]
    assert f"--sha256 {'c' * 64} --size 123456" in copy[0]  # the head's record, read over SSH

    for host in (HEAD, WORKER):
        builds = [c for c in image_commands(r, host) if "docker build" in c]
        assert builds and f"-t {fakeimage.REPO}:{TAG}" in builds[0]
        assert f"--build-arg BASE={LOCAL}" in builds[0]
        assert "/opt/sparkrig/image-build/context.tar" in r.uploads[host]
    assert [op for op in r.changed_ops[WORKER] if "image.py" in op] == [
        f"tasks/image.py | {OPS[2]}",
        f"tasks/image.py | {OPS[4]}",
    ]


def test_nodes_holding_the_images_get_no_image_command(monkeypatch):
    set_image_state(**{"spark-a": {}, "spark-b": {"pulled": False}})
    r = apply(monkeypatch)
    assert r.exit_code == 0, r.output
    for host in (HEAD, WORKER):
        assert image_commands(r, host) == []
        assert not [op for op in r.changed_ops.get(host, []) if "image.py" in op]
        assert "/opt/sparkrig/image-build/context.tar" not in r.uploads.get(host, {})


def test_fully_converged_nodes_change_nothing(monkeypatch):
    for name, s in fakehosts.settings_of(INVENTORY).items():  # rendered, never a run's uploads
        fakeimage.STATE[name.split("/")[1]] = fakehosts.converged(s)
    second = apply(monkeypatch)
    assert second.exit_code == 0, second.output
    assert second.changed_ops == {}, second.changed_ops
    assert second.uploads == {}


def test_build_happens_only_where_the_tag_is_absent(monkeypatch):
    set_image_state(**{"spark-a": {}, "spark-b": {"pulled": False, "patched": False}})
    r = apply(monkeypatch)
    assert r.exit_code == 0, r.output
    assert image_commands(r, HEAD) == []
    worker = image_commands(r, WORKER)
    assert len(worker) == 1 and "docker build" in worker[0]  # no copy: the base is there


def test_head_with_the_base_serves_a_worker_without_it_and_does_not_pull(monkeypatch):
    set_image_state(**{"spark-a": {}, "spark-b": {"base": False, "patched": False}})
    r = apply(monkeypatch)
    assert r.exit_code == 0, r.output
    head = image_commands(r, HEAD)
    assert not any("docker pull" in c for c in head) and not any("docker build" in c for c in head)
    assert any("docker save" in c for c in head)
    worker = image_commands(r, WORKER)
    assert any(" imageload " in c for c in worker) and any("docker build" in c for c in worker)


def test_worker_base_with_other_layers_stops_the_run_with_the_fix(monkeypatch):
    odd = ("sha256:" + "99" * 32,)
    set_image_state(**{"spark-a": {}, "spark-b": {"pulled": False, "layers": odd}})
    r = apply(monkeypatch)
    assert r.exit_code != 0
    failed = [c for c in r.commands[HEAD] if c.endswith(">&2; exit 1")]
    assert failed and "spark-b" in failed[0] and f"docker image rm {LOCAL}" in failed[0]
    assert not any("docker build" in c for c in image_commands(r, WORKER))


def test_dry_run_says_what_would_be_pulled_copied_and_built(monkeypatch):
    r = run(["--dry", INVENTORY, "deploy.py"], monkeypatch)
    assert r.exit_code == 0, r.output
    assert f"will pull {BASE} from its registry" in r.output
    assert "will copy it from the head over the fabric (http://192.168.100.10:29701)" in r.output
    assert f"will build {fakeimage.REPO}:{TAG}" in r.output
    for host in (HEAD, WORKER):
        assert image_commands(r, host) == []  # facts only
    assert f"tasks/image.py | {OPS[0]}" not in r.changed_ops.get(WORKER, [])
    assert f"tasks/image.py | {OPS[2]}" not in r.changed_ops.get(HEAD, [])


def test_limit_worker_never_touches_the_head(monkeypatch):
    set_image_state(**{"spark-b": {"pulled": False, "patched": False}})
    # the worker holds its weights (without the head in the run nothing could copy them)
    complete = {"ok": True, "commit": fakehosts.COMMIT, "total_files": 2, "verified": 2,
                "files_to_fetch": 0}  # fmt: skip
    fakeimage.STATE["spark-b"][fakehosts.WEIGHTS_STATE] = json.dumps(complete)
    r = apply(monkeypatch, "--limit", "worker")
    assert r.exit_code == 0, r.output
    assert r.commands.get(HEAD, []) == []
    assert any("docker build" in c for c in image_commands(r, WORKER))


def test_a_stack_without_the_patch_layer_pulls_by_digest_and_builds_nothing(monkeypatch):
    """``Stack.patched`` False: the head pulls the image by digest and the workers copy it as
    before, nothing is built anywhere, and every rank runs the pulled image's local tag."""
    from sparkrig.stacks.vllm_nvfp4 import STACK as NVFP4
    from tests import teststacks

    weights = {"model": NVFP4.model, "drafter": NVFP4.drafter}  # tests/plan/locks
    teststacks.register(monkeypatch, "test-bare", patched=False, **weights)
    r = apply(monkeypatch, "--data", "stack=test-bare")
    assert r.exit_code == 0, r.output
    assert any(f"docker pull --quiet {BASE}" in c for c in image_commands(r, HEAD))
    assert any("curl " in c and " imageload " in c for c in image_commands(r, WORKER))
    for host, unit in ((HEAD, "sparkrig-head"), (WORKER, "sparkrig-worker")):
        assert not [c for c in image_commands(r, host) if "docker build" in c]
        assert "/opt/sparkrig/image-build/context.tar" not in r.uploads[host]
        assert not [op for op in r.host_ops[host] if op.endswith(OPS[4])]
        text = r.uploads[host][f"/etc/systemd/system/{unit}.service"].decode()
        assert f"# image: {LOCAL}\n" in text and f"    {LOCAL} \\\n" in text
