"""Guest base image (cached by recipe hash) and the stand-in serving image for the lab registry."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import re
import shutil
import struct
import subprocess
import tarfile
import time
from pathlib import Path
from typing import Any

from lab import CACHE_DIR, LAB_DIR

RECIPE = LAB_DIR / "build-image.sh"
STANDIN_SRC = LAB_DIR / "standin_vllm.py"
# shipped beside it in /opt/standin: its timed engine, its flavours and their flag lists (the
# pinned vLLM's serve flags and config values; each flavour file adds what its engine has more)
STANDIN_FILES = [
    LAB_DIR / "standin_engine.py",
    LAB_DIR / "standin_flavour.py",
    LAB_DIR / "standin_tensorfold.py",
    LAB_DIR / "tensorfold-flags.txt",
    LAB_DIR / "vllm-flags.txt",
    LAB_DIR / "vllm-values.txt",
    *sorted((LAB_DIR / "flavours").glob("*.txt")),
]
IMAGE_NAME = "glm53-standin"
IMAGE_TAG = "lab"
FAILING_TAG = "lab-failing"  # the same stand-in whose math gate fails (an upgrade that rolls back)
FAILING_ENV = "STANDIN_FAIL_GATES=math"
SLOW_TAG = "lab-slow"  # the same stand-in, decode and prefill 30% slower (a bench gate refuses)
SLOW_ENV = "STANDIN_SPEED=0.7"
# the same stand-in whose engine maps pip's nvidia-nccl-cu13 2.28.9 build (a release refuses it:
# sparkrig/runtime.py KNOWN_BAD); the others map one with DGX OS's libnccl2 2.28.9 build ID
BAD_NCCL_TAG = "lab-bad-nccl"
BAD_NCCL_ENV = "STANDIN_NCCL=pip"
# the same stand-in, wedged after a dozen completions: past the gates, inside the soak gate's load
WEDGE_SOAK_TAG = "lab-wedge-soak"
WEDGE_SOAK_ENV = ["STANDIN_MODE=wedged", "STANDIN_WEDGE_AFTER=12"]
# The fake NCCL libraries: a minimal ELF whose GNU build ID begins as each build's does
# (vllm-project/vllm#41725 gives the prefixes), with NCCL's version banner after it
FAKE_NCCL = {
    "system": ("usr/lib/aarch64-linux-gnu/libnccl.so.2.28.9", "c0db9360"),
    "pip": ("usr/local/lib/python3.12/dist-packages/nvidia/nccl/lib/libnccl.so.2", "a7f420a1"),
}
# The engine flavour each image answers as (lab/standin_flavour.py), baked into its config. The
# images above are stock vLLM 0.33 (the vllm-nvfp4 stack's engine); one more image per flavour
# (tag "flavour-<name>"), the same layer with only the flavour set.
FLAVOUR_ENV = "SPARKRIG_STANDIN_ENGINE"
STOCK_FLAVOUR = "vllm-0.33"
FLAVOURS = (
    "vllm-0.33", "entrpi-fork", "sfxnz-v13", "never-ready", "tensorfold-0.6", "tensorfold-tp4"
)  # fmt: skip
# the engine each stack runs (docs/stacks-facts.md): its stand-in image in the lab's stack_pins
STACK_FLAVOURS = {
    "vllm-nvfp4": "vllm-0.33",
    "entrpi-exl3": "entrpi-fork",
    "sfxnz-v13": "sfxnz-v13",
    "tensorfold": "tensorfold-0.6",
    "tensorfold-ring": "tensorfold-tp4",
}
# every variant prefills at a real pair's long-prompt rate: "Prefill is flat at 1,391-1,510 tok/s
# all the way to 200K ... a 200K token prompt, the first character takes 139.2 seconds" (seed 000,
# Classmethod's two-Spark GLM-5.3-Flash measurements). A 200K-token prompt then holds the head
# longer than the lab's watchdog_stall_s, as on a pair (tests/lab: a long prefill is no wedge).
PREFILL_ENV = "STANDIN_PREFILL_TOK_S=1450"
# what the stand-in image holds: python3 and what it needs at run time, plus a shell
STANDIN_ROOTS = [
    "python3",
    "bash",
    "dash",
    "coreutils",
    "base-files",
    "netbase",
    "ca-certificates",
]
PLACEHOLDER = '''"""Placeholder until lab/standin_vllm.py exists: --help and /health only."""
import http.server
import sys

if "--help" in sys.argv or len(sys.argv) < 2:
    print("usage: vllm serve MODEL [options] (lab stand-in placeholder)")
    sys.exit(0)
port = int(sys.argv[sys.argv.index("--port") + 1]) if "--port" in sys.argv else 8000


class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()


http.server.ThreadingHTTPServer(("0.0.0.0", port), H).serve_forever()
'''


def recipe_hash() -> str:
    return hashlib.sha256(RECIPE.read_bytes()).hexdigest()[:16]


def base_dir() -> Path:
    return CACHE_DIR / recipe_hash()


def ensure_base() -> Path:
    """Return the cache dir with base.qcow2, vmlinuz, initrd.img; build it if the recipe changed."""
    out = base_dir()
    if (out / "done").exists():
        print(f"base image: cached {out}", flush=True)
        return out
    print(f"base image: building {out} (debootstrap + packages, ~3 min)", flush=True)
    start = time.monotonic()
    out.mkdir(parents=True, exist_ok=True)
    log = out / "build.log"
    with open(log, "w") as f:
        rc = subprocess.run(["bash", str(RECIPE), str(out)], stdout=f, stderr=subprocess.STDOUT)
    if rc.returncode != 0:
        raise SystemExit(f"base image build failed (rc {rc.returncode}); see {log}")
    took = time.monotonic() - start
    (out / "done").write_text(f"{took:.0f}\n")
    for old in CACHE_DIR.iterdir():  # images of older recipes
        if old.is_dir() and old != out and re.fullmatch(r"[0-9a-f]{16}", old.name):
            shutil.rmtree(old, ignore_errors=True)
    print(f"base image: built in {took:.0f} s", flush=True)
    return out


# --- stand-in serving image ---------------------------------------------------------------------


def _dpkg_status(rootfs: Path) -> dict[str, dict[str, str]]:
    pkgs: dict[str, dict[str, str]] = {}
    for para in (rootfs / "var/lib/dpkg/status").read_text().split("\n\n"):
        fields: dict[str, str] = {}
        key = ""
        for line in para.splitlines():
            if line.startswith((" ", "\t")) and key:
                fields[key] += "\n" + line
            elif ":" in line:
                key, _, val = line.partition(":")
                fields[key] = val.strip()
        if "installed" in fields.get("Status", "") and "Package" in fields:
            pkgs[fields["Package"]] = fields
    return pkgs


def _closure(rootfs: Path, roots: list[str]) -> list[str]:
    """Installed packages needed by roots (Depends + Pre-Depends, alternatives, Provides)."""
    pkgs = _dpkg_status(rootfs)
    provides: dict[str, str] = {}
    for name, f in pkgs.items():
        for p in f.get("Provides", "").split(","):
            if p.strip():
                provides.setdefault(re.split(r"[\s(:]", p.strip())[0], name)
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name in seen or name not in pkgs:
            continue
        seen.add(name)
        deps = ",".join(pkgs[name].get(k, "") for k in ("Pre-Depends", "Depends"))
        for dep in deps.split(","):
            for alt in dep.split("|"):
                cand = re.split(r"[\s(:]", alt.strip())[0]
                cand = cand if cand in pkgs else provides.get(cand, "")
                if cand:
                    todo.append(cand)
                    break
    return sorted(seen)


def _layer_paths(rootfs: Path, packages: list[str]) -> list[str]:
    info = rootfs / "var/lib/dpkg/info"
    paths = {
        "/bin",
        "/sbin",
        "/lib",
        "/lib64",
        "/etc/passwd",
        "/etc/group",
        "/etc/ld.so.cache",
        "/etc/nsswitch.conf",
        "/tmp",
        "/root",
        "/var/tmp",
    }
    for pkg in packages:
        for lst in (info / f"{pkg}.list", info / f"{pkg}:amd64.list"):
            if lst.exists():
                paths.update(p for p in lst.read_text().splitlines() if p and p != "/.")
    skip = ("/usr/share/doc/", "/usr/share/man/", "/usr/share/locale/", "/usr/share/info/")
    keep = [p for p in paths if not p.startswith(skip) and os.path.lexists(rootfs / p[1:])]
    # parents first, so directories exist before their entries
    full: set[str] = set()
    for p in keep:
        full.add(p)
        parent = os.path.dirname(p)
        while parent not in ("/", ""):
            full.add(parent)
            parent = os.path.dirname(parent)
    return sorted(full)


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes, mode: int) -> None:
    ti = tarfile.TarInfo(name)
    ti.size, ti.mode, ti.mtime = len(data), mode, 0
    tar.addfile(ti, io.BytesIO(data))


def standin_files() -> dict[str, bytes]:
    """What /opt/standin holds: path in the image -> bytes."""
    src = STANDIN_SRC.read_bytes() if STANDIN_SRC.exists() else PLACEHOLDER.encode()
    files = {"opt/standin/standin_vllm.py": src}
    for path in STANDIN_FILES:
        files[f"opt/standin/{path.relative_to(LAB_DIR).as_posix()}"] = path.read_bytes()
    return files


def minimal_elf(build_id: bytes, payload: bytes) -> bytes:
    """An ELF64 little-endian shared object with one PT_NOTE program header holding a GNU
    build-ID note (namesz 4, descsz 20, type 3, "GNU"), then ``payload``: what ``readelf -n``
    and the runtime reader read, nothing to run (the stand-in maps it, it never loads it)."""
    note = struct.pack("<III", 4, len(build_id), 3) + b"GNU\0" + build_id
    ehsize, phentsize = 64, 56
    header = (
        b"\x7fELF" + bytes([2, 1, 1, 0]) + bytes(8)  # 64-bit, little-endian, version 1
        + struct.pack("<HHIQQQIHHHHHH", 3, 183, 1, 0, ehsize, 0, 0, ehsize, phentsize, 1, 0, 0, 0)
    )  # fmt: skip
    offset = ehsize + phentsize
    phdr = struct.pack("<IIQQQQQQ", 4, 4, offset, 0, 0, len(note), len(note), 4)
    return header + phdr + note + payload


def fake_nccl_files(rootfs: Path) -> dict[str, bytes]:
    """/opt/standin/nccl/<build>/<its path's name>: a minimal ELF whose build ID carries that
    build's prefix, with "NCCL version 2.28.9+cuda13.0" (what the runtime reader looks for).
    ``rootfs`` is not read: the files are the same whatever the guest."""
    out = {}
    for build, (path, prefix) in FAKE_NCCL.items():
        build_id = bytes.fromhex(prefix) + hashlib.sha256(build.encode()).digest()[:16]
        data = minimal_elf(build_id, b"\0NCCL version 2.28.9+cuda13.0\0")
        out[f"opt/standin/nccl/{build}/{Path(path).name}"] = data
    return out


def build_standin(base: Path, registry_root: Path) -> str:
    """Write the stand-in images into registry_root; return the stock image's manifest digest
    ("sha256:..."); the others' by tag_digest().

    The layer is python3 (+ stdlib and libs) from the guest rootfs, /opt/standin/ (the stand-in,
    its engine, its flavours) and a /usr/local/bin/vllm wrapper. Deterministic: same inputs, same
    digests."""
    rootfs = base / "rootfs"
    files = {**standin_files(), **fake_nccl_files(rootfs)}
    key_src = hashlib.sha256(base.name.encode() + Path(__file__).read_bytes())
    for name, data in sorted(files.items()):
        key_src.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
    key = key_src.hexdigest()[:16]
    cache = base / f"standin-{key}"
    if not (cache / "digest").exists():
        print("stand-in image: building layer", flush=True)
        _build_layer(rootfs, files, cache)
    if registry_root.exists():
        shutil.rmtree(registry_root)
    shutil.copytree(cache / "registry", registry_root)
    digest = (cache / "digest").read_text().strip()
    print(f"stand-in image: {IMAGE_NAME}@{digest}", flush=True)
    return digest


def tag_digest(registry_root: Path, tag: str) -> str:
    """The manifest digest of one of the stand-in's tags (FAILING_TAG: its math gate fails;
    SLOW_TAG: STANDIN_SPEED=0.7; flavour_tag(name)), in the registry build_standin wrote."""
    ref = registry_root / "manifests" / IMAGE_NAME / f"{tag}.digest"
    return ref.read_text().strip()


def flavour_tag(flavour: str) -> str:
    return f"flavour-{flavour}"


def standin_refs(registry: str, registry_root: Path) -> dict[str, Any]:
    """The lab state's image keys, each "<registry>/glm53-standin@sha256:...": ``image`` (stock
    vLLM 0.33), ``image_failing``, ``image_slow``, ``standin_images`` {flavour: ref},
    ``stack_images`` {stack: its engine flavour's ref} and ``image_never_ready``."""

    def ref(tag: str) -> str:
        return f"{registry}/{IMAGE_NAME}@{tag_digest(registry_root, tag)}"

    flavours = {f: ref(flavour_tag(f)) for f in FLAVOURS}
    return {
        "image": ref(IMAGE_TAG),
        "image_failing": ref(FAILING_TAG),
        "image_slow": ref(SLOW_TAG),
        "image_bad_nccl": ref(BAD_NCCL_TAG),
        "image_wedges_in_soak": ref(WEDGE_SOAK_TAG),
        "standin_images": flavours,
        "stack_images": {stack: flavours[f] for stack, f in STACK_FLAVOURS.items()},
        "image_never_ready": flavours["never-ready"],
    }


def _build_layer(rootfs: Path, files: dict[str, bytes], cache: Path) -> None:
    tmp = cache.with_name(cache.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    blobs = tmp / "registry" / "blobs"
    blobs.mkdir(parents=True)
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for p in _layer_paths(rootfs, _closure(rootfs, STANDIN_ROOTS)):
            tar.add(rootfs / p[1:], arcname=p[1:], recursive=False)
        dirs = {str(Path(name).parent) for name in files} | {"opt"}
        for d in sorted(dirs):
            ti = tarfile.TarInfo(d)
            ti.type, ti.mode, ti.mtime = tarfile.DIRTYPE, 0o755, 0
            tar.addfile(ti)
        for name, data in sorted(files.items()):
            _add_bytes(tar, name, data, 0o644)
        wrapper = b'#!/bin/sh\nexec python3 /opt/standin/standin_vllm.py "$@"\n'
        _add_bytes(tar, "usr/local/bin/vllm", wrapper, 0o755)
        # the tensorfold stack's engine (answers only in its flavour's image)
        tf = b'#!/bin/sh\nexec python3 /opt/standin/standin_tensorfold.py "$@"\n'
        _add_bytes(tar, "usr/local/bin/tensorfold", tf, 0o755)
    layer_tar = raw.getvalue()
    diff_id = "sha256:" + hashlib.sha256(layer_tar).hexdigest()
    gz = io.BytesIO()
    with gzip.GzipFile(fileobj=gz, mode="wb", compresslevel=6, mtime=0) as g:
        g.write(layer_tar)
    layer = gz.getvalue()
    layer_digest = "sha256:" + hashlib.sha256(layer).hexdigest()
    (blobs / layer_digest).write_bytes(layer)
    mdir = tmp / "registry" / "manifests" / IMAGE_NAME
    mdir.mkdir(parents=True)
    # the stand-in, its failing variant (same layer; STANDIN_FAIL_GATES=math in its config,
    # so its math gate fails: an upgrade to it must roll back, tests/lab test_an_upgrade_...) and
    # its slow variant (STANDIN_SPEED=0.7: every gate passes, the bench figures are 30% lower),
    # all stock vLLM 0.33; then one image per engine flavour
    stock = f"{FLAVOUR_ENV}={STOCK_FLAVOUR}"
    images = [
        (IMAGE_TAG, [stock]),
        (FAILING_TAG, [stock, FAILING_ENV]),
        (SLOW_TAG, [stock, SLOW_ENV]),
        (BAD_NCCL_TAG, [stock, BAD_NCCL_ENV]),
        (WEDGE_SOAK_TAG, [stock, *WEDGE_SOAK_ENV]),
    ]
    images += [(flavour_tag(f), [f"{FLAVOUR_ENV}={f}"]) for f in FLAVOURS]
    for tag, env in images:
        digest = _write_image(
            blobs, mdir, tag, diff_id, layer_digest, len(layer), [PREFILL_ENV, *env]
        )
        if tag == IMAGE_TAG:
            (tmp / "digest").write_text(digest + "\n")
    mib = f"layer {len(layer_tar) >> 20} MiB, gzip {len(layer) >> 20} MiB"
    print(f"stand-in image: {mib}", flush=True)
    shutil.rmtree(cache, ignore_errors=True)
    tmp.rename(cache)


def _write_image(
    blobs: Path,
    mdir: Path,
    tag: str,
    diff_id: str,
    layer_digest: str,
    layer_size: int,
    env: list[str],
) -> str:
    """Write one image's config and manifest (the layer is already in ``blobs``) under ``tag``
    and its digest; return the manifest digest."""
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "created": "1970-01-01T00:00:00Z",
            "config": {
                "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", *env],
                "Entrypoint": [],
                "Cmd": ["vllm", "--help"],
                "Labels": {"org.sparkrig.lab": "glm53-standin"},
            },
            "rootfs": {"type": "layers", "diff_ids": [diff_id]},
            "history": [{"created": "1970-01-01T00:00:00Z", "created_by": "lab/image.py"}],
        },
        sort_keys=True,
    ).encode()
    config_digest = "sha256:" + hashlib.sha256(config).hexdigest()
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
            "config": {
                "mediaType": "application/vnd.docker.container.image.v1+json",
                "size": len(config),
                "digest": config_digest,
            },
            "layers": [
                {
                    "mediaType": "application/vnd.docker.image.rootfs.diff.tar.gzip",
                    "size": layer_size,
                    "digest": layer_digest,
                }
            ],
        },
        indent=2,
    ).encode()
    digest = "sha256:" + hashlib.sha256(manifest).hexdigest()
    (blobs / config_digest).write_bytes(config)
    for ref in (tag, digest):
        (mdir / ref).write_bytes(manifest)
        (mdir / f"{ref}.digest").write_text(digest + "\n")
    return digest
