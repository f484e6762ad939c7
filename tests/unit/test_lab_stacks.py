"""The lab's stacks without the lab: one stand-in image per engine flavour (lab/image.py), a small
model and drafter per stack on the fake Hub (lab/fakehub.py), and the state -> inventory mapping
(`stack_pins` for every stack; a lab from before the stacks keeps its top-level pins)."""

from __future__ import annotations

import gzip
import io
import json
import runpy
import shutil
import tarfile
from pathlib import Path
from typing import Any

import pytest

from lab import fakehub, image
from lab.__main__ import PIN_KEYS, repos_to_lock, stack_pins

REPO = Path(__file__).resolve().parents[2]
STACKS = ("vllm-nvfp4", "entrpi-exl3", "sfxnz-v13", "tensorfold", "tensorfold-ring")


def fake_base(tmp: Path) -> Path:
    """A guest image cache dir whose rootfs has no packages: the layer holds /opt/standin only."""
    base = tmp / "0123456789abcdef"
    (base / "rootfs/var/lib/dpkg").mkdir(parents=True)
    (base / "rootfs/var/lib/dpkg/status").write_text("")
    return base


def blob(registry_root: Path, digest: str) -> bytes:
    return (registry_root / "blobs" / digest).read_bytes()


def image_of(registry_root: Path, ref: str) -> tuple[dict[str, Any], list[str]]:
    """(config, files of its one layer) of "<registry>/glm53-standin@sha256:..."."""
    digest = ref.split("@", 1)[1]
    manifest = json.loads((registry_root / "manifests" / image.IMAGE_NAME / digest).read_text())
    config = json.loads(blob(registry_root, manifest["config"]["digest"]))
    layer = gzip.decompress(blob(registry_root, manifest["layers"][0]["digest"]))
    with tarfile.open(fileobj=io.BytesIO(layer)) as tar:
        names = tar.getnames()
    return config, names


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("lab")
    image.build_standin(fake_base(tmp), tmp / "registry")
    return tmp / "registry", image.standin_refs("203.0.113.1:5000", tmp / "registry")


def test_each_stack_runs_its_engines_flavour_baked_into_its_image(
    registry: tuple[Path, dict[str, Any]],
) -> None:
    root, refs = registry
    assert set(refs["stack_images"]) == set(STACKS)
    want = {"vllm-nvfp4": "vllm-0.33", "entrpi-exl3": "entrpi-fork", "sfxnz-v13": "sfxnz-v13",
            "tensorfold": "tensorfold-0.6", "tensorfold-ring": "tensorfold-tp4"}  # fmt: skip
    for stack, ref in refs["stack_images"].items():
        config, files = image_of(root, ref)
        assert f"SPARKRIG_STANDIN_ENGINE={want[stack]}" in config["config"]["Env"], stack
        for shipped in (
            "standin_vllm.py",
            "standin_flavour.py",
            "vllm-flags.txt",
            "vllm-values.txt",
            "flavours/entrpi-fork.txt",
            "flavours/sfxnz-v13.txt",
            "standin_tensorfold.py",
            "tensorfold-flags.txt",
        ):
            assert f"opt/standin/{shipped}" in files, (stack, shipped)  # fmt: skip
    # the default stack's stand-in is the lab's image of old, and every flavour is its own image
    assert refs["stack_images"]["vllm-nvfp4"] == refs["image"]
    assert len(set(refs["standin_images"].values())) == len(image.FLAVOURS)
    config, _ = image_of(root, refs["image_never_ready"])
    assert "SPARKRIG_STANDIN_ENGINE=never-ready" in config["config"]["Env"]
    config, _ = image_of(root, refs["image_failing"])  # the variants stay stock 0.33
    assert {"SPARKRIG_STANDIN_ENGINE=vllm-0.33", "STANDIN_FAIL_GATES=math"} <= set(
        config["config"]["Env"]
    )


def test_the_images_are_deterministic(
    registry: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    image.build_standin(fake_base(tmp_path), tmp_path / "registry")
    assert image.standin_refs("203.0.113.1:5000", tmp_path / "registry") == registry[1]


def test_the_fake_hub_has_a_model_and_drafter_per_stack(tmp_path: Path) -> None:
    pins = fakehub.generate_stack_repos(str(tmp_path / "a"))
    assert set(pins) == set(STACKS)
    # vllm-nvfp4 keeps the standard pair, same commits as before the stacks
    standard = fakehub.generate_repos(str(tmp_path / "b"))
    assert pins["vllm-nvfp4"] == {
        "model_repo": fakehub.MODEL_REPO, "model_revision": standard[fakehub.MODEL_REPO],
        "drafter_repo": fakehub.DRAFTER_REPO, "drafter_revision": standard[fakehub.DRAFTER_REPO],
    }  # fmt: skip
    repos = [p[k] for p in pins.values() for k in ("model_repo", "drafter_repo")]
    assert len({r.split("/")[-1] for r in repos}) == 8  # one lockfile name each
    assert len({p[k] for p in pins.values() for k in ("model_revision", "drafter_revision")}) == 8
    served = fakehub.load_repos(str(tmp_path / "a"))
    for p in pins.values():
        assert served[p["model_repo"]].commit == p["model_revision"]
        assert "config.json" in served[p["model_repo"]].files
    assert fakehub.generate_stack_repos(str(tmp_path / "c")) == pins


DIGEST_CHARS = "abcef"
IMAGES = {
    s: f"203.0.113.1:5000/glm53-standin@sha256:{c * 64}"
    for s, c in zip(STACKS, DIGEST_CHARS, strict=True)
}


def repos() -> dict[str, dict[str, str]]:
    return {
        s: {"model_repo": f"t/m-{s}", "model_revision": c * 40, "drafter_repo": f"t/d-{s}",
            "drafter_revision": d * 40}
        for s, c, d in zip(STACKS, "12379", "45680", strict=True)
    }  # fmt: skip


def test_stack_pins_name_every_stacks_image_and_repos() -> None:
    knobs = {"model_repo": "t/m-vllm-nvfp4", "model_revision": "1" * 40, "other": 1}
    pins = stack_pins(IMAGES, repos(), knobs)
    assert set(pins) == set(STACKS)
    for stack in STACKS:
        assert set(pins[stack]) == set(PIN_KEYS)
        assert pins[stack]["base_image"] == IMAGES[stack]
        assert pins[stack]["model_repo"] == f"t/m-{stack}"
    # <hub_root>/knobs.json still decides the default stack's weights
    edited = stack_pins(IMAGES, repos(), {**knobs, "model_revision": "9" * 40})
    assert edited["vllm-nvfp4"]["model_revision"] == "9" * 40
    assert edited["entrpi-exl3"] == pins["entrpi-exl3"]


def test_every_stacks_repos_are_locked_once() -> None:
    state = {"knobs": {"model_repo": "t/m-vllm-nvfp4", "model_revision": "1" * 40,
                       "drafter_repo": "t/d-vllm-nvfp4", "drafter_revision": "4" * 40},
             "stack_pins": stack_pins(IMAGES, repos(), {})}  # fmt: skip
    locked = repos_to_lock(state)
    assert len(locked) == 10 and ("t/m-entrpi-exl3", "2" * 40) in locked
    assert repos_to_lock({"knobs": state["knobs"]}) == sorted(
        [("t/m-vllm-nvfp4", "1" * 40), ("t/d-vllm-nvfp4", "4" * 40)]
    )  # a lab from before the stacks


def state_json(**extra: Any) -> dict[str, Any]:
    host = {"name": "lab-head", "role": "head", "index": 1, "ssh_port": 2221,
            "fabric_interface": "enp1s0f1np1", "fabric_address": "10.200.0.1/24",
            "roce_device": "rxe0", "uplink_interfaces": ["enP7s7", "enP9s9"]}  # fmt: skip
    return {
        "hub_endpoint": "http://203.0.113.1:8080", "image": IMAGES["vllm-nvfp4"],
        "ssh_user": "spark", "ssh_key": "/k", "known_hosts": "/kh", "api_forward_port": 28000,
        "knobs": {**repos()["vllm-nvfp4"], "lockfile_dir": ".lab/locks"},
        "hosts": [host, {**host, "name": "lab-worker1", "role": "worker", "index": 2}],
        **extra,
    }  # fmt: skip


def inventory(tmp_path: Path, state: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """lab/inventory.py as pyinfra loads it, over a temporary .lab/state.json: host -> data."""
    (tmp_path / "lab").mkdir()
    shutil.copy(REPO / "lab" / "inventory.py", tmp_path / "lab" / "inventory.py")
    (tmp_path / ".lab").mkdir()
    (tmp_path / ".lab" / "state.json").write_text(json.dumps(state))
    groups = runpy.run_path(str(tmp_path / "lab" / "inventory.py"))
    return {name: data for group in ("head", "worker") for name, data in groups[group]}


def test_the_inventory_gives_every_stack_its_pins(tmp_path: Path) -> None:
    pins = stack_pins(IMAGES, repos(), repos()["vllm-nvfp4"])
    hosts = inventory(tmp_path, state_json(stack_pins=pins, stack_images=IMAGES))
    for data in hosts.values():
        assert data["stack_pins"] == pins
        # no top-level pin: it would beat stack_pins for whichever stack is selected
        assert not set(PIN_KEYS) & set(data), sorted(set(PIN_KEYS) & set(data))
        assert data["lockfile_dir"] == ".lab/locks" and data["container_memory"] == "1g"


def test_a_lab_from_before_the_stacks_keeps_its_top_level_pins(tmp_path: Path) -> None:
    hosts = inventory(tmp_path, state_json())
    for data in hosts.values():
        assert "stack_pins" not in data
        assert data["base_image"] == IMAGES["vllm-nvfp4"]
        assert data["model_repo"] == "t/m-vllm-nvfp4" and data["model_revision"] == "1" * 40
