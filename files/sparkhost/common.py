"""What several jobs share: logging, exit codes, number formats, atomic JSON, the progress line."""

from __future__ import annotations

import http.client
import json
import os
import socket
import socketserver
import threading
import time
import urllib.request
from collections.abc import Sequence
from typing import Any

VERSION = "1"
SO_BINDTODEVICE = getattr(socket, "SO_BINDTODEVICE", 25)

# exit codes of the weights jobs (fetch, verify, state, serve, routes, follow)
EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


def read_text(path: str) -> str:
    """A small file's text (sysfs, /proc, a flag file), stripped; "" when it cannot be read."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().strip()
    except OSError:
        return ""


def listen_addresses(listen: str) -> list[tuple[str, int]]:
    """``ADDR:PORT[,ADDR:PORT...]`` as (address, port) pairs: where a helper or a copy server
    listens (one address on a pair, each address a peer dials on a triangle or a ring)."""
    out = []
    for part in listen.split(","):
        host, sep, port = part.strip().rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"not ADDR:PORT: {part!r} (in {listen!r})")
        out.append((host.strip("[]"), int(port)))
    return out


def serve_every(servers: Sequence[socketserver.BaseServer], block: bool = True) -> None:
    """Serve every one of ``servers`` (one per address of a ``--listen`` list): each in a
    daemon thread, or, ``block``, all but the first, which serves here until it stops."""
    for server in servers[1:] if block else servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    if block:
        servers[0].serve_forever()


def bind_device(sock: socket.socket, device: str) -> None:
    """SO_BINDTODEVICE ``sock`` to the netdev ``device``: it sends and receives on that
    interface only, so a listener bound to the fabric address is not answered through another
    interface (the weak host model) and a client's packets never leave by another route. The
    first bind of a fresh socket needs no privilege (Linux 5.7+); a re-bind needs CAP_NET_RAW."""
    sock.setsockopt(socket.SOL_SOCKET, SO_BINDTODEVICE, device.encode() + b"\0")


class _DeviceConnection(http.client.HTTPConnection):
    device = ""

    def connect(self) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            bind_device(sock, self.device)
            if self.timeout is not socket._GLOBAL_DEFAULT_TIMEOUT:  # type: ignore[attr-defined]
                sock.settimeout(self.timeout)
            sock.connect((self.host, self.port))
        except OSError:
            sock.close()
            raise
        self.sock = sock


def device_opener(device: str) -> urllib.request.OpenerDirector:
    """A urllib opener whose plain-HTTP connections are bound to ``device`` before they
    connect (``bind_device``); ``urllib.request.install_opener`` makes it urlopen's."""

    def connection(host: str, /, **kwargs: Any) -> http.client.HTTPConnection:
        conn = _DeviceConnection(host, **kwargs)
        conn.device = device
        return conn

    class DeviceHandler(urllib.request.HTTPHandler):
        def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
            return self.do_open(connection, req)

    return urllib.request.build_opener(DeviceHandler)


def log(msg: str) -> None:
    print(time.strftime("%H:%M:%S ") + msg, flush=True)


def gib(n: float) -> str:
    return f"{n / (1 << 30):.2f}"


def fmt_rate(bps: float) -> str:
    return f"{bps / 1e6:.1f}MB/s"


def fmt_eta(s: float | None) -> str:
    if s is None:
        return "?"
    s = int(s)
    if s >= 3600:
        return f"{s // 3600}h{(s % 3600) // 60:02d}m"
    return f"{s // 60}m{s % 60:02d}s"


def write_json_atomic(path: str, obj: Any) -> None:
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as fh:
        json.dump(obj, fh, sort_keys=True)
    os.replace(tmp, path)


def progress_line(s: dict[str, Any]) -> str:
    """One line of a fetch's status file (the fetch prints it, ``follow`` prints it again)."""
    lanes = " ".join(
        f"{n}={fmt_rate(v['rate'])}" + ("" if v["state"] not in ("retired",) else "(retired)")
        for n, v in s.get("lanes", {}).items()
    )
    return (
        f"progress {s['state']} {gib(s['bytes_done'])}/{gib(s['bytes_total'])} GiB "
        f"files {s['files_done']}/{s['files_total']} rate {fmt_rate(s['rate'])} "
        f"[{lanes}] eta {fmt_eta(s.get('eta_s'))}"
    )
