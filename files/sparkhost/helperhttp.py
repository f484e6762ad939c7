"""The pair helpers' HTTP servers (the beacon, the agent, the supervisor), bounded against a
stranger's idle, slow or unsigned connections.

- A handler gives up on a connection that sends nothing for TIMEOUT_S (slowloris).
- At most MAX_CONNECTIONS are open at once. A connection past the cap closes the oldest one not
  yet settled, so a thousand idle connections cost the peers' probes nothing: each probe pushes
  out one of them. A settled connection (being answered: a probe, or a signed request carried
  out, as an agent's /stop waiting for systemd) is never pushed out; when every slot holds one,
  a new connection is closed at once.
- A POST is carried out only when signed with the pair secret (sparkhost.pairmac).

The units' LimitNOFILE bounds the descriptors of the rest (connections still in the backlog
hold none). Stdlib only."""

from __future__ import annotations

import http.server
import socket
import threading
import time
from typing import Any

from sparkhost import pairmac
from sparkhost.common import bind_device

TIMEOUT_S = 10.0
MAX_CONNECTIONS = 64
MAX_BODY = 4096


class GuardedServer(http.server.ThreadingHTTPServer):
    """ThreadingHTTPServer with a connection cap that pushes out the oldest unsettled one."""

    max_connections = MAX_CONNECTIONS
    request_queue_size = 128
    device = ""  # the netdev the listening socket is bound to (SO_BINDTODEVICE); "": none

    def server_bind(self) -> None:
        if self.device:
            bind_device(self.socket, self.device)
        super().server_bind()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.guard = threading.Lock()
        self.unsettled: dict[Any, None] = {}  # oldest first (dicts keep insertion order)
        self.settled: set[Any] = set()
        super().__init__(*args, **kwargs)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self.guard:
            if len(self.unsettled) + len(self.settled) >= self.max_connections:
                if not self.unsettled:
                    super().shutdown_request(request)  # every slot is doing signed work
                    return
                oldest = next(iter(self.unsettled))
                del self.unsettled[oldest]
                push_out(oldest)
            self.unsettled[request] = None
        super().process_request(request, client_address)

    def settle(self, request: Any) -> None:
        """``request``'s connection is being answered (a probe, a signed request carried out):
        never push it out."""
        with self.guard:
            if request in self.unsettled:  # else pushed out already: its answer fails anyway
                del self.unsettled[request]
                self.settled.add(request)

    def drain(self, grace: float = 1.0, timeout: float = TIMEOUT_S) -> None:
        """Before the program is replaced (a reload, once serve_forever has stopped): let the
        connections end, push out those still unsettled after ``grace`` (idle ones: a peer's
        probe sends its request at once), and wait up to ``timeout`` for those being answered.
        An exec would cut them off mid-answer, a missed probe for the peer."""
        start = time.monotonic()
        pushed = False
        while time.monotonic() - start < timeout:
            with self.guard:
                if not self.unsettled and not self.settled:
                    return
                if not pushed and time.monotonic() - start >= grace:
                    pushed = True
                    for conn in self.unsettled:
                        push_out(conn)
            time.sleep(0.01)

    def shutdown_request(self, request: Any) -> None:
        with self.guard:
            self.unsettled.pop(request, None)
            self.settled.discard(request)
        super().shutdown_request(request)


def push_out(conn: socket.socket) -> None:
    """End a connection: its handler's blocked read wakes with nothing, which ends it."""
    try:
        conn.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


class Handler(http.server.BaseHTTPRequestHandler):
    """A helper's request handler: a read timeout, no access log, and ``signed()`` for POSTs."""

    timeout = TIMEOUT_S
    server: GuardedServer
    verifier: pairmac.Verifier | None = None  # set by the helper at start, from its secret

    def signed(self) -> bool:
        """True when this request carries a good MAC (its connection then settles); else the
        refusal is answered here. The body, if any, is read and signed too."""
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if not 0 <= length <= MAX_BODY:
            self.answer(413, "body too large or malformed")
            return False
        body = self.rfile.read(length) if length else b""
        receiver = "{}:{}".format(*self.connection.getsockname()[:2])
        if self.verifier is None:
            status, why = 401, pairmac.UNSIGNED
        else:
            fields = {name: self.headers.get(name, "") for name in pairmac.FIELDS}
            status, why = self.verifier.check(fields, self.command, self.path, receiver, body)
        if status:
            if why != pairmac.UNSIGNED:  # a good MAC: resent, stale, or a flood of them
                print(f"sparkrig-pair: {self.command} {self.path} from {self.client_address[0]} "
                      f"refused: {why}", flush=True)  # fmt: skip
            self.answer(status, why)
            return False
        self.server.settle(self.request)
        return True

    def answer(self, status: int, text: str = "") -> None:
        body = (text + "\n").encode() if text else b""
        try:
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except OSError:
            pass  # the caller gave up; nothing to tell it

    def log_message(self, format: str, *args: object) -> None:
        pass
