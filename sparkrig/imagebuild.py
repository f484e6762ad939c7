"""The patched image built on every node, and old images pruned (docs/sources.md, "Image").

Every node builds ``<image_repo>:<content hash>`` (sparkrig/imagehash.py: base digest + the files
the Dockerfile copies + the skip list) from its local base (sparkrig/imagecopy.py brings it), with
no network: an unchanged tag is never rebuilt, a changed patch gives a new tag (and the rank unit,
which names it, changes). Once the new pair is healthy, every other sparkrig tag is removed but the
serving image and its base.
"""

from __future__ import annotations

import io
import shlex
import tarfile
from collections.abc import Generator, Iterable, Mapping
from pathlib import Path
from typing import Any

from pyinfra import host, logger
from pyinfra.api import QuoteString, StringCommand, operation
from pyinfra.api.command import FileUploadCommand
from pyinfra.api.exceptions import OperationValueError

from sparkrig.config.model import Settings
from sparkrig.image import (
    FILES_DIR,
    RepoTags,
    hashed_build_args,
    image_of,
    local_base,
    repo_tags,
    serving_image,
)
from sparkrig.imagehash import context_files, image_ref, image_tag
from sparkrig.stateread import NotDeclared, read_here

# ---------------------------------------------------------------------------------------------
# What is built and what is kept (pure)
# ---------------------------------------------------------------------------------------------


def images_to_keep(settings: Settings, files_dir: str | Path = FILES_DIR) -> list[str]:
    """What ``old_images_pruned`` keeps: the serving image and the base it was built from."""
    base = local_base(settings.knobs.image_repo, settings.image_ref)
    return list(dict.fromkeys([serving_image(settings, files_dir), base]))


def context_tar(files: Mapping[str, bytes]) -> bytes:
    """The build context as a deterministic tar (sorted, mtime 0, root-owned, 0644/0755)."""
    raw = io.BytesIO()
    dirs: set[str] = set()
    for name in files:
        parts = name.split("/")[:-1]
        dirs.update("/".join(parts[: i + 1]) for i in range(len(parts)))
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for d in sorted(dirs):
            ti = tarfile.TarInfo(d)
            ti.type, ti.mode, ti.mtime = tarfile.DIRTYPE, 0o755, 0
            tar.addfile(ti)
        for name in sorted(files):
            ti = tarfile.TarInfo(name)
            ti.size, ti.mode, ti.mtime = len(files[name]), 0o644, 0
            tar.addfile(ti, io.BytesIO(files[name]))
    return raw.getvalue()


def build_command(
    build_dir: str, local: str, ref: str, tag: str, build_args: Mapping[str, str]
) -> str:
    """Unpack the uploaded context and build ``ref`` from the local base without network:
    BuildKit (buildx, the daemon's own builder, which sees local images) when the CLI has it,
    else the classic builder (Debian's docker.io ships without buildx)."""
    d, q = shlex.quote(build_dir), shlex.quote
    args = ["--network", "none", "-f", "Dockerfile", "-t", ref, "--build-arg", f"BASE={local}"]
    for key in sorted(build_args):
        args += ["--build-arg", f"{key}={build_args[key]}"]
    args += ["--build-arg", f"SPARKRIG_TAG={tag}", "."]
    argv = " ".join(q(a) for a in args)
    missing = (
        f"echo 'base image {local} is not on this node: run the whole deploy (the head pulls it "
        "and copies it to the workers)' >&2; exit 1"
    )
    return "\n".join(
        [
            "set -e",
            f"docker image inspect {q(local)} >/dev/null 2>&1 || {{ {missing}; }}",
            f"rm -rf {d}/context && mkdir -p {d}/context",
            f"tar -xf {d}/context.tar -C {d}/context",
            f"cd {d}/context",
            "if docker buildx version >/dev/null 2>&1; then",
            f"  docker buildx build --builder default --load {argv}",
            "else",
            f"  DOCKER_BUILDKIT=0 docker build {argv}",
            "fi",
            "cd /",
            f"rm -rf {d}",
        ]
    )


def prune_commands(tags: Iterable[str], keep: Iterable[str]) -> list[str]:
    """``docker image rm`` for every tag not kept; a tag still used by a container stays (the
    removal is skipped, not fatal), layers shared with kept images stay."""
    kept = set(keep)
    return [
        f"docker image rm {shlex.quote(t)} >/dev/null || echo 'kept {t}: still in use' >&2"
        for t in sorted(set(tags) - kept)
    ]


# ---------------------------------------------------------------------------------------------
# Operations
# ---------------------------------------------------------------------------------------------


@operation()
def patched_image_built(
    image_repo: str,
    base_image: str,
    tag: str,
    build_dir: str,
    skip_patches: list[str] | None = None,
    files_dir: str = str(FILES_DIR),
) -> Generator[Any, None, None]:
    """
    Build ``<image_repo>:<tag>`` on this node from the local base and files/, unless present.

    The tag is the content hash of the base digest, the build context and the skip list, so a
    present tag means an identical build and nothing is done.

    + image_repo: local repository of sparkrig images
    + base_image: ``repo@sha256:<digest>``; built FROM its local base tag
    + tag: the content-hash tag (``patched_tag``)
    + build_dir: scratch directory on the node for the context (removed after the build)
    + skip_patches: patch names the build skips on purpose (SPARKRIG_SKIP_PATCHES)
    + files_dir: local files/ holding the Dockerfile and patches
    """
    report = image_of(read_here("image"), image_repo=image_repo, base_image=base_image, tag=tag)
    ref = image_ref(image_repo, tag)
    if report.patched is not None:
        host.noop(f"{ref} is present")
        return
    args = hashed_build_args(skip_patches or ())
    files = context_files(files_dir)
    if image_tag(base_image, files, args) != tag:
        raise OperationValueError(f"{ref}: tag is not the content hash of {files_dir}")
    local = local_base(image_repo, base_image)
    logger.info(
        f"{host.print_prefix}patched image: will build {ref} from {local} "
        f"({len(files)} context files)"
    )
    d = shlex.quote(build_dir)
    yield StringCommand(f"rm -rf {d} && mkdir -p -m 700 {d}")
    yield FileUploadCommand(io.BytesIO(context_tar(files)), f"{build_dir}/context.tar")
    yield StringCommand("sh", "-c", QuoteString(build_command(build_dir, local, ref, tag, args)))


@operation()
def old_images_pruned(image_repo: str, keep: list[str]) -> Generator[Any, None, None]:
    """
    Remove every ``<image_repo>`` tag but ``keep`` (call it only once the new pair is healthy).

    + image_repo: local repository of sparkrig images
    + keep: references to keep (``images_to_keep``: the serving image and its local base)
    """
    try:
        tags = repo_tags(read_here("image"), image_repo)
    except NotDeclared:  # a deploy without the state read (uninstall.py)
        tags = host.get_fact(RepoTags, image_repo=image_repo)
    commands = prune_commands(tags, keep)
    if not commands:
        host.noop(f"no old {image_repo} image")
        return
    logger.info(
        f"{host.print_prefix}images: will remove {', '.join(sorted(set(tags) - set(keep)))}"
    )
    yield from commands
