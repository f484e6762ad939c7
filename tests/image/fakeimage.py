"""Canned output of the image fact (sparkrig.image.ImageState) for @fake hosts."""

from __future__ import annotations

import re
from typing import Any

from sparkrig.image import END, MARKER, local_base, patched_tag
from sparkrig.imagehash import base_digest, image_ref

STATE: dict[str, dict[Any, Any]] = {}  # host -> canned responses, set by tests
MATCH = re.compile(re.escape(MARKER))  # matches every image fact command
REPO = "sparkrig/vllm-glm53"
LAYERS = ("sha256:" + "11" * 32, "sha256:" + "22" * 32)


def inspect_line(ident: str, layers: tuple[str, ...], digests: tuple[str, ...] = ()) -> str:
    return f"sha256:{ident * 32}|linux/arm64|{','.join(layers)}|{','.join(digests)}"


def image_state(
    base_image: str,
    *,
    pulled: bool = True,
    base: bool = True,
    patched: bool = True,
    layers: tuple[str, ...] = LAYERS,
    skip_patches: tuple[str, ...] = (),
    extra_tags: tuple[str, ...] = (),
    repo: str = REPO,
) -> list[str]:
    """The fact's lines for a node. ``pulled``: the base came by digest (the head); otherwise it
    was copied and loaded (a worker: no RepoDigests, the pinned ref does not resolve)."""
    repo_name = base_image.split("@")[0]
    digests = (f"{repo_name}@{base_digest(base_image)}",) if pulled else ()
    tag = patched_tag(base_image, skip_patches)
    tags = list(extra_tags)
    lines = ["ref=" + (inspect_line("b0", layers, digests) if pulled and base else "")]
    if base:
        lines.append("base=" + inspect_line("b0" if pulled else "b1", layers, digests))
        tags.append(local_base(repo, base_image))
    else:
        lines.append("base=")
    if patched:
        lines.append("patched=" + inspect_line("c0", (*layers, "sha256:" + "33" * 32)))
        tags.append(image_ref(repo, tag))
    else:
        lines.append("patched=")
    lines += [f"tags={','.join(sorted(tags))}", END]
    return lines


def converged_image_state(base_image: str, **kwargs: Any) -> dict[Any, Any]:
    """Responses for a node holding the base and the patched image (put first in a host's
    responses: the first matching entry wins)."""
    return {MATCH: image_state(base_image, **kwargs)}
