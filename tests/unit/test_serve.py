"""The copy server (files/sparkhost/serve.py): what a stranger on the fabric cannot make it do
(issue 48): follow a symlink out of the served directory, choke on a %00, hold connections
without end or beyond its cap."""

from __future__ import annotations

import argparse
import http.client
import socket
import threading
import time
from pathlib import Path

import pytest
from sparkhost import serve


@pytest.fixture
def served(tmp_path: Path, monkeypatch):
    root = tmp_path / "weights"
    (root / "rev").mkdir(parents=True)
    (root / "rev" / "model.safetensors").write_bytes(b"w" * 100)
    secret = tmp_path / "secret"
    secret.write_text("key")
    (root / "rev" / "link").symlink_to(secret)
    monkeypatch.setattr(serve.ServeHandler, "timeout", 4.0)
    monkeypatch.setattr(serve, "MAX_CONNECTIONS", 2)
    args = argparse.Namespace(dir=str(root), listen="127.0.0.1:0", lock=None, lock_in=[],
                              bind_device=None)  # fmt: skip
    (srv,) = serve.make_servers(args)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv.server_address[1]
    srv.shutdown()
    srv.server_close()


def get(port: int, path: str) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    conn.request("GET", path)
    status = conn.getresponse().status
    conn.close()
    return status


def test_a_symlink_is_not_followed_and_a_nul_is_a_bad_request(served):
    assert get(served, "/rev/model.safetensors") == 200
    assert get(served, "/rev/link") == 404
    assert get(served, "/rev/model.safetensors%00.txt") == 400
    assert get(served, "/rev/model.safetensors") == 200  # the handler lives on


def test_idle_connections_are_closed_and_the_cap_turns_the_rest_away(served):
    idle = [socket.create_connection(("127.0.0.1", served)) for _ in range(2)]
    time.sleep(0.3)
    extra = socket.create_connection(("127.0.0.1", served))
    extra.settimeout(2)  # half the idle timeout: it is not waiting for a slot
    assert extra.recv(1) == b""  # over the cap: closed at once, nothing read
    extra.close()
    for conn in idle:  # idle past the timeout: closed by the server
        conn.settimeout(8)
        assert conn.recv(1) == b""
        conn.close()
    time.sleep(0.2)
    assert get(served, "/rev/model.safetensors") == 200  # the slots came back
