"""The API front with a REAL nginx on loopback (docs/front.md): the site the deploy renders
(templates/sparkrig-api.conf.j2) and the key include (sparkrig/front.py), loaded by an unprivileged
nginx under a temp prefix, in front of a tiny upstream standing in for the engine. Every route but
GET /health needs the key; streaming arrives unbuffered; CORS only for a named origin; a key is
never in nginx's argv. nginx is the distribution's (scripts/install-deps.sh installs it)."""

from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from serving_helpers import REPO, free_port, load_path
from sparkhost import gate

from sparkrig import front, fronttls
from sparkrig.config.inventory import build
from sparkrig.config.model import Settings

NGINX = shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None)
pytestmark = pytest.mark.skipif(NGINX is None, reason="nginx not installed (install-deps.sh)")

KEY = "0123456789abcdef" * 3  # a key as sparkrig makes one (secrets.token_hex(24))
ORIGIN = "https://app.example.org"
OPEN_ROUTES = ("/invocations", "/tokenize", "/v1/models", "/metrics", "/docs")
# How long the engine's stream waits for the client to read an event, and the client for the
# next one: bounds on a hang, never a speed to meet (a held event fails at READ_WAIT_S)
STREAM_WAIT_S, READ_WAIT_S = 60.0, 30.0


def settings(**knobs: Any) -> Settings:
    """A pair's head; plain HTTP unless the test asks for TLS (the routes are the same)."""
    unit = load_path("unit_conftest", REPO / "tests" / "unit" / "conftest.py")
    knobs.setdefault("api_tls", "tls_cert" in knobs)
    return build(unit.cluster(2, **knobs))["spark-0"]


class Engine:
    """The engine's stand-in on 127.0.0.1: answers every route 200 (as vLLM answers /invocations,
    /tokenize, /metrics and /docs without its key), says CORS '*' (the front must hide it),
    streams /v1/stream as three SSE events, each after the client said it read the one before
    (``client_read``), and records what reached it."""

    def __init__(self, port: int) -> None:
        seen = self.seen = []  # type: list[tuple[str, str, str | None]]
        # released by the test per event it read: the stream's next event waits on it, so an
        # event held by the front never lets the stream go on (no clock decides)
        client_read = self.client_read = threading.Semaphore(0)

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                seen.append((self.command, self.path, self.headers.get("Authorization")))
                if self.path == "/v1/stream":
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    for i in range(3):
                        data = f"data: {i}\n\n".encode()
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                        self.wfile.flush()
                        if i < 2:  # the stream ends without the client after STREAM_WAIT_S
                            client_read.acquire(timeout=STREAM_WAIT_S)
                    self.wfile.write(b"0\r\n\r\n")
                    return
                body = json.dumps({"path": self.path}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Access-Control-Allow-Origin", "*")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_OPTIONS = _answer  # noqa: N815

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Front:
    """nginx under a temp prefix with the rendered site, its paths moved into the prefix."""

    def __init__(
        self,
        tmp: Path,
        s: Settings,
        tls: tuple[Path, Path] | None = None,
        edit: Callable[[str], str] | None = None,
    ) -> None:
        paths = front.front_paths(s)
        site = front.site_text(s)
        key_include = tmp / "api-front-key.conf"
        key_include.write_text(front.key_include_text(KEY))
        key_include.chmod(0o600)
        site = site.replace(paths["key_include"], str(key_include))
        if tls:
            site = site.replace(paths["tls_cert"], str(tls[0]))
            site = site.replace(paths["tls_key"], str(tls[1]))
        site = edit(site) if edit else site  # a test's own addresses and paths
        listen = re.search(r"listen (?:([\d.]+):)?(\d+)", site)
        host = listen[1] if listen and listen[1] else "127.0.0.1"
        (tmp / "site.conf").write_text(site)
        temp = tmp / "temp"
        temp.mkdir()
        user = "user root;\n" if os.geteuid() == 0 else ""
        (tmp / "nginx.conf").write_text(
            f"{user}worker_processes 1;\nevents {{ worker_connections 256; }}\n"
            "http {\n    access_log off;\n"
            + "".join(f"    {kind}_temp_path {temp}/{kind};\n"
                      for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
            + f"    include {tmp}/site.conf;\n}}\n"
        )  # fmt: skip
        self.argv = [
            str(NGINX), "-p", str(tmp), "-c", str(tmp / "nginx.conf"),
            "-g", f"daemon off; pid {tmp}/nginx.pid; error_log {tmp}/error.log notice;",
        ]  # fmt: skip
        check = subprocess.run([*self.argv[:5], "-t", "-g", self.argv[-1]], capture_output=True,
                               text=True)  # fmt: skip
        assert check.returncode == 0, check.stderr
        self.log = tmp / "error.log"
        self.proc = subprocess.Popen(self.argv, stderr=subprocess.PIPE, text=True)
        port, deadline = s.knobs.api_port, time.monotonic() + 10
        while time.monotonic() < deadline:
            with socket.socket() as c:
                if c.connect_ex((host, port)) == 0:
                    return
            assert self.proc.poll() is None, self.proc.stderr.read() if self.proc.stderr else ""
            time.sleep(0.05)
        raise AssertionError("nginx did not listen")

    def reload(self) -> None:
        """``systemctl reload nginx``'s signal; returns once the new workers run."""
        before = self.log.read_text().count("start worker process")
        self.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while self.log.read_text().count("start worker process") <= before:
            assert time.monotonic() < deadline, self.log.read_text()[-2000:]
            time.sleep(0.05)
        # and the old worker gone: until it exits it serves its open connections as before
        while len(self.workers()) > 1:
            assert time.monotonic() < deadline, self.workers()
            time.sleep(0.05)

    def workers(self) -> list[str]:
        """The master's children (its worker processes)."""
        children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children")
        return children.read_text().split()

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def ask(
    port: int,
    path: str,
    method: str = "GET",
    key: str | None = None,
    origin: str | None = None,
    tls: bool = False,
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, str], bytes]:
    if tls:
        ctx = ssl.create_default_context()
        ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
        conn: http.client.HTTPConnection = http.client.HTTPSConnection(
            "127.0.0.1", port, timeout=10, context=ctx
        )
    else:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    sent = dict(headers or {})
    if key is not None:
        sent["Authorization"] = key
    if origin is not None:
        sent["Origin"] = origin
    body = b"{}" if method == "POST" else None
    conn.request(method, path, body=body, headers=sent)
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    return resp.status, {k.lower(): v for k, v in resp.getheaders()}, data


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[tuple[Engine, int]]:
    api, engine_port = free_port(), free_port()
    engine = Engine(engine_port)
    s = settings(api_port=api, engine_port=engine_port, api_cors_origins=[ORIGIN])
    nginx = Front(tmp_path, s)
    yield engine, api
    nginx.stop()
    engine.close()


def test_every_route_but_health_needs_the_key(stack: tuple[Engine, int]) -> None:
    engine, port = stack
    for path in OPEN_ROUTES:
        method = "POST" if path in ("/invocations", "/tokenize") else "GET"
        for key in (None, "Bearer wrong", f"Bearer {KEY}x", f"Bearer {KEY.upper()}", KEY,
                    f"Basic {KEY}", f"Bearer  {KEY}"):  # fmt: skip
            status, headers, body = ask(port, path, method, key)
            assert status == 401, (path, key)
            assert json.loads(body) == {"error": "Unauthorized"}
        assert ask(port, path, method, f"Bearer {KEY}")[0] == 200, path
        assert ask(port, path, method, f"bearer {KEY}")[0] == 200, path  # scheme: any case
    assert {p for _, p, _ in engine.seen} == set(OPEN_ROUTES)  # refused ones never reached it
    engine.seen.clear()
    assert ask(port, "/health")[0] == 200  # plain health: no key
    assert ask(port, "/health", key="Bearer wrong")[0] == 200
    assert engine.seen == [("GET", "/health", None), ("GET", "/health", None)]  # header dropped
    assert ask(port, "/health", "POST")[0] == 403  # only GET (and HEAD) is open
    assert ask(port, "/health/x")[0] == 401 and ask(port, "/healthz")[0] == 401


@pytest.mark.parametrize(
    "path",
    ["/metrics/../health", "/metrics%2F..%2Fhealth", "/v1/../health", "/metrics/./../health"],
)
def test_a_path_that_normalises_to_health_reaches_health_itself(
    stack: tuple[Engine, int], path: str
) -> None:
    """Issue 48: nginx matches `location = /health` on the normalised path; the engine must
    receive /health itself, never the raw path its /metrics route would answer without a key."""
    engine, port = stack
    engine.seen.clear()
    status, _, _ = ask(port, path)
    assert all(seen == "/health" for _, seen, _ in engine.seen), engine.seen
    assert status in (200, 400, 401), status


def test_every_spelling_around_a_keyed_route_is_refused_and_reaches_nothing(
    stack: tuple[Engine, int],
) -> None:
    """What the locked gate tries (sparkhost gate LOCKED_SPELLINGS), and other spellings: a
    path with '..' or an encoded '.', '/' or NUL gets a 400 of the front before any location
    (sparkrig's, or nginx's own for a path that climbs above the root), with the key or
    without, and the locked gate counts it refused; the engine sees none. A query string is not
    judged."""
    from sparkhost.gate import LOCKED_SPELLINGS, REFUSED_PATH, refused

    engine, port = stack
    engine.seen.clear()
    for path in (*LOCKED_SPELLINGS, "/v1/models/%2E%2E/%2e%2e/metrics", "/invocations/.."):
        for key in (None, f"Bearer {KEY}"):
            status, _, body = ask(port, path, key=key)
            assert status == 400, (path, key, status)
        if path in LOCKED_SPELLINGS:
            assert refused(path, status, body.decode()), (path, body)
    said = ask(port, "/metrics/../health")[2]
    assert json.loads(said) == {"error": REFUSED_PATH}  # sparkrig's refusal, as JSON
    assert engine.seen == []
    assert ask(port, "/v1/models?after=a%2Fb..c", key=f"Bearer {KEY}")[0] == 200


def test_streaming_chunks_arrive_unbuffered(stack: tuple[Engine, int]) -> None:
    """Each SSE event reaches the client while the stream is still open: the engine sends the
    next event only once the client has read the one before, so a front that held events back
    (until its buffer filled or the response ended) leaves the client waiting for the first one
    and the engine waiting for the client. (nginx 1.22 passed them on in time here with
    proxy_buffering on too, so the site's directives are also checked as text:
    tests/unit/test_front.py.)"""
    engine, port = stack
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=READ_WAIT_S)
    conn.request("GET", "/v1/stream", headers={"Authorization": f"Bearer {KEY}"})
    resp = conn.getresponse()
    assert resp.status == 200
    arrived = []
    for i in range(3):
        try:
            line = resp.fp.readline()
            while (
                line in (b"\r\n", b"\n") or line.strip().isalnum() and not line.startswith(b"data")
            ):
                line = resp.fp.readline()  # chunk sizes and blank lines
        except TimeoutError:
            raise AssertionError(
                f"event {i} never reached the client while the engine waited for it to be read "
                f"(got {arrived}): the front holds the stream back"
            ) from None
        arrived.append(line.strip())
        engine.client_read.release()
    conn.close()
    assert arrived == [b"data: 0", b"data: 1", b"data: 2"]


def test_cors_only_for_a_named_origin(stack: tuple[Engine, int]) -> None:
    _, port = stack
    key = f"Bearer {KEY}"
    preflight = {"Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "authorization"}  # fmt: skip
    status, headers, _ = ask(port, "/v1/models", "OPTIONS", origin=ORIGIN, headers=preflight)
    assert status == 204 and headers["access-control-allow-origin"] == ORIGIN
    assert "Authorization" in headers["access-control-allow-headers"]
    status, headers, _ = ask(port, "/v1/models", key=key, origin=ORIGIN)
    assert status == 200 and headers["access-control-allow-origin"] == ORIGIN  # not the '*'
    foreign = "https://evil.example.net"
    status, headers, _ = ask(port, "/v1/models", "OPTIONS", origin=foreign, headers=preflight)
    assert status == 401 and "access-control-allow-origin" not in headers
    status, headers, _ = ask(port, "/v1/models", key=key, origin=foreign)
    assert status == 200 and "access-control-allow-origin" not in headers  # engine's '*' hidden
    status, headers, _ = ask(port, "/v1/models", key=key)
    assert "access-control-allow-origin" not in headers


def test_no_cors_unless_origins_are_named(tmp_path: Path) -> None:
    api, engine_port = free_port(), free_port()
    engine = Engine(engine_port)
    nginx = Front(tmp_path, settings(api_port=api, engine_port=engine_port))
    try:
        status, headers, _ = ask(api, "/v1/models", "OPTIONS", origin=ORIGIN)
        assert status == 401 and "access-control-allow-origin" not in headers
        status, headers, _ = ask(api, "/v1/models", key=f"Bearer {KEY}", origin=ORIGIN)
        assert status == 200 and "access-control-allow-origin" not in headers
    finally:
        nginx.stop()
        engine.close()


def test_api_auth_off_keeps_the_front_without_a_key_check(tmp_path: Path) -> None:
    api, engine_port = free_port(), free_port()
    engine = Engine(engine_port)
    s = settings(api_port=api, engine_port=engine_port, api_auth=False)
    assert "api-front-key.conf" not in front.site_text(s)
    nginx = Front(tmp_path, s)
    try:
        assert ask(api, "/invocations", "POST")[0] == 200
        assert ask(api, "/v1/models")[0] == 200
    finally:
        nginx.stop()
        engine.close()


def test_the_key_is_in_no_argv_and_the_include_is_private(stack: tuple[Engine, int]) -> None:
    out = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert "nginx" in out and KEY not in out


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl not installed")
def test_tls_when_a_certificate_is_given(tmp_path: Path) -> None:
    cert, key = tmp_path / "api.crt", tmp_path / "api.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=localhost",
         "-days", "1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    api, engine_port = free_port(), free_port()
    engine = Engine(engine_port)
    s = settings(api_port=api, engine_port=engine_port, tls_cert=str(cert), tls_key=str(key))
    assert front.tls_text(str(cert), "tls_cert").startswith("-----BEGIN")
    nginx = Front(tmp_path, s, tls=(cert, key))
    try:
        assert ask(api, "/invocations", "POST", tls=True)[0] == 401
        assert ask(api, "/invocations", "POST", key=f"Bearer {KEY}", tls=True)[0] == 200
        assert ask(api, "/health")[0] == 400  # plain HTTP on the TLS port: nginx refuses it
    finally:
        nginx.stop()
        engine.close()


def verified(port: int, ca: Path, path: str, key: str | None = None) -> int:
    """The status of GET ``path`` over https to 127.0.0.1, the certificate checked against
    ``ca`` with its host name, as curl --cacert and requests(verify=ca) check it."""
    ctx = ssl.create_default_context(cafile=str(ca))
    conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=10, context=ctx)
    conn.request("GET", path, headers={"Authorization": key} if key else {})
    status = conn.getresponse().status
    conn.close()
    return status


def test_https_by_default_with_the_pairs_ca(tmp_path: Path) -> None:
    api, engine_port = free_port(), free_port()
    engine = Engine(engine_port)
    s = settings(api_port=api, engine_port=engine_port, api_tls=True)
    assert s.knobs.api_tls and s.knobs.tls_cert is None
    files = fronttls.TlsFiles(tmp_path / "tls")
    made = fronttls.decide(files, fronttls.tls_names(s), "spark-0", False, False)
    assert "made the pair's CA" in made.said and not made.problem
    nginx = Front(tmp_path, s, tls=(files.cert, files.key))
    try:
        assert verified(api, files.ca_cert, "/v1/models") == 401
        assert verified(api, files.ca_cert, "/v1/models", f"Bearer {KEY}") == 200
        # the head's own gates: the host package's client with --ca-file
        context = gate.tls_context(str(files.ca_cert))
        assert gate.http(f"https://127.0.0.1:{api}/health", context=context)[0] == 200
        # another CA's clients are turned away: the certificate is the pair's, not anyone's
        other = fronttls.TlsFiles(tmp_path / "other")
        fronttls.decide(other, fronttls.tls_names(s), "elsewhere", False, False)
        with pytest.raises(ssl.SSLCertVerificationError):
            verified(api, other.ca_cert, "/health")
        assert gate.http(f"https://127.0.0.1:{api}/health")[0] == 0  # the system's trust: no
    finally:
        nginx.stop()
        engine.close()


def test_a_key_that_is_not_a_bearer_token_is_refused() -> None:
    for bad in ("", "a b", 'x"y', "k;ey", "k$ey", "k\\ey"):
        with pytest.raises(ValueError, match="Bearer token"):
            front.key_include_text(bad)
    text = front.key_include_text("a.b+c/d=")
    assert '"~^(?i:bearer) a\\.b\\+c/d=$" 1;' in text
