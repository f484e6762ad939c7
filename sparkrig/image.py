"""The serving image: base pinned by digest, patched image built on every node
(docs/sources.md, "Image").

Only the head pulls the base image from its registry. It saves it (``docker save``, one platform
when the CLI can) into a transfer directory and serves that directory read-only on its fabric
address; every worker downloads the tar, ``docker load``s it under a transfer tag, checks that the
image's ``RootFS.Layers`` equal the head's (never the local image ID, which save/load changes), and
only then tags it as the local base ``<image_repo>:base-<digest hex>``. So on a worker that tag
exists only after a verified copy, and on the head only after a pull by digest.

Every node then builds ``<image_repo>:<content hash>`` (sparkrig/imagehash.py: base digest + the
files the Dockerfile copies + the skip list) from the local base, with no network: an unchanged
tag is never rebuilt, a changed patch gives a new tag (and the rank unit, which names it, changes).

One read-only fact per node (``ImageState``) says what the node holds; operations are no-ops when
nothing must change and take explicit arguments.
"""

from __future__ import annotations

import io
import shlex
import tarfile
from collections.abc import Generator, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyinfra import host, logger
from pyinfra.api import FactBase, FunctionCommand, QuoteString, StringCommand, operation
from pyinfra.api.command import FileUploadCommand
from pyinfra.api.exceptions import FactProcessError, OperationValueError
from sparkhost.units import transient_command

from sparkrig import REPO
from sparkrig.factlines import END, parse_key_values
from sparkrig.failing import fail_host
from sparkrig.imagehash import base_digest, context_files, image_ref, image_tag
from sparkrig.settings import Settings
from sparkrig.stateread import NotDeclared, Part, Values, read_here

FILES_DIR = REPO / "files"
MARKER = "sparkrig-image-state"  # in every image fact command (fakes match on it)
SERVE_UNIT = "sparkrig-image-serve"
SERVE_MAX_SECONDS = 4 * 3600  # the server stops by itself even if the deploy dies

# ---------------------------------------------------------------------------------------------
# Names and the tag (pure)
# ---------------------------------------------------------------------------------------------


def digest_hex(base_image: str) -> str:
    return base_digest(base_image).removeprefix("sha256:")


def local_base(image_repo: str, base_image: str) -> str:
    """Local name of the base image on every node (``<image_repo>:base-<64 hex>``)."""
    return f"{image_repo}:base-{digest_hex(base_image)}"


def transfer_tag(image_repo: str, base_image: str) -> str:
    """Name the base image carries inside the tar, until the worker has verified it."""
    return f"{image_repo}:transfer-{digest_hex(base_image)}"


def transfer_name(base_image: str) -> str:
    """File stem of the tar (``<stem>.tar``) and its layer list (``<stem>.layers``)."""
    return f"base-{digest_hex(base_image)}"


def hashed_build_args(skip_patches: Iterable[str] = ()) -> dict[str, str]:
    """Build args that change the image's content (so they go into the tag); BASE is the digest,
    hashed on its own, and SPARKRIG_TAG is the output."""
    skip = sorted(set(skip_patches))
    return {"SPARKRIG_SKIP_PATCHES": ",".join(skip)} if skip else {}


def patched_tag(
    base_image: str, skip_patches: Iterable[str] = (), files_dir: str | Path = FILES_DIR
) -> str:
    return image_tag(base_image, context_files(files_dir), hashed_build_args(skip_patches))


def serving_tag(settings: Settings, files_dir: str | Path = FILES_DIR) -> str:
    """The ``<image_repo>`` tag every rank runs: the patched image's content hash, or, for a
    stack without sparkrig's patch layer (``Stack.patched`` False), the local base tag itself
    (``base-<digest hex>``): pulled by digest and run as it is, nothing built."""
    k = settings.knobs
    if not settings.stack.patched:
        return local_base(k.image_repo, settings.image_ref).rpartition(":")[2]
    return patched_tag(settings.image_ref, k.image_skip_patches, files_dir)


def serving_image(settings: Settings, files_dir: str | Path = FILES_DIR) -> str:
    """The image reference every rank unit runs: ``<image_repo>:<serving_tag>``."""
    return image_ref(settings.knobs.image_repo, serving_tag(settings, files_dir))


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


# ---------------------------------------------------------------------------------------------
# The fact: what one node holds, in one command
# ---------------------------------------------------------------------------------------------

# range, not join: docker 26 hands templates these lists as []interface{}, which join refuses
_INSPECT = (
    "{{.Id}}|{{.Os}}/{{.Architecture}}|{{range .RootFS.Layers}}{{.}},{{end}}"
    "|{{range .RepoDigests}}{{.}},{{end}}"
)

# One ``docker image inspect`` of all three references (each docker CLI start costs seconds
# under TCG): docker prints a line per image found, in order, and names the missing ones on
# stderr. Each line carries its RepoTags last, so a reference is told by its tag or, for the
# pinned ref, by its digest in RepoDigests (a ref resolves only when the digest is recorded
# there: pulled by digest), then printed without that field, as one inspect of it alone would.
_STATE_SCRIPT = """: {marker}
all=$(docker image inspect --format {fmt} {ref} {base} {patched} 2>/dev/null)
pick() {{ printf '%s\\n' "$all" | while IFS= read -r l; do case "$l" in
  *"$1"*|*"$2"*) echo "${{l%|*}}"; break ;; esac; done; }}
echo "ref=$(pick {ref_keys})"
echo "base=$(pick {base_keys})"
echo "patched=$(pick {patched_keys})"
if ls=$(docker image ls --format '{{{{.Repository}}}}:{{{{.Tag}}}}' {repo} 2>/dev/null); then
  echo "tags=$(printf '%s\\n' "$ls" | sort | paste -sd, -)"
else echo "daemon=unreachable"; fi
echo '{end}'
"""


def _tag_keys(ref: str) -> str:
    """How a local tag shows in the inspect line's RepoTags field (docker's familiar name:
    no ``docker.io/`` or ``library/`` prefix): first in the field or after another tag."""
    familiar = ref.removeprefix("docker.io/").removeprefix("library/")
    return f"{shlex.quote('|' + familiar + ',')} {shlex.quote(',' + familiar + ',')}"


_TAGS_SCRIPT = """: {marker}
echo "tags=$(docker image ls --format '{{{{.Repository}}}}:{{{{.Tag}}}}' {repo} 2>/dev/null \
| sort | paste -sd, -)"
echo '{end}'
"""


@dataclass(frozen=True)
class LocalImage:
    """One image as ``docker image inspect`` shows it."""

    id: str
    platform: str = ""
    layers: tuple[str, ...] = ()
    repo_digests: tuple[str, ...] = ()

    def has_digest(self, digest: str) -> bool:
        return any(d.endswith("@" + digest) for d in self.repo_digests)


@dataclass(frozen=True)
class ImageReport:
    """What a node holds. The default (no answer yet) holds nothing."""

    answered: bool = False
    ref: LocalImage | None = None  # the pinned ref, resolvable only after a pull by digest
    base: LocalImage | None = None  # the local base tag
    patched: LocalImage | None = None  # the patched tag this run wants
    tags: tuple[str, ...] = ()  # every <image_repo>:<tag> on the node
    docker_up: bool = True  # False: the daemon did not answer, so nothing above is known

    def base_ok(self, base_image: str, head_layers: tuple[str, ...] | None = None) -> bool:
        """The local base tag holds the pinned content: pulled by that digest, or (after a
        verified copy) carrying the head's layers. ``head_layers`` None: trust the tag, which is
        only ever created after one of those two checks."""
        if self.base is None:
            return False
        if self.base.has_digest(base_digest(base_image)):
            return True
        return head_layers is None or self.base.layers == head_layers

    def pulled(self, base_image: str) -> bool:
        """On the head: the local base tag is the image pulled by the pinned digest."""
        return self.base is not None and self.base.has_digest(base_digest(base_image))

    def needs_registry(self, base_image: str) -> bool:
        """On the head: the pinned image must come from its registry (neither the local base
        nor the pinned ref is here)."""
        return not self.pulled(base_image) and self.ref is None

    def layers(self, base_image: str) -> tuple[str, ...] | None:
        """The pinned content's layers on this node, when it has the pinned ref or base tag."""
        if self.pulled(base_image) and self.base is not None:
            return self.base.layers
        if self.ref is not None:
            return self.ref.layers
        return None


def _image(value: str) -> LocalImage | None:
    if not value.strip():
        return None
    parts = value.strip().split("|")
    if len(parts) != 4 or not parts[0].startswith("sha256:"):
        raise FactProcessError(f"image state: unexpected inspect line {value!r}")
    ident, platform, layers, digests = parts
    return LocalImage(ident, platform, _csv(layers), _csv(digests))


def _csv(text: str) -> tuple[str, ...]:
    return tuple(x for x in text.split(",") if x)


def parse_image_report(lines: list[str]) -> ImageReport:
    raw = parse_key_values(lines, "image state")
    return ImageReport(
        answered=True,
        ref=_image(raw.get("ref", "")),
        base=_image(raw.get("base", "")),
        patched=_image(raw.get("patched", "")),
        tags=tuple(t for t in raw.get("tags", "").split(",") if t),
        docker_up=raw.get("daemon") != "unreachable",
    )


class ImageState(FactBase[ImageReport]):
    """
    What a node holds of the serving image, in one read-only command of two docker calls: the
    pinned base ref (if it was pulled by digest here), the local base tag, the wanted patched tag
    (id, platform, ``RootFS.Layers``, ``RepoDigests`` each), and every tag of ``image_repo``.
    """

    default = ImageReport

    def command(self, image_repo: str, base_image: str, tag: str) -> StringCommand:
        q = shlex.quote
        base, patched = local_base(image_repo, base_image), image_ref(image_repo, tag)
        digest = q(f"@{base_digest(base_image)},")
        script = _STATE_SCRIPT.format(
            marker=MARKER,
            fmt=q(_INSPECT + "|{{range .RepoTags}}{{.}},{{end}}"),
            ref=q(base_image),
            base=q(base),
            patched=q(patched),
            ref_keys=f"{digest} {digest}",
            base_keys=_tag_keys(base),
            patched_keys=_tag_keys(patched),
            repo=q(image_repo),
            end=END,
        )
        return StringCommand("sh", "-c", QuoteString(script))

    def process(self, output: list[str]) -> ImageReport:
        return parse_image_report(output)


class RepoTags(FactBase[list[str]]):
    """Every ``<image_repo>:<tag>`` on the node (what pruning looks at)."""

    default = list

    def command(self, image_repo: str) -> StringCommand:
        script = _TAGS_SCRIPT.format(marker=MARKER, repo=shlex.quote(image_repo), end=END)
        return StringCommand("sh", "-c", QuoteString(script))

    def process(self, output: list[str]) -> list[str]:
        return list(parse_image_report(output).tags)


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


def describe(report: ImageReport, base_image: str, image_repo: str, tag: str) -> str:
    """One line for the log: what the node has of the base and the patched image."""
    if not report.docker_up:
        return "docker not running (its daemon does not answer): images unknown until it runs"
    if report.base is not None:
        how = "pulled by digest" if report.pulled(base_image) else "copied, layers verified"
        base = f"base present ({len(report.base.layers)} layers, {how})"
    elif report.ref is not None:
        base = "base pulled but not tagged"
    else:
        base = "base absent"
    patched = "present" if report.patched is not None else "absent"
    return f"{base}; {image_ref(image_repo, tag)} {patched}"


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


def _sh(script: str) -> StringCommand:
    return StringCommand("sh", "-c", QuoteString(script))


def _log(message: str) -> None:
    logger.info(f"{host.print_prefix}{message}")


# ---------------------------------------------------------------------------------------------
# Its part of the state read, and the typed reader of it
# ---------------------------------------------------------------------------------------------


def image_part(s: Settings) -> Part:
    """The state read's part of the images: the base, the local base, the patched tag."""
    image = {"image_repo": s.knobs.image_repo, "base_image": s.image_ref, "tag": serving_tag(s)}
    return Part("image", ImageState, tuple(sorted(image.items())))


def image_of(values: Values, **args: Any) -> ImageReport:
    """The image part of ``values``, read with ``args`` (KeyError when read with others)."""
    if "image" not in values or values.args("image") != args:
        raise KeyError(f"image state for {args} is not in the state read")
    return values.get("image", ImageState)


def repo_tags(values: Values, image_repo: str) -> list[str]:
    """Every ``<image_repo>:<tag>`` on the host (the image part lists them)."""
    if "image" not in values or values.args("image").get("image_repo") != image_repo:
        raise KeyError(f"tags of {image_repo} are not in the state read")
    return list(values.get("image", ImageState).tags)


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
    _log(f"patched image: will build {ref} from {local} ({len(files)} context files)")
    d = shlex.quote(build_dir)
    yield StringCommand(f"rm -rf {d} && mkdir -p -m 700 {d}")
    yield FileUploadCommand(io.BytesIO(context_tar(files)), f"{build_dir}/context.tar")
    yield _sh(build_command(build_dir, local, ref, tag, args))


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
    _log(f"images: will remove {', '.join(sorted(set(tags) - set(keep)))}")
    yield from commands
