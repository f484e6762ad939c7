"""The pair helpers' servers against a stranger's connections (files/sparkhost/helperhttp.py),
with real sockets on loopback: idle connections by the thousand, a slow one, a signed request
that must not be pushed out, and a reload's drain."""

from __future__ import annotations

import socket
import threading
import time
import urllib.request

import pytest
from sparkhost import pair, pairmac
from sparkhost.helperhttp import GuardedServer, Handler

KEY = pairmac.derive("0123456789abcdef" * 3)


@pytest.fixture
def beacon(monkeypatch):
    """The stop-together beacon (sparkhost.pair) on loopback, its container running."""
    monkeypatch.setattr(pair.Beacon, "container", "rank0")
    monkeypatch.setattr(pair.Beacon, "running", True)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    server = pair.beacon_server(sock)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server, sock.getsockname()[1]
    server.shutdown()
    server.server_close()


def open_idle(port: int, n: int) -> list[socket.socket]:
    return [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(n)]


def live(server: GuardedServer) -> int:
    with server.guard:
        return len(server.unsettled) + len(server.settled)


def until(done) -> None:
    deadline = time.monotonic() + 30
    while not done():
        assert time.monotonic() < deadline, "never happened"
        time.sleep(0.01)


def test_a_thousand_idle_connections_do_not_starve_the_peers_probes(beacon):
    server, port = beacon
    idle = open_idle(port, 1000)
    try:
        # every probe answered while the thousand are still open on the stranger's side
        assert [pair.beacon_up("127.0.0.1", port) for _ in range(20)] == [True] * 20
        assert live(server) <= 64  # descriptors and threads bounded (the facts sheet's cap)
    finally:
        for s in idle:
            s.close()


def test_an_idle_or_slow_connection_is_closed_after_the_handler_timeout(beacon, monkeypatch):
    helpers = (pair.Beacon, pair.Agent, pair.Supervisor)
    assert [h.timeout for h in helpers] == [10.0] * 3  # what the test shortens below
    monkeypatch.setattr(Handler, "timeout", 0.5)
    _, port = beacon
    with socket.create_connection(("127.0.0.1", port), timeout=30) as slow:
        slow.sendall(b"GET / HTTP/1.0\r\n")  # and nothing more (slowloris)
        assert slow.recv(100) == b""  # the server hung up, with nothing to say


class Slow(Handler):
    """A signed POST carried out until ``go`` is set (an agent's /stop waiting for systemd)."""

    go = threading.Event()
    verifier = pairmac.Verifier(KEY)

    def do_POST(self) -> None:  # noqa: N802
        if self.signed():
            self.go.wait(60)
            self.answer(202)


def test_a_signed_request_being_carried_out_is_never_pushed_out_by_a_flood():
    server = GuardedServer(("127.0.0.1", 0), Slow)
    port = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    result: list[int] = []
    req = pair.signed_post("127.0.0.1", port, "/stop", KEY)
    caller = threading.Thread(
        target=lambda: result.append(urllib.request.urlopen(req, timeout=60).status), daemon=True
    )
    caller.start()
    idle: list[socket.socket] = []
    try:
        until(lambda: bool(server.settled))  # the server carries the request out
        idle = open_idle(port, 300)
        Slow.go.set()
        caller.join(60)
        assert result == [202]
    finally:
        Slow.go.set()
        for s in idle:
            s.close()
        server.shutdown()
        server.server_close()


def test_a_reload_drains_the_connections_and_pushes_out_the_idle_ones(beacon):
    server, port = beacon
    idle = open_idle(port, 5)
    try:
        until(lambda: live(server) == 5)  # accepted
        server.shutdown()
        server.drain(grace=0.1, timeout=3)  # the idle ones would wait out their 10 s
        assert live(server) == 0
        assert [s.recv(10) for s in idle] == [b""] * 5
    finally:
        for s in idle:
            s.close()
        threading.Thread(target=server.serve_forever, daemon=True).start()  # the fixture's end
