"""The runtime as it loads (files/sparkhost/runtime.py, sparkrig/runtime.py): the NCCL each of a
container's processes mapped, read through /proc from the host (a fake /proc tree here, with a
real ELF file standing in for libnccl), and the head's judgement of the ranks' readings."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from sparkhost import runtime as host_runtime

from sparkrig import runtime

SYSTEM_BUILD = "c0db9360" + "11" * 16
PIP_BUILD = "a7f420a1" + "22" * 16


def some_elf() -> Path:
    """A shared object of this machine with a GNU build ID (any will do)."""
    for candidate in ("/usr/lib/x86_64-linux-gnu/libz.so.1", "/lib/x86_64-linux-gnu/libz.so.1",
                      "/usr/lib/aarch64-linux-gnu/libz.so.1"):  # fmt: skip
        path = Path(candidate).resolve()
        if path.exists() and host_runtime.build_id(path.open("rb")):
            return path
    pytest.fail("no libz with a build ID on this machine (zlib1g is in every Debian)")


def fake_nccl(dest: Path, build: str, version: str = "2.28.9") -> bytes:
    """A libnccl stand-in: a real ELF whose build ID is ``build``, carrying NCCL's banner."""
    src = some_elf()
    data = bytearray(src.read_bytes())
    with src.open("rb") as f:
        old = bytes.fromhex(host_runtime.build_id(f))
    at = data.index(old)
    new = bytes.fromhex(build)[: len(old)].ljust(len(old), b"\0")
    data[at : at + len(old)] = new
    data += f"\0NCCL version {version}+cuda13.0\0".encode()
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_bytes(bytes(data))
    return bytes(data)


def process(proc: Path, pid: int, ns: str, maps: list[str]) -> None:
    (proc / str(pid) / "ns").mkdir(parents=True)
    os.symlink(f"pid:[{ns}]", proc / str(pid) / "ns" / "pid")
    (proc / str(pid) / "maps").write_text("".join(f"{line}\n" for line in maps))


def maps_line(path: str) -> str:
    return f"ffff8000-ffff9000 r-xp 00000000 103:02 1234      {path}"


def test_the_nccl_every_process_of_the_container_mapped_is_read_from_the_host(
    tmp_path: Path,
) -> None:
    proc = tmp_path / "proc"
    lib = "/usr/lib/aarch64-linux-gnu/libnccl.so.2.28.9"
    process(proc, 100, "4026531836", ["0-1 r--p 0 0:0 0 [vdso]"])  # the container's init
    process(proc, 101, "4026531836", [maps_line(lib), maps_line("/usr/lib/libc.so.6")])
    process(proc, 300, "4026531999", [maps_line("/opt/other/libnccl.so.2")])  # another container
    data = fake_nccl(proc / "101" / "root" / lib.lstrip("/"), SYSTEM_BUILD)
    got = host_runtime.read_runtime(100, proc=str(proc))
    assert got["processes"] == 2
    [nccl] = got["nccl"]
    assert nccl["path"] == lib and nccl["version"] == "2.28.9" and nccl["cuda"] == "13.0"
    assert nccl["build_id"].startswith("c0db9360") and nccl["bytes"] == len(data)
    import hashlib

    assert nccl["sha256"] == hashlib.sha256(data).hexdigest()
    assert got["cudart"] == []


def test_the_build_id_of_a_real_library_is_readelfs(tmp_path: Path) -> None:
    import subprocess

    readelf = shutil.which("readelf")
    assert readelf, "readelf (binutils) is missing: scripts/install-deps.sh all installs it"

    src = some_elf()
    said = subprocess.run([readelf, "-n", str(src)], capture_output=True, text=True).stdout
    with src.open("rb") as f:
        assert f"Build ID: {host_runtime.build_id(f)}" in said
    (tmp_path / "not-elf").write_bytes(b"#!/bin/sh\n")
    assert host_runtime.build_id((tmp_path / "not-elf").open("rb")) == ""


def reading(build: str = SYSTEM_BUILD, version: str = "2.28.9", **extra: Any) -> dict[str, Any]:
    lib = {"path": "/usr/lib/aarch64-linux-gnu/libnccl.so.2", "version": version,
           "build_id": build, "sha256": "ab" * 32}  # fmt: skip
    return {"nccl": [lib], "cudart": [], "driver": "580.95.05", **extra}


def test_ranks_on_one_good_build_may_serve() -> None:
    assert runtime.runtime_problems({"a": reading(), "b": reading()}, False) == []


def test_ranks_on_different_builds_are_refused() -> None:
    said = runtime.runtime_problems({"a": reading(), "b": reading("ee" * 20)}, False)
    assert len(said) == 1 and "the ranks loaded different NCCL builds" in said[0]
    assert "a 2.28.9 build c0db9360" in said[0] and "b 2.28.9 build eeeeeeee" in said[0]


def test_the_pip_build_of_2_28_9_is_refused_naming_its_file_and_source() -> None:
    said = runtime.runtime_problems({"a": reading(PIP_BUILD), "b": reading(PIP_BUILD)}, False)
    assert len(said) == 2 and all("known bad" in s for s in said)
    assert "/usr/lib/aarch64-linux-gnu/libnccl.so.2 (Build ID a7f420a1" in said[0]
    assert "vllm-project/vllm#42354" in said[0] and "nccl_known_bad_ok = True" in said[0]
    # the same build ID prefix of another version is not that build
    assert runtime.runtime_problems({"a": reading(PIP_BUILD, "2.30.7")}, False) == []
    # the operator's word: served anyway
    assert runtime.runtime_problems({"a": reading(PIP_BUILD), "b": reading(PIP_BUILD)}, True) == []


def test_a_rank_unread_or_without_nccl_is_refused() -> None:
    said = runtime.runtime_problems(
        {"a": reading(), "b": {"error": "container x is not running"}, "c": {"nccl": []}}, False
    )
    assert said == [
        "b: what its engine loaded could not be read: container x is not running",
        "c: its engine mapped no NCCL library (libnccl*) after the boot",
    ]


def test_the_record_keeps_no_figure_that_moves_between_runs() -> None:
    one = runtime.record_of(reading(cma_total_kb=0, cma_free_kb=100))
    two = runtime.record_of(reading(cma_total_kb=0, cma_free_kb=5))
    assert one == two and one is not None
    assert one["nccl"] == ["2.28.9 build c0db9360 /usr/lib/aarch64-linux-gnu/libnccl.so.2"]
    assert runtime.record_of({"error": "x"}) is None
    assert (
        runtime.runtime_text(one)
        == "nccl 2.28.9 build c0db9360 /usr/lib/aarch64-linux-gnu/libnccl.so.2"
    )


def test_the_job_prints_one_json_line_the_control_side_parses() -> None:
    assert runtime.parse_runtime('noise\n{"nccl": []}\n') == {"nccl": []}
    assert runtime.parse_runtime("Traceback ...")["error"] == "Traceback ..."
