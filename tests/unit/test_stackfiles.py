"""sparkrig/stackfiles.py: a stack's own files (sfxnz-v13's chat template) are fetched by the
head at their pinned commit, checked against a known sha256, and mounted read-only into rank 0's
container only; no other rank gets them, and a stack without files adds nothing."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import threading
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from sparkrig import stackfiles
from sparkrig.config.inventory import build
from sparkrig.serving import docker_run_args, smoke_run_args
from sparkrig.stacks import STACKS
from sparkrig.stacks.base import StackFile
from sparkrig.stacks.sfxnz_v13 import CHAT_TEMPLATE
from tests.unit.conftest import cluster

SFXNZ_IMAGE = "registry.example/glm53-sm121-v13@sha256:" + "ef" * 32


def sfxnz(n: int = 2):
    return build(cluster(n, stack="sfxnz-v13", base_image=SFXNZ_IMAGE,
                         drafter_license_accepted=True))  # fmt: skip


def test_sfxnz_declares_its_head_only_chat_template_at_the_pinned_commit():
    assert CHAT_TEMPLATE in STACKS["sfxnz-v13"].files
    assert CHAT_TEMPLATE.url == (
        "https://raw.githubusercontent.com/sfxnz/GLM-5.3-Flash-NVFP4-vLLM-2x-DGX-Spark/"
        "f59cb7cc41c3ee32146782900d87133f538b5d30/chat_template.jinja"
    )
    assert CHAT_TEMPLATE.head_only and CHAT_TEMPLATE.container_path == "/chat_template.jinja"
    assert ("--chat-template", "/chat_template.jinja") == STACKS["sfxnz-v13"].head_flags


@pytest.mark.parametrize("name", sorted(STACKS))
def test_every_declared_stack_file_is_head_only_and_pinned(name):
    assert stackfiles.check(STACKS[name]) == []


def test_a_file_for_every_rank_or_an_unpinned_one_is_refused():
    from dataclasses import replace

    bad = replace(STACKS["sfxnz-v13"], files=(replace(CHAT_TEMPLATE, head_only=False,
                                                      commit="main"),))  # fmt: skip
    problems = stackfiles.check(bad)
    assert len(problems) == 2 and "every rank" in problems[0] and "40-hex" in problems[1]


def test_only_the_head_mounts_the_template_and_only_in_its_serving_container():
    settings = sfxnz(4)  # (3 ranks: refused, 64 heads)
    head = settings["spark-0"]
    dest = stackfiles.host_path(head, CHAT_TEMPLATE)
    assert dest == f"/opt/sparkrig/stack-files/{CHAT_TEMPLATE.commit}/chat_template.jinja"
    mount = f"{dest}:/chat_template.jinja:ro"
    assert mount in docker_run_args(head)
    assert mount not in smoke_run_args(head, "img")  # the smoke test serves no API
    for worker in ("spark-1", "spark-2", "spark-3"):
        args = docker_run_args(settings[worker])
        assert "/chat_template.jinja" not in " ".join(args), worker
        assert stackfiles.mounted(settings[worker]) == []


def test_a_stack_without_files_mounts_nothing_more():
    settings = build(cluster(2))
    assert all(stackfiles.mounted(s) == [] for s in settings.values())
    assert all("stack-files" not in " ".join(docker_run_args(s)) for s in settings.values())


@pytest.fixture
def served(tmp_path: Path):
    """A local HTTP server of tmp_path/www (the raw URL's stand-in)."""
    www = tmp_path / "www"
    www.mkdir()
    handler = partial(SimpleHTTPRequestHandler, directory=str(www))
    handler.log_message = lambda *a: None  # type: ignore[method-assign]
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield www, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def fetch(url: str, dest: Path, sha: str | None) -> subprocess.CompletedProcess[str]:
    cmd = stackfiles.fetch_command(StackFile("t", "o/r", "0" * 40, "t", "/t", sha), str(dest))
    argv = cmd.get_raw_value()
    # the command as the host runs it, with the local server in place of the raw URL
    argv = argv.replace("https://raw.githubusercontent.com/o/r/" + "0" * 40 + "/t", url)
    argv = argv.replace("/usr/bin/python3", sys.executable, 1)
    return subprocess.run(["sh", "-c", argv], capture_output=True, text=True)


def test_the_fetch_checks_a_known_sha256_before_the_file_takes_its_name(served, tmp_path):
    www, base = served
    (www / "t").write_bytes(b"{{ messages }}\n")
    good = hashlib.sha256(b"{{ messages }}\n").hexdigest()
    dest = tmp_path / "files" / "c" / "t.jinja"
    bad = fetch(f"{base}/t", dest, "0" * 64)
    assert bad.returncode != 0 and "the stack declares" in bad.stderr and not dest.exists()
    ok = fetch(f"{base}/t", dest, good)
    assert ok.returncode == 0, ok.stderr
    assert dest.read_bytes() == b"{{ messages }}\n" and f"sha256 {good}" in ok.stdout
    unknown = fetch(f"{base}/t", tmp_path / "u", None)  # no sha declared: fetched, digest said
    assert unknown.returncode == 0 and f"sha256 {good}" in unknown.stdout
    missing = fetch(f"{base}/nope", tmp_path / "n", None)
    assert missing.returncode != 0 and not (tmp_path / "n").exists()
