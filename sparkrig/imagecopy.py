"""The base image from its registry to every node (docs/sources.md, "Image").

Only the head pulls the base image from its registry. It saves it (``docker save``, one platform
when the CLI can) into a transfer directory and serves that directory read-only on its fabric
address; every worker downloads the tar, ``docker load``s it under a transfer tag, checks that the
image's ``RootFS.Layers`` equal the head's (never the local image ID, which save/load changes), and
only then tags it as the local base ``<image_repo>:base-<digest hex>``. So on a worker that tag
exists only after a verified copy, and on the head only after a pull by digest.

The operations read what the node holds from the image part of the state read
(sparkrig/image.py), are no-ops when nothing must change and take explicit arguments.
"""

from __future__ import annotations

import shlex
from collections.abc import Generator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyinfra import host, logger
from pyinfra.api import FunctionCommand, QuoteString, StringCommand, operation
from sparkhost.units import transient_command

from sparkrig.failing import fail_host
from sparkrig.image import ImageReport, digest_hex, image_of, local_base
from sparkrig.stateread import read_here

SERVE_UNIT = "sparkrig-image-serve"
SERVE_MAX_SECONDS = 4 * 3600  # the server stops by itself even if the deploy dies

# ---------------------------------------------------------------------------------------------
# Names of the transfer
# ---------------------------------------------------------------------------------------------


def transfer_tag(image_repo: str, base_image: str) -> str:
    """Name the base image carries inside the tar, until the worker has verified it."""
    return f"{image_repo}:transfer-{digest_hex(base_image)}"


def transfer_name(base_image: str) -> str:
    """File stem of the tar (``<stem>.tar``) and its layer list (``<stem>.layers``)."""
    return f"base-{digest_hex(base_image)}"


# ---------------------------------------------------------------------------------------------
# Cross-node plan (pure): which workers need the base image from the head
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CopyPlan:
    missing: list[str] = field(default_factory=list)  # workers without the local base tag
    mismatched: list[str] = field(default_factory=list)  # workers whose base layers differ


def copy_plan(head: ImageReport, workers: Mapping[str, ImageReport], base_image: str) -> CopyPlan:
    """Judge every worker's base image against the head's layers (content, not image ID)."""
    head_layers = head.layers(base_image)
    plan = CopyPlan()
    for name, report in workers.items():
        if report.base is None:
            plan.missing.append(name)
        elif not report.base_ok(base_image, head_layers):
            plan.mismatched.append(name)
    return plan


# ---------------------------------------------------------------------------------------------
# Commands (pure)
# ---------------------------------------------------------------------------------------------


def _layers_of(ref: str) -> str:
    fmt = "{{range .RootFS.Layers}}{{.}},{{end}}"
    return f"docker image inspect --format '{fmt}' {shlex.quote(ref)}"


def pulled_record_line(base_image: str, record: str) -> str:
    """Add ``base_image`` to the head's pulled-images record (one reference a line, each once):
    what uninstall.py removes, every stack's base the head ever pulled, not only the current."""
    ref, path = shlex.quote(base_image), shlex.quote(record)
    return (
        f"mkdir -p {shlex.quote(str(Path(record).parent))} && "
        f"{{ grep -qxF {ref} {path} 2>/dev/null || echo {ref} >> {path}; }}"
    )


def pull_command(base_image: str, local: str, have_ref: bool, record: str = "") -> str:
    """Pull by digest (unless the reference is here) and name it the local base; with
    ``record``, note the reference in the pulled-images record."""
    tag = f"docker tag {shlex.quote(base_image)} {shlex.quote(local)}"
    cmd = tag if have_ref else f"docker pull --quiet {shlex.quote(base_image)} && {tag}"
    return f"{cmd} && {pulled_record_line(base_image, record)}" if record else cmd


def save_command(local: str, transfer: str, directory: str, stem: str) -> str:
    """Save the local base (one platform when the CLI can: a multi-arch save can miss a blob)
    plus its layer list into ``directory``; ``.part`` names until complete (never served)."""
    d, q = shlex.quote(directory), shlex.quote
    tar, lay, dig = f"{d}/{stem}.tar", f"{d}/{stem}.layers", f"{d}/{stem}.digest"
    return "\n".join(
        [
            "set -e",
            f"mkdir -p -m 700 {d}",
            f"rm -f {d}/*.part {d}/base-*.tar {d}/base-*.layers {d}/base-*.digest",
            f"docker tag {q(local)} {q(transfer)}",
            f"p=$(docker image inspect --format '{{{{.Os}}}}/{{{{.Architecture}}}}' {q(local)})",
            "if docker save --help 2>&1 | grep -q -e '--platform'; then"
            f' docker save --platform "$p" -o {tar}.part {q(transfer)};'
            f" else docker save -o {tar}.part {q(transfer)}; fi",
            f"docker image rm {q(transfer)} >/dev/null",
            f"{_layers_of(local)} > {lay}.part",
            f'set -- $(sha256sum {tar}.part); echo "$1 $(stat -c %s {tar}.part)" > {dig}.part',
            f"mv {tar}.part {tar}",
            f"mv {lay}.part {lay}",
            f"mv {dig}.part {dig}",
        ]
    )


@dataclass(frozen=True)
class SavedTar:
    """What the head saved, read over SSH (never over the fabric's HTTP): the tar's sha256 and
    size and the image's layers, handed to the worker's ``sparkhost imageload``."""

    sha256: str
    size: int
    layers: str  # RootFS.Layers, comma-terminated as ``_layers_of`` prints them

    @classmethod
    def parse(cls, lines: list[str]) -> SavedTar | None:
        """From ``saved_tar_command``'s output; None when it is not a complete record."""
        words = [line.strip() for line in lines if line.strip()]
        if len(words) != 2:
            return None
        digest, _, size = words[0].partition(" ")
        if len(digest) != 64 or not size.isdigit() or not words[1].startswith("sha256:"):
            return None
        return cls(digest, int(size), words[1])


def saved_tar_command(directory: str, stem: str) -> str:
    """Read the head's record of its saved tar (digest and size, then the layer list)."""
    d = shlex.quote(directory)
    return f"cat {d}/{stem}.digest {d}/{stem}.layers"


def serve_command(
    fetcher: list[str],
    directory: str,
    listen: str,
    bind_device: str | None = None,
    unit: str = SERVE_UNIT,
) -> str:
    """The host package's read-only server as a transient unit (replacing one of that name)."""
    bind = ["--bind-device", bind_device] if bind_device else []
    argv = [*fetcher, "serve", "--dir", directory, "--listen", listen, *bind,
            "--max-seconds", str(SERVE_MAX_SECONDS)]  # fmt: skip
    return transient_command(unit, argv)


def load_command(
    url: str,
    directory: str,
    stem: str,
    transfer: str,
    local: str,
    saved: SavedTar,
    fetcher: list[str],
) -> str:
    """Download the head's tar over the fabric (never more than its size), then let the host
    package's ``imageload`` check its size and sha256 against ``saved`` (read from the head over
    SSH) BEFORE ``docker load``, compare the loaded layers with the head's and only then give it
    the local base name. Nothing touches a registry."""
    d, q = shlex.quote(directory), shlex.quote
    tar = f"{d}/{stem}.tar.part"
    src = f"{url.rstrip('/')}/{stem}"
    curl = "curl -fsS --retry 10 --retry-connrefused --retry-delay 1"
    no_head = (
        f"echo 'cannot fetch the base image from the head at {url}: the head serves it only "
        "while the whole deploy runs (not under --limit worker)' >&2; exit 1"
    )
    check = [
        *fetcher, "imageload", "--tar", f"{directory}/{stem}.tar.part", "--sha256", saved.sha256,
        "--size", str(saved.size), "--layers", saved.layers, "--transfer", transfer,
        "--local", local,
    ]  # fmt: skip
    return "\n".join(
        [
            "set -e",
            f"mkdir -p -m 700 {d}",
            f"rm -f {tar}",
            f"{curl} --max-filesize {saved.size} -o {tar} {q(src + '.tar')} || "
            f"{{ rm -f {tar}; {no_head}; }}",
            " ".join(q(a) for a in check),
        ]
    )


def unserve_command(directory: str, unit: str = SERVE_UNIT) -> str:
    d = shlex.quote(directory)
    return (
        f"systemctl stop {shlex.quote(unit)} 2>/dev/null; "
        f"rm -f {d}/base-*.tar {d}/base-*.layers {d}/base-*.digest {d}/*.part"
    )


def _sh(script: str) -> StringCommand:
    return StringCommand("sh", "-c", QuoteString(script))


def _log(message: str) -> None:
    logger.info(f"{host.print_prefix}{message}")


# ---------------------------------------------------------------------------------------------
# Operations
# ---------------------------------------------------------------------------------------------


@operation()
def base_image_pulled(
    image_repo: str, base_image: str, tag: str, record: str = ""
) -> Generator[Any, None, None]:
    """
    Pull the base image by its pinned digest from its registry and name it the local base (the
    head's job: ``on_head``; the workers copy it from the head).

    + image_repo: local repository of sparkrig images
    + base_image: ``repo@sha256:<digest>``
    + tag: the patched tag this run wants (read by the same fact)
    + record: the pulled-images record the reference is added to (uninstall.py reads it)
    """
    report = image_of(read_here("image"), image_repo=image_repo, base_image=base_image, tag=tag)
    local = local_base(image_repo, base_image)
    if report.pulled(base_image):
        host.noop(f"{local} is {base_image} (pulled by digest)")
        return
    pull = report.needs_registry(base_image)
    if pull:
        _log(f"base image: will pull {base_image} from its registry")
    else:
        _log(f"base image: {base_image} is here; will name it {local}")
    yield _sh(pull_command(base_image, local, have_ref=not pull, record=record))


@operation(is_idempotent=False)
def base_image_served(
    image_repo: str,
    base_image: str,
    fetcher: list[str],
    directory: str,
    listen: str,
    workers: list[str],
    mismatched: list[str] | None = None,
    bind_device: str | None = None,
) -> Generator[Any, None, None]:
    """
    Save the base image to a tar and serve it read-only on the fabric while workers copy it.

    + image_repo: local repository of sparkrig images
    + base_image: ``repo@sha256:<digest>``
    + fetcher: argv of the host package (its ``serve`` job: sparkrig/hostpkg.py) on this node
    + directory: transfer directory holding the tar and its layer list
    + listen: ``<fabric IP>:<port>`` to serve on
    + workers: workers that lack the base image (empty: nothing to serve)
    + mismatched: workers whose base image has other layers than this node's (fails this host)
    + bind_device: the fabric netdev the server's socket is bound to (SO_BINDTODEVICE)
    """
    if mismatched:
        local = local_base(image_repo, base_image)
        yield fail_host(
            f"{local} on {', '.join(mismatched)} has other layers than on the head: remove it "
            f"there (docker image rm {local}) and re-run the deploy to copy it again"
        )
        return
    if not workers:
        host.noop("no worker needs the base image")
        return
    _log(f"base image: will save it and serve it on {listen} for {', '.join(workers)}")
    stem = transfer_name(base_image)
    yield _sh(
        save_command(
            local_base(image_repo, base_image),
            transfer_tag(image_repo, base_image),
            directory,
            stem,
        )
    )
    yield _sh(serve_command(fetcher, directory, listen, bind_device))


@operation()
def base_image_loaded(
    image_repo: str,
    base_image: str,
    tag: str,
    directory: str,
    source: str,
    head: str,
    fetcher: list[str],
    source_absent: str = "",
) -> Generator[Any, None, None]:
    """
    Copy the base image from the head over the fabric, unless present (the workers' job:
    ``on_workers``): the tar's sha256 and size and the image's layers are read from the head over
    SSH at apply time and checked by ``sparkhost imageload`` before and after ``docker load``.

    + image_repo: local repository of sparkrig images
    + base_image: ``repo@sha256:<digest>``
    + tag: the patched tag this run wants (read by the same fact)
    + directory: transfer directory for the download
    + source: ``http://<head fabric IP>:<port>`` the head serves on
    + head: the head's inventory name (its saved tar's record is read there over SSH)
    + fetcher: argv of the host package on this node (its ``imageload`` job)
    + source_absent: non-empty when the head is not in this run: fail with it as the reason
    """
    report = image_of(read_here("image"), image_repo=image_repo, base_image=base_image, tag=tag)
    local = local_base(image_repo, base_image)
    if report.base_ok(base_image):
        host.noop(f"{local} is present ({len(report.base.layers) if report.base else 0} layers)")
        return
    if source_absent:
        logger.error(f"{host.print_prefix}base image {local} is not here; {source_absent}")
        yield fail_host(f"base image {local} is not here; {source_absent}")
        return
    _log(f"base image: will copy it from the head over the fabric ({source})")
    stem, transfer = transfer_name(base_image), transfer_tag(image_repo, base_image)

    def copy(state: Any, host: Any) -> bool:  # at apply time: the head saved it in this run
        source_host = state.inventory.get_host(head)
        ok, out = source_host.connector.run_shell_command(
            StringCommand(saved_tar_command(directory, stem)),
            print_output=False, print_input=state.print_input, _sudo=True,
        )  # fmt: skip
        saved = SavedTar.parse(out.stdout_lines) if ok else None
        if saved is None:
            logger.error(
                f"{host.print_prefix}the head ({head}) has no complete record of its saved base "
                f"image in {directory}: run the whole deploy again"
            )
            return False
        ok, out = host.connector.run_shell_command(
            _sh(load_command(source, directory, stem, transfer, local, saved, fetcher)),
            print_output=state.print_output, print_input=state.print_input, _sudo=True,
        )  # fmt: skip
        if not ok:
            for line in out.stderr_lines:
                logger.error(f"{host.print_prefix}{line}")
        return bool(ok)

    yield FunctionCommand(copy, (), {})


@operation()
def base_image_unserved(directory: str, served: bool) -> Generator[Any, None, None]:
    """
    Stop serving the base image and delete the tar.

    + directory: transfer directory
    + served: whether this node serves it in this run (False: no-op, even under ``--dry``)
    """
    if not served:
        host.noop("this node does not serve the base image")
        return
    yield _sh(unserve_command(directory))
