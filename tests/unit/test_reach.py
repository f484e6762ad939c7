"""The head's reach probe, run by a real python3 against loopback servers: any HTTP answer is
reached (a 404, a plain-HTTP registry behind an https:// URL), a refused connection is not; and
which registry docker pulls an image from."""

from __future__ import annotations

import http.server
import subprocess
import sys
import threading

import pytest

from sparkrig.hostpkg import PYTHON
from sparkrig.reach import DOCKER_HUB, Reach, reach_problems, registry_of


@pytest.fixture
def plain_http():
    """A loopback HTTP server that answers every request 501 (it has no method handlers)."""
    server = http.server.HTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_port
    server.shutdown()


def reach(*urls: str):
    fact = Reach()
    command = fact.command(urls=urls).get_raw_value().replace(PYTHON, sys.executable, 1)
    done = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True)
    return fact.process(done.stdout.splitlines())


def test_any_http_answer_is_reached_and_a_refused_connection_is_not(plain_http):
    closed = "http://127.0.0.1:1/v2/"
    answered, https_first, refused = reach(
        f"http://127.0.0.1:{plain_http}/api/models/a/b",
        f"https://127.0.0.1:{plain_http}/v2/",  # a plain-HTTP registry: TLS fails, HTTP answers
        closed,
    )
    assert answered.ok and answered.said == "501"
    assert https_first.ok and https_first.said == "501 over http"
    assert not refused.ok and "refused" in refused.said
    (problem,) = reach_problems({closed: "the base image x from its registry"}, (refused,))
    assert problem.startswith(f"the head does not reach {closed} ({refused.said}) and must ")


@pytest.mark.parametrize(
    ("image", "registry"),
    [
        ("ghcr.io/tonyd2wild/vllm-glm53-flash@sha256:" + "0" * 64, "ghcr.io"),
        ("192.168.1.5:5000/vllm@sha256:" + "0" * 64, "192.168.1.5:5000"),
        ("localhost/vllm@sha256:" + "0" * 64, "localhost"),
        ("vllm/vllm-openai@sha256:" + "0" * 64, DOCKER_HUB),
        ("ubuntu@sha256:" + "0" * 64, DOCKER_HUB),
    ],
)
def test_the_registry_is_the_one_docker_pulls_from(image, registry):
    assert registry_of(image) == registry
