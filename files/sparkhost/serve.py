"""``sparkhost serve``: serve a directory read-only over HTTP (GET/HEAD, Range) on ADDR:PORT.

The head serves its verified weights to the workers over the fabric, and its saved base image;
the fetcher's working files (``.part``, stamps, status, dot files) are never served, and with
``--lock`` only the lockfile's paths are; with ``--lock-in SUBDIR=LOCKFILE`` (repeatable) only each
lockfile's paths under its SUBDIR of ``--dir`` (the head's weights_dir holds other revisions and
files no worker needs: nothing else is published). It exits after ``--max-seconds``."""

from __future__ import annotations

import argparse
import os
import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote, urlsplit

from sparkhost.common import EXIT_OK, SO_BINDTODEVICE, VERSION, listen_addresses, log, serve_every
from sparkhost.lockfile import load_lock

MAX_CONNECTIONS = 32  # far above the few workers that copy at once; a flood is turned away
IDLE_TIMEOUT_S = 60.0  # a connection that sends or takes nothing this long is closed


class ServeHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "sparkrig-serve/" + VERSION
    timeout = IDLE_TIMEOUT_S
    root = "/"  # the served directory, symlinks resolved
    allowed: set[str] | None = None

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        sys.stderr.write(f"{self.client_address[0]} {format % args}\n")

    def do_HEAD(self) -> None:
        self._serve(head=True)

    def do_GET(self) -> None:
        self._serve(head=False)

    def _fail(self, code: int) -> None:
        self.send_response(code)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _serve(self, head: bool) -> None:
        rel = unquote(urlsplit(self.path).path).lstrip("/")
        if any(not c.isprintable() for c in rel):  # %00 and the like: no file has that name
            return self._fail(400)
        parts = rel.split("/")
        if (
            not rel
            or ".." in parts
            or any(p.startswith(".") for p in parts)
            or rel.endswith((".part", ".stamps.json", ".fetch-status.json"))
            or ".tmp." in parts[-1]
            or (self.allowed is not None and rel not in self.allowed)
        ):
            return self._fail(404)
        full = os.path.join(self.root, rel)
        # a symlink is never followed out of the served directory (nor is one served at all)
        if os.path.realpath(full) != os.path.normpath(full):
            return self._fail(404)
        try:
            fh = open(full, "rb")
        except OSError:
            return self._fail(404)
        with fh:
            size = os.fstat(fh.fileno()).st_size
            start, end = 0, size - 1
            rng = self.headers.get("Range")
            status = 200
            if rng and rng.startswith("bytes=") and "," not in rng:
                a, _, b = rng[6:].partition("-")
                try:
                    if a:
                        start, end = int(a), (int(b) if b else size - 1)
                    else:
                        start, end = max(0, size - int(b)), size - 1
                except ValueError:
                    return self._fail(400)
                if start >= size:
                    self.send_response(416)
                    self.send_header("Content-Range", f"bytes */{size}")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                end = min(end, size - 1)
                status = 206
            length = max(0, end - start + 1)
            self.send_response(status)
            self.send_header("Content-Length", str(length))
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("Content-Type", "application/octet-stream")
            if status == 206:
                self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
            self.end_headers()
            if head or not length:
                return
            self.wfile.flush()
            try:
                self.connection.sendfile(fh, start, length)
            except OSError:
                self.close_connection = True


def allowed_paths(lock: str | None, lock_in: list[str]) -> set[str] | None:
    """The paths served (relative to ``--dir``): a lockfile's, or each ``SUBDIR=LOCKFILE``'s
    under its SUBDIR; None (every file but the fetcher's own) when neither is given."""
    if not lock and not lock_in:
        return None
    allowed: set[str] = set()
    if lock:
        allowed |= {e.path for e in load_lock(lock)[1]}
    for pair in lock_in:
        subdir, sep, path = pair.partition("=")
        subdir = subdir.strip("/")
        if not sep or not subdir or not path or ".." in subdir.split("/"):
            raise SystemExit(f"sparkhost serve: --lock-in wants SUBDIR=LOCKFILE, not {pair!r}")
        allowed |= {f"{subdir}/{e.path}" for e in load_lock(path)[1]}
    return allowed


def make_servers(args: argparse.Namespace) -> list[ThreadingHTTPServer]:
    """Every listener of ``args`` (bound, not yet serving), at most MAX_CONNECTIONS at once."""
    allowed = allowed_paths(args.lock, args.lock_in or [])
    root = os.path.realpath(args.dir)
    handler = type("H", (ServeHandler,), {"root": root, "allowed": allowed})
    slots = threading.BoundedSemaphore(MAX_CONNECTIONS)

    class Srv(ThreadingHTTPServer):
        daemon_threads = True
        allow_reuse_address = True

        def server_bind(self) -> None:
            if args.bind_device:
                self.socket.setsockopt(
                    socket.SOL_SOCKET, SO_BINDTODEVICE, args.bind_device.encode() + b"\0"
                )
            super().server_bind()

        def process_request(self, request: Any, client_address: Any) -> None:
            if not slots.acquire(blocking=False):
                self.shutdown_request(request)  # full: closed at once, nothing read
                return
            super().process_request(request, client_address)

        def process_request_thread(self, request: Any, client_address: Any) -> None:
            try:
                super().process_request_thread(request, client_address)
            finally:
                slots.release()

    return [Srv(address, handler) for address in listen_addresses(args.listen)]


def cmd_serve(args: argparse.Namespace) -> int:
    servers = make_servers(args)
    log(f"serving {args.dir} read-only on {args.listen} for at most {args.max_seconds}s")

    def shutdown() -> None:
        for srv in servers:
            srv.shutdown()

    if args.max_seconds:
        threading.Timer(args.max_seconds, shutdown).start()
    try:
        serve_every(servers)
    except KeyboardInterrupt:
        pass
    for srv in servers:
        srv.server_close()
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    sv = argparse.ArgumentParser(prog="sparkhost serve", description=__doc__.split("\n")[0])
    sv.add_argument("--dir", required=True)
    sv.add_argument(
        "--listen",
        required=True,
        help="ADDR:PORT[,ADDR:PORT...]: the fabric address (each a peer dials, on a ring)",
    )
    sv.add_argument("--lock", help="serve only the lockfile's paths")
    sv.add_argument(
        "--lock-in",
        action="append",
        metavar="SUBDIR=LOCKFILE",
        help="serve only LOCKFILE's paths under SUBDIR of --dir (repeatable)",
    )
    sv.add_argument("--bind-device", help="also SO_BINDTODEVICE the listening socket")
    sv.add_argument("--max-seconds", type=float, default=4 * 3600, help="exit after this long")
    return sv


def main(argv: list[str] | None = None) -> int:
    return cmd_serve(build_parser().parse_args(argv))
