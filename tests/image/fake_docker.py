#!/usr/bin/env python3
"""A tiny stand-in for the docker CLI, enough for sparkrig's image commands (tests only).

State: $FAKE_DOCKER_STATE (JSON: {"images": {id: image}, "tags": {ref: id}}). The registry:
$FAKE_DOCKER_REGISTRY (JSON: {ref: image}); every call is appended to $FAKE_DOCKER_LOG.
An image: {"os", "arch", "layers": [...], "digests": [...]}. `save` writes the image as JSON
(RepoDigests dropped, as a real save/load does). An image may carry "files" ({path under the
vllm package: text}); `build` runs the context's patch applier on a copy of them as the
Dockerfile's RUN line does (--image BASE, the SPARKRIG_SKIP_PATCHES build arg), so a patch that
does not fit the base fails the build, and the built image holds the patched files.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from typing import Any


def load() -> dict[str, Any]:
    path = os.environ["FAKE_DOCKER_STATE"]
    if not os.path.exists(path):
        return {"images": {}, "tags": {}}
    with open(path) as fh:
        return json.load(fh)


def save(state: dict[str, Any]) -> None:
    with open(os.environ["FAKE_DOCKER_STATE"], "w") as fh:
        json.dump(state, fh)


def image_id(img: dict[str, Any]) -> str:
    body = json.dumps({k: img[k] for k in ("os", "arch", "layers", "extra") if k in img})
    return "sha256:" + hashlib.sha256((body + os.environ["FAKE_DOCKER_STATE"]).encode()).hexdigest()


def resolve(state: dict[str, Any], ref: str) -> str | None:
    if ref in state["tags"]:
        return state["tags"][ref]
    for ident, img in state["images"].items():
        if ref in img.get("digests", []):
            return ident
    return None


def render(fmt: str, ident: str, img: dict[str, Any], tags: list[str]) -> str:
    out = fmt.replace("{{.Id}}", ident).replace("{{.Os}}", img["os"])
    out = out.replace("{{.Architecture}}", img["arch"])
    # what docker 26 accepts: range, not join (it hands templates []interface{})
    out = out.replace(
        "{{range .RootFS.Layers}}{{.}},{{end}}", "".join(f"{x}," for x in img["layers"])
    )
    digests = img.get("digests", [])
    out = out.replace("{{range .RepoDigests}}{{.}},{{end}}", "".join(f"{x}," for x in digests))
    return out.replace("{{range .RepoTags}}{{.}},{{end}}", "".join(f"{x}," for x in tags))


def opt(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


def main(argv: list[str]) -> int:
    with open(os.environ["FAKE_DOCKER_LOG"], "a") as fh:
        fh.write(" ".join(argv) + "\n")
    state = load()
    cmd = argv[:2]
    if cmd[0] == "version":
        print("26.1.5")
        return 0
    if cmd[0] == "buildx":
        return 1
    if cmd == ["image", "inspect"]:  # as docker 26: a line per image found, in order
        fmt = opt(argv, "--format")
        refs = argv[4:] if fmt is not None else argv[2:]
        missing = 0
        for ref in refs:
            ident = resolve(state, ref)
            if ident is None:
                print(f"Error response from daemon: No such image: {ref}", file=sys.stderr)
                missing += 1
                continue
            tags = sorted(t for t, i in state["tags"].items() if i == ident)
            print(render(fmt or "{{.Id}}", ident, state["images"][ident], tags))
        return 1 if missing else 0
    if cmd == ["image", "ls"]:
        repo = argv[-1]
        for ref in sorted(state["tags"]):
            if ref.rpartition(":")[0] == repo:
                print(ref)
        return 0
    if cmd == ["image", "rm"]:
        if argv[2] not in state["tags"]:
            print(f"Error: No such image: {argv[2]}", file=sys.stderr)
            return 1
        del state["tags"][argv[2]]
        save(state)
        return 0
    if cmd[0] == "pull":
        ref = argv[-1]
        with open(os.environ["FAKE_DOCKER_REGISTRY"]) as fh:
            registry = json.load(fh)
        if ref not in registry:
            print(f"Error: {ref} not found", file=sys.stderr)
            return 1
        img = dict(registry[ref], digests=[ref])
        state["images"][image_id(img)] = img
        save(state)
        return 0
    if cmd[0] == "tag":
        ident = resolve(state, argv[1])
        if ident is None:
            return 1
        state["tags"][argv[2]] = ident
        save(state)
        return 0
    if cmd[0] == "save":
        if "--help" in argv:
            print("Usage:  docker save [OPTIONS] IMAGE [IMAGE...]\n  -o, --output string")
            return 0
        ref, out = argv[-1], opt(argv, "-o")
        ident = resolve(state, ref)
        if ident is None or out is None:
            return 1
        img = {k: v for k, v in state["images"][ident].items() if k != "digests"}
        with open(out, "w") as fh:
            json.dump({"tag": ref, "image": img}, fh)
        return 0
    if cmd[0] == "load":
        with open(opt(argv, "-i") or "") as fh:
            data = json.load(fh)
        img = data["image"]
        ident = image_id(img)
        state["images"].setdefault(ident, img)
        state["tags"][data["tag"]] = ident
        save(state)
        return 0
    if cmd[0] == "build":
        if os.environ.get("DOCKER_BUILDKIT") != "0":
            print("ERROR: BuildKit is enabled but the buildx component is missing", file=sys.stderr)
            return 1
        args = dict(a.split("=", 1) for a in argv if "=" in a and not a.startswith("-"))
        base = resolve(state, args.get("BASE", ""))
        if base is None:
            print("pull access denied (the fake has no network)", file=sys.stderr)
            return 1
        img = dict(state["images"][base])
        with tempfile.TemporaryDirectory() as vllm:  # the base image's vllm package
            for rel, body in img.get("files", {}).items():
                os.makedirs(os.path.dirname(os.path.join(vllm, rel)), exist_ok=True)
                with open(os.path.join(vllm, rel), "w") as fh:
                    fh.write(body)
            skip = args.get("SPARKRIG_SKIP_PATCHES", "")
            applier = subprocess.run(  # the Dockerfile's RUN line
                [sys.executable, "patches/apply_patches.py", "--vllm-dir", vllm]
                + ["--image", args.get("BASE", ""), "--skip", skip],
                check=False,
            )
            if applier.returncode:
                return applier.returncode
            files = {}
            for rel in img.get("files", {}):
                with open(os.path.join(vllm, rel)) as fh:
                    files[rel] = fh.read()
        img["files"] = files
        img.pop("digests", None)
        img["layers"] = [*img["layers"], "sha256:" + "33" * 32]
        img["extra"] = args.get("SPARKRIG_TAG", "")
        ident = image_id(img)
        state["images"][ident] = img
        state["tags"][opt(argv, "-t") or ""] = ident
        save(state)
        return 0
    print(f"fake docker: unsupported {argv}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
