"""``sparkhost runtime``: the NCCL library, CUDA runtime and driver a rank's engine really loaded.

    sparkhost runtime --container NAME
        One JSON line: {"processes": N, "nccl": [{"path", "version", "build_id", "sha256",
        "bytes"}], "cudart": [...], "driver": "580.95.05", "cma_total_kb": 0, "cma_free_kb": 0}.
        Exit 0 when the container's processes were read (an engine that has not loaded NCCL yet
        gives "nccl": []), 1 when the container is not running.

Read from the host, never from the container's environment: an image's NCCL_VERSION is a
build-time breadcrumb that can name another build than the one loaded (vllm-project/vllm#46097),
and two builds of one version differ (pip's nvidia-nccl-cu13 2.28.9, Build ID a7f420a1..., and
DGX OS's libnccl2 2.28.9, c0db9360...: vllm-project/vllm#41725, #42354). What counts is the file
each of the container's processes mapped (``/proc/<pid>/maps``), read through
``/proc/<pid>/root``: its sha256, its ELF build ID and the version string NCCL carries."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import struct
import subprocess
import sys
from collections.abc import Iterable, Sequence
from typing import Any, BinaryIO

LIBRARIES = {"nccl": "libnccl", "cudart": "libcudart"}  # what is read, by the name it maps under
# NCCL's banner, compiled into the library: "NCCL version 2.28.9+cuda13.0"
VERSION_RE = re.compile(rb"NCCL version (\d+\.\d+\.\d+)[^+\x00\s]*\+cuda(\d+\.\d+)")
CUDART_RE = re.compile(r"libcudart\.so\.(\d+(?:\.\d+)*)")
DRIVER_RE = re.compile(r"Kernel Module(?: for \S+)?\s+(\d+\.\d+(?:\.\d+)?)")
CHUNK = 1 << 20
PT_NOTE, NT_GNU_BUILD_ID = 4, 3


def container_pid(name: str) -> int:
    """The host PID of the container's first process (0: not running)."""
    out = subprocess.run(
        ["timeout", "20", "docker", "inspect", "-f", "{{.State.Pid}}", name],
        capture_output=True,
        text=True,
    ).stdout.strip()
    return int(out) if out.isdigit() else 0


def namespace_pids(pid: int, proc: str = "/proc") -> list[int]:
    """Every process in ``pid``'s PID namespace: the container's, whatever their parentage."""
    try:
        ns = os.readlink(f"{proc}/{pid}/ns/pid")
    except OSError:
        return []
    found = []
    for entry in os.listdir(proc):
        if not entry.isdigit():
            continue
        try:
            if os.readlink(f"{proc}/{entry}/ns/pid") == ns:
                found.append(int(entry))
        except OSError:
            continue  # gone, or a kernel thread
    return sorted(found)


def mapped(maps: Iterable[str], stem: str) -> set[str]:
    """The files a process mapped whose name starts with ``stem`` (a maps line's path field)."""
    out = set()
    for line in maps:
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and os.path.basename(fields[5].strip()).startswith(stem):
            out.add(fields[5].strip().removesuffix(" (deleted)"))
    return out


def build_id(f: BinaryIO) -> str:
    """The ELF file's GNU build ID (hex), "" when it has none or is no ELF."""
    f.seek(0)
    ident = f.read(16)
    if ident[:4] != b"\x7fELF" or ident[4] not in (1, 2):
        return ""
    wide, order = ident[4] == 2, "<" if ident[5] == 1 else ">"
    if wide:
        f.seek(0x20)
        (phoff,) = struct.unpack(order + "Q", f.read(8))
        f.seek(0x36)
        phentsize, phnum = struct.unpack(order + "HH", f.read(4))
    else:
        f.seek(0x1C)
        (phoff,) = struct.unpack(order + "I", f.read(4))
        f.seek(0x2A)
        phentsize, phnum = struct.unpack(order + "HH", f.read(4))
    for i in range(phnum):
        f.seek(phoff + i * phentsize)
        header = f.read(phentsize)
        (p_type,) = struct.unpack(order + "I", header[:4])
        if p_type != PT_NOTE:
            continue
        # Elf64_Phdr: p_offset at 8, p_filesz at 32; Elf32_Phdr: at 4 and 16
        word, off_at, size_at = ("Q", 8, 32) if wide else ("I", 4, 16)
        (offset,) = struct.unpack_from(order + word, header, off_at)
        (filesz,) = struct.unpack_from(order + word, header, size_at)
        f.seek(offset)
        notes = f.read(filesz)
        at = 0
        while at + 12 <= len(notes):
            namesz, descsz, kind = struct.unpack(order + "III", notes[at : at + 12])
            name_end = at + 12 + ((namesz + 3) & ~3)
            desc = notes[name_end : name_end + descsz]
            if (
                kind == NT_GNU_BUILD_ID
                and notes[at + 12 : at + 12 + namesz].rstrip(b"\0") == b"GNU"
            ):
                return desc.hex()
            at = name_end + ((descsz + 3) & ~3)
    return ""


def describe(path: str, root: str) -> dict[str, Any]:
    """A mapped library as the host reads it through the process's root: sha256, size, build
    ID, NCCL's own version (and the CUDA it was built for) or libcudart's from its name."""
    out: dict[str, Any] = {"path": path}
    try:
        with open(root + path, "rb") as f:
            digest, size, tail, version = hashlib.sha256(), 0, b"", None
            while chunk := f.read(CHUNK):
                digest.update(chunk)
                size += len(chunk)
                version = version or VERSION_RE.search(tail + chunk)
                tail = chunk[-64:]
            out.update(sha256=digest.hexdigest(), bytes=size, build_id=build_id(f))
    except OSError as err:
        out["error"] = err.strerror or str(err)
        return out
    if version:
        out["version"] = version.group(1).decode()
        out["cuda"] = version.group(2).decode()
    elif m := CUDART_RE.search(os.path.basename(path)):
        out["version"] = m.group(1)
    return out


def driver_version(path: str = "/proc/driver/nvidia/version") -> str:
    try:
        with open(path) as f:
            m = DRIVER_RE.search(f.read())
    except OSError:
        return ""
    return m.group(1) if m else ""


def cma(path: str = "/proc/meminfo") -> dict[str, int]:
    """The kernel's contiguous memory pool (CmaTotal, CmaFree in kB): CmaFree above CmaTotal is
    the kexec-handover tell behind ibv_reg_mr ENOMEM (docs/baseline.md)."""
    out = {}
    try:
        with open(path) as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("CmaTotal", "CmaFree"):
                    out[f"cma_{key[3:].lower()}_kb"] = int(rest.split()[0])
    except (OSError, ValueError, IndexError):
        pass
    return out


def read_runtime(pid: int, proc: str = "/proc") -> dict[str, Any]:
    """What the processes of ``pid``'s container mapped, with the host's driver and CMA."""
    pids = namespace_pids(pid, proc)
    seen: dict[str, dict[str, int]] = {kind: {} for kind in LIBRARIES}
    for p in pids:
        try:
            with open(f"{proc}/{p}/maps") as f:
                lines = f.readlines()
        except OSError:
            continue
        for kind, stem in LIBRARIES.items():
            for path in mapped(lines, stem):
                seen[kind].setdefault(path, p)
    report: dict[str, Any] = {"processes": len(pids)}
    for kind, paths in seen.items():
        report[kind] = [describe(path, f"{proc}/{p}/root") for path, p in sorted(paths.items())]
    report["driver"] = driver_version()
    report.update(cma())
    return report


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="sparkhost runtime", description=__doc__.split("\n")[0])
    ap.add_argument("--container", required=True)
    a = ap.parse_args(argv)
    pid = container_pid(a.container)
    if not pid:
        print(json.dumps({"error": f"container {a.container} is not running"}))
        return 1
    print(json.dumps(read_runtime(pid), sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
