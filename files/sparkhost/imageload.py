"""``sparkhost imageload``: check a base-image tar copied from the head, then ``docker load`` it.

The tar crosses the fabric over plain HTTP; what it must be does not: the deploy reads the head's
``docker save`` digest, size and layer list over SSH and hands them here as arguments. The tar is
refused BEFORE ``docker load`` when its size is not the one handed over or above ``--max-bytes``,
or when its sha256 differs; after the load, the image's ``RootFS.Layers`` must be the head's,
else the transfer tag is removed. Only then does it get the local base name. A refused tar is
deleted. Exit 0 loaded and tagged, 1 refused (the reason on stderr), 2 usage."""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
from collections.abc import Callable, Sequence

EXIT_OK, EXIT_REFUSED, EXIT_USAGE = 0, 1, 2
MAX_BYTES = 256 * 1024**3  # no serving image comes near this; a bigger tar is not the head's
CHUNK = 8 * 1024**2

Runner = Callable[[Sequence[str]], "subprocess.CompletedProcess[str]"]


def run(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, check=False)


class Refused(Exception):
    """The tar (or the image loaded from it) is not the head's."""


def sha256_of(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def check_tar(path: str, size: int, sha256: str, max_bytes: int = MAX_BYTES) -> None:
    """Raise Refused unless ``path`` is ``size`` bytes (at most ``max_bytes``) with ``sha256``;
    the size first, so a huge or truncated file is never hashed."""
    if size > max_bytes:
        raise Refused(f"the head's tar is {size} bytes, above the cap of {max_bytes}")
    have = os.stat(path).st_size
    if have != size:
        raise Refused(f"{path} is {have} bytes, the head saved {size}")
    got = sha256_of(path)
    if got != sha256:
        raise Refused(f"{path} has sha256 {got}, the head saved {sha256}")


def layers_of(ref: str, runner: Runner = run) -> str:
    fmt = "{{range .RootFS.Layers}}{{.}},{{end}}"
    r = runner(["docker", "image", "inspect", "--format", fmt, ref])
    return r.stdout.strip() if r.returncode == 0 else ""


def load(
    tar: str,
    size: int,
    sha256: str,
    layers: str,
    transfer: str,
    local: str,
    max_bytes: int = MAX_BYTES,
    runner: Runner = run,
) -> None:
    """Check, load, compare the layers, tag: Refused (and the tar removed) on any mismatch."""
    try:
        check_tar(tar, size, sha256, max_bytes)
        loaded = runner(["docker", "load", "--quiet", "-i", tar])
        if loaded.returncode != 0:
            raise Refused(f"docker load failed: {loaded.stderr.strip()}")
    finally:
        try:
            os.unlink(tar)
        except OSError:
            pass
    have = layers_of(transfer, runner)
    if not layers or have != layers:
        runner(["docker", "image", "rm", transfer])
        raise Refused(f"base image layers after load ({have}) differ from the head's ({layers})")
    if runner(["docker", "tag", transfer, local]).returncode != 0:
        raise Refused(f"docker tag {transfer} {local} failed")
    runner(["docker", "image", "rm", transfer])


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sparkhost imageload", description=__doc__.split("\n")[0])
    p.add_argument("--tar", required=True, help="the downloaded tar (removed after)")
    p.add_argument("--sha256", required=True, help="the head's tar digest (handed over SSH)")
    p.add_argument("--size", required=True, type=int, help="the head's tar size in bytes")
    p.add_argument("--layers", required=True, help="the head's RootFS.Layers, comma-terminated")
    p.add_argument("--transfer", required=True, help="the tag the tar carries")
    p.add_argument("--local", required=True, help="the local base name, given once checked")
    p.add_argument("--max-bytes", type=int, default=MAX_BYTES, help="refuse a bigger tar")
    return p


def main(argv: list[str] | None = None) -> int:
    try:
        a = build_parser().parse_args(argv)
    except SystemExit as done:  # --help: 0; a usage error: 2
        return EXIT_OK if done.code == 0 else EXIT_USAGE
    if len(a.sha256) != 64 or any(c not in "0123456789abcdef" for c in a.sha256):
        print("sparkhost imageload: --sha256 wants 64 lowercase hex digits", file=sys.stderr)
        return EXIT_USAGE
    try:
        load(a.tar, a.size, a.sha256, a.layers, a.transfer, a.local, a.max_bytes)
    except (Refused, OSError) as err:
        print(f"sparkhost imageload: refused: {err}", file=sys.stderr)
        return EXIT_REFUSED
    return EXIT_OK
