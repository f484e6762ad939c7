"""The serving image's names and what a node holds of it (docs/sources.md, "Image").

Only the head pulls the base image from its registry, by digest; every worker gets it from the head
over the fabric (sparkrig/imagecopy.py), and each node then builds ``<image_repo>:<content hash>``
(sparkrig/imagebuild.py; the hash: sparkrig/imagehash.py) from its local base
``<image_repo>:base-<digest hex>``. This module names those images and reads what a node holds:
one read-only fact per node (``ImageState``), a part of the state read, and the log line that
describes it.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyinfra.api import FactBase, QuoteString, StringCommand
from pyinfra.api.exceptions import FactProcessError

from sparkrig import REPO
from sparkrig.config.model import Settings
from sparkrig.factlines import END, parse_key_values
from sparkrig.imagehash import base_digest, context_files, image_ref, image_tag
from sparkrig.stateread import Part, Values

FILES_DIR = REPO / "files"
MARKER = "sparkrig-image-state"  # in every image fact command (fakes match on it)

# ---------------------------------------------------------------------------------------------
# Names and the tag (pure)
# ---------------------------------------------------------------------------------------------


def digest_hex(base_image: str) -> str:
    return base_digest(base_image).removeprefix("sha256:")


def local_base(image_repo: str, base_image: str) -> str:
    """Local name of the base image on every node (``<image_repo>:base-<64 hex>``)."""
    return f"{image_repo}:base-{digest_hex(base_image)}"


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
