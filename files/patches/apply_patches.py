"""Patch applier for the sparkrig image build (runs inside `docker build`, stdlib only).

Reads manifest.json beside it. Each entry is a source transformation of one file of the
installed vLLM package: ``places`` names a module (relative to this directory) whose ``PLACES``
lists ``(what, anchor, replacement)``; ``target`` is the file, relative to the package
directory; ``pins`` maps the sha256 of a known base file to the sha256 its transformation must
produce; ``required`` says whether a problem stops the build.

Fails closed (exit 1, one line per problem naming the file and the image) when a required
entry's target is not in the base image, when any anchor does not occur exactly once in it, when
a file that parsed no longer does, or when a pinned base file gives another result than its pin.
A base file without a pin is transformed by its anchors and its result recorded as unpinned.
Both sha256 are recorded in APPLIED.json. Entries named in --skip are not applied, recorded as
skipped.

    python3 apply_patches.py [--skip name,name] [--vllm-dir DIR] [--image REF] [--dry-run]
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import importlib.util
import json
import os
import sys
from collections.abc import Sequence
from itertools import pairwise
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))

Place = tuple[str, str, str]


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def find_vllm_dir() -> str | None:
    """The installed vllm package directory, found without importing vllm (no CUDA at build)."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return None
    return str(list(spec.submodule_search_locations)[0])


def parses(source: bytes) -> bool:
    try:
        ast.parse(source)
    except SyntaxError:
        return False
    return True


def load_places(path: str) -> list[Place]:
    spec = importlib.util.spec_from_file_location("sparkrig_patch_places", path)
    if spec is None or spec.loader is None:
        raise ImportError(path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    places: list[Place] = module.PLACES
    return places


def rewrite(text: str, places: Sequence[Place]) -> tuple[str, list[str]]:
    """(new text, problems). Every anchor is found in the original text, and replaced there,
    so one place's replacement is never taken for another's anchor; nothing is replaced unless
    each anchor occurs exactly once and no two overlap."""
    problems = [
        f"{what}: found {text.count(anchor)} times, needs exactly 1"
        for what, anchor, _ in places
        if text.count(anchor) != 1
    ]
    spans = sorted((text.index(a), text.index(a) + len(a), what, new)
                   for what, a, new in places if text.count(a) == 1)  # fmt: skip
    problems += [f"{b[2]}: overlaps {a[2]}" for a, b in pairwise(spans) if b[0] < a[1]]
    if problems:
        return text, problems
    out, at = [], 0
    for start, end, _, replacement in spans:
        out += [text[at:start], replacement]
        at = end
    return "".join([*out, text[at:]]), []


def transform(
    entry: dict[str, Any], here: str, target: str, image: str
) -> tuple[dict[str, Any], bytes, list[str]]:
    """(record, new content, problems) of one entry against its target file."""
    where = f"{target} of image {image}"
    if not os.path.isfile(target):
        return {}, b"", [f"{where}: no such file (is this the base image the patch is for?)"]
    places_file = os.path.join(here, entry.get("places", ""))
    if not os.path.isfile(places_file):
        return {}, b"", [f"places file {entry.get('places')} is missing from the build context"]
    with open(target, "rb") as fh:
        stock = fh.read()
    text, problems = rewrite(stock.decode("utf-8"), load_places(places_file))
    readme = f"files/patches/{os.path.dirname(entry.get('places', ''))}/README.md"
    new = text.encode("utf-8")
    record: dict[str, Any] = {"stock_sha256": sha256_bytes(stock), "applied_sha256": ""}
    if problems:
        hint = f"the fix was written for another version of this file ({readme})"
        problems = [f"{p}; {hint}" for p in problems]
    elif parses(stock) and not parses(new):
        problems = ["the transformed file does not parse"]
    else:
        record["applied_sha256"] = sha256_bytes(new)
        pin = entry.get("pins", {}).get(record["stock_sha256"])
        record["pinned"] = pin is not None
        if pin not in (None, record["applied_sha256"]):
            problems = [f"base file sha256 {record['stock_sha256']} gave "
                        f"{record['applied_sha256']}, pinned {pin} ({readme})"]  # fmt: skip
    if problems:
        return {}, b"", [f"{where}: {p}" for p in problems]
    return record, new, []


def plan(
    manifest: dict[str, Any], here: str, vllm_dir: str | None, skip: set[str], image: str
) -> tuple[list[dict[str, Any]], dict[str, bytes], list[str]]:
    """(actions, new contents by target path, errors). An action: {"name", "places",
    "target", "status", and once transformed "target_path", "stock_sha256", "applied_sha256",
    "pinned"}."""
    actions: list[dict[str, Any]] = []
    contents: dict[str, bytes] = {}
    errors: list[str] = []
    names = {e.get("name") for e in manifest.get("patches", [])}
    for unknown in sorted(skip - names):
        errors.append(f"--skip names unknown patch {unknown!r}")
    for entry in manifest.get("patches", []):
        name = entry.get("name", "?")
        act = {"name": name, "places": entry.get("places"), "target": entry.get("target"),
               "status": "pending"}  # fmt: skip
        actions.append(act)
        if name in skip:
            act["status"] = "skipped"
            continue
        if vllm_dir is None:
            problems = [f"no vllm package in image {image} to patch"]
        else:
            target = os.path.join(vllm_dir, entry.get("target", ""))
            act["target_path"] = target
            record, new, problems = transform(entry, here, target, image)
            act.update(record)
            contents[target] = new
        if problems:
            act["status"] = "error" if entry.get("required", True) else "not-applicable"
            if act["status"] == "error":
                errors += [f"patch {name}: {p}" for p in problems]
            continue
        act["status"] = "ready"
    return actions, contents, errors


def apply(actions: list[dict[str, Any]], contents: dict[str, bytes]) -> None:
    for act in actions:
        if act["status"] != "ready":
            continue
        with open(act["target_path"], "wb") as fh:
            fh.write(contents[act["target_path"]])
        act["status"] = "applied"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--skip", default="", help="comma-separated patch names not to apply")
    ap.add_argument("--vllm-dir", help="vllm package directory (default: found on sys.path)")
    ap.add_argument("--image", default="(unnamed)", help="the base image, for the messages")
    ap.add_argument("--manifest", default=os.path.join(HERE, "manifest.json"))
    ap.add_argument("--dry-run", action="store_true")
    a = ap.parse_args(argv)
    here = os.path.dirname(os.path.abspath(a.manifest))
    with open(a.manifest) as fh:
        manifest = json.load(fh)
    skip = {s.strip() for s in a.skip.split(",") if s.strip()}
    needs_vllm = any(e.get("name") not in skip for e in manifest.get("patches", []))
    vllm_dir = a.vllm_dir or (find_vllm_dir() if needs_vllm else None)
    actions, contents, errors = plan(manifest, here, vllm_dir, skip, a.image)
    for err in errors:
        print(f"apply_patches: FAIL: {err}", file=sys.stderr)
    if errors:
        print(f"apply_patches: refusing to build a half-patched image from {a.image}",
              file=sys.stderr)  # fmt: skip
        return 1
    if not a.dry_run:
        apply(actions, contents)
        with open(os.path.join(here, "APPLIED.json"), "w") as fh:
            json.dump({"vllm_dir": vllm_dir, "image": a.image, "patches": actions}, fh,
                      indent=2, sort_keys=True)  # fmt: skip
    for act in actions:
        sums = ""
        if "applied_sha256" in act:
            pin = "pinned" if act["pinned"] else "UNPINNED base file, result recorded"
            sums = f" ({act['stock_sha256']} -> {act['applied_sha256']}, {pin})"
        print(f"apply_patches: {act['name']}: {act['status']}{sums}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
