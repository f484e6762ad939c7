"""Patch applier for the sparkrig image build (runs inside `docker build`, stdlib only).

Reads manifest.json beside it. Each entry names a drop-in file (``source``, relative to this
directory), the file of the installed vLLM package it replaces (``target``, relative to the
package directory), the pinned ``sha256`` of the source and whether it is ``required``.

Fails closed (exit 1, one clear line per problem) when a required entry's source file is missing,
has no pinned sha256 or a different one, or when its target does not exist in the base image (a
wrong base image must not be patched "successfully"). The stock file's sha256 is recorded next to
the new one in APPLIED.json. Entries named in --skip are not applied and are recorded as skipped.

    python3 apply_patches.py [--skip name,name] [--vllm-dir DIR] [--dry-run]
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import shutil
import sys
from collections.abc import Sequence
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def find_vllm_dir() -> str | None:
    """The installed vllm package directory, found without importing vllm (no CUDA at build)."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return None
    return str(list(spec.submodule_search_locations)[0])


def plan(
    manifest: dict[str, Any], here: str, vllm_dir: str | None, skip: set[str]
) -> tuple[list[dict[str, Any]], list[str]]:
    """(actions, errors). An action: {"name", "source", "target", "sha256", "status"}."""
    actions: list[dict[str, Any]] = []
    errors: list[str] = []
    names = {e.get("name") for e in manifest.get("patches", [])}
    for unknown in sorted(skip - names):
        errors.append(f"--skip names unknown patch {unknown!r}")
    for entry in manifest.get("patches", []):
        name = entry.get("name", "?")
        src = os.path.join(here, entry.get("source", ""))
        act = {"name": name, "source": entry.get("source"), "target": entry.get("target"),
               "sha256": entry.get("sha256"), "status": "pending"}  # fmt: skip
        actions.append(act)
        if name in skip:
            act["status"] = "skipped"
            continue
        required = bool(entry.get("required", True))
        problems = []
        if not os.path.isfile(src):
            problems.append(
                f"patch {name}: drop-in file {entry.get('source')} is missing "
                f"(see {os.path.dirname(entry.get('source', ''))}/README.md)"
            )
        elif not entry.get("sha256"):
            problems.append(f"patch {name}: manifest.json pins no sha256 for {entry.get('source')}")
        elif sha256_file(src) != entry["sha256"]:
            problems.append(
                f"patch {name}: {entry.get('source')} sha256 {sha256_file(src)} != pinned "
                f"{entry['sha256']}"
            )
        if vllm_dir is None:
            problems.append(f"patch {name}: no vllm package in this image to patch")
        else:
            target = os.path.join(vllm_dir, entry.get("target", ""))
            act["target_path"] = target
            if not os.path.isfile(target):
                problems.append(
                    f"patch {name}: target {target} not in the base image (wrong base?)"
                )
        if problems:
            if required:
                errors += problems
                act["status"] = "error"
            else:
                act["status"] = "not-applicable"
            continue
        act["status"] = "ready"
    return actions, errors


def apply(actions: list[dict[str, Any]], here: str) -> None:
    for act in actions:
        if act["status"] != "ready":
            continue
        target = act["target_path"]
        act["stock_sha256"] = sha256_file(target)
        shutil.copyfile(os.path.join(here, act["source"]), target)
        act["applied_sha256"] = sha256_file(target)
        act["status"] = "applied"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--skip", default="", help="comma-separated patch names not to apply")
    ap.add_argument("--vllm-dir", help="vllm package directory (default: found on sys.path)")
    ap.add_argument("--manifest", default=os.path.join(HERE, "manifest.json"))
    ap.add_argument("--dry-run", action="store_true")
    a = ap.parse_args(argv)
    here = os.path.dirname(os.path.abspath(a.manifest))
    with open(a.manifest) as fh:
        manifest = json.load(fh)
    skip = {s.strip() for s in a.skip.split(",") if s.strip()}
    needs_vllm = any(e.get("name") not in skip for e in manifest.get("patches", []))
    vllm_dir = a.vllm_dir or (find_vllm_dir() if needs_vllm else None)
    actions, errors = plan(manifest, here, vllm_dir, skip)
    for err in errors:
        print(f"apply_patches: FAIL: {err}", file=sys.stderr)
    if errors:
        print("apply_patches: refusing to build a half-patched image", file=sys.stderr)
        return 1
    if not a.dry_run:
        apply(actions, here)
        with open(os.path.join(here, "APPLIED.json"), "w") as fh:
            json.dump({"vllm_dir": vllm_dir, "patches": actions}, fh, indent=2, sort_keys=True)
    for act in actions:
        print(f"apply_patches: {act['name']}: {act['status']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
