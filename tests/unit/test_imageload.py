"""``sparkhost imageload`` (issue 35 item 4): the copied base-image tar is checked against what
the head saved (size cap, exact size, sha256) BEFORE ``docker load``, its layers after."""

from __future__ import annotations

import hashlib
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest
from sparkhost import imageload

LAYERS = "sha256:" + "1" * 64 + ","


class Docker:
    """A docker CLI that records its calls; the loaded image has ``layers``."""

    def __init__(self, layers: str = LAYERS) -> None:
        self.calls: list[list[str]] = []
        self.layers = layers

    def __call__(self, argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        self.calls.append(list(argv))
        out = self.layers if argv[1:3] == ["image", "inspect"] else ""
        return subprocess.CompletedProcess(list(argv), 0, out, "")

    def loaded(self) -> bool:
        return any(c[1] == "load" for c in self.calls)


def tar(tmp_path: Path, data: bytes = b"tar bytes") -> tuple[str, int, str]:
    path = tmp_path / "base.tar.part"
    path.write_bytes(data)
    return str(path), len(data), hashlib.sha256(data).hexdigest()


def test_a_checked_tar_is_loaded_tagged_and_removed(tmp_path):
    path, size, sha = tar(tmp_path)
    docker = Docker()
    imageload.load(path, size, sha, LAYERS, "r:transfer", "r:base", runner=docker)
    assert docker.loaded()
    assert ["docker", "tag", "r:transfer", "r:base"] in docker.calls
    assert not Path(path).exists()


@pytest.mark.parametrize(
    ("size_delta", "sha", "cap", "why"),
    [
        (0, "0" * 64, None, "sha256"),  # tampered bytes
        (1, None, None, "bytes, the head saved"),  # truncated or padded
        (0, None, 4, "above the cap"),  # bigger than the cap: never hashed
    ],
)
def test_a_tar_that_is_not_the_heads_is_never_loaded(tmp_path, size_delta, sha, cap, why):
    path, size, good = tar(tmp_path)
    docker = Docker()
    with pytest.raises(imageload.Refused, match=why):
        imageload.load(
            path, size + size_delta, sha or good, LAYERS, "r:t", "r:b",
            max_bytes=cap or imageload.MAX_BYTES, runner=docker,
        )  # fmt: skip
    assert not docker.loaded() and docker.calls == []
    assert not Path(path).exists()  # a refused tar is deleted


def test_layers_that_differ_after_the_load_remove_the_transfer_tag(tmp_path):
    path, size, sha = tar(tmp_path)
    docker = Docker(layers="sha256:" + "9" * 64 + ",")
    with pytest.raises(imageload.Refused, match="differ from the head's"):
        imageload.load(path, size, sha, LAYERS, "r:t", "r:b", runner=docker)
    assert ["docker", "image", "rm", "r:t"] in docker.calls
    assert not [c for c in docker.calls if c[1] == "tag"]


def test_main_refuses_a_malformed_digest(tmp_path, capsys):
    path, size, _ = tar(tmp_path)
    argv = ["--tar", path, "--sha256", "XYZ", "--size", str(size), "--layers", LAYERS,
            "--transfer", "r:t", "--local", "r:b"]  # fmt: skip
    assert imageload.main(argv) == imageload.EXIT_USAGE
    assert "64 lowercase hex" in capsys.readouterr().err
