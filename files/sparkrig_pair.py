#!/usr/bin/python3
"""Stop-together for sparkrig ranks: no half-alive pair.

`watch` runs beside a rank (sparkrig-pair.service, BindsTo the rank unit). It answers HTTP on the
rank's fabric address: 200 while the rank's container runs, 503 otherwise. It polls the peers'
beacons (the head polls every worker, a worker polls the head); when a peer that was up stops
answering `--fails` times in a row, or never comes up within `--grace` seconds, it stops its own
rank unit, which brings this rank down too.

`wait` blocks until every peer's beacon answers 200 (the head's start gate), or times out.

Stdlib only. Exit codes: 0 ok, 1 timed out / usage.
"""

from __future__ import annotations

import argparse
import http.server
import subprocess
import sys
import threading
import time
import urllib.request


def log(msg: str) -> None:
    print(f"sparkrig-pair: {msg}", flush=True)


def beacon_up(peer: str, port: int, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(f"http://{peer}:{port}/", timeout=timeout) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def container_running(name: str) -> bool:
    out = subprocess.run(
        ["docker", "inspect", "--format", "{{.State.Running}}", name],
        capture_output=True,
        text=True,
        check=False,
    )
    return out.stdout.strip() == "true"


class Beacon(http.server.BaseHTTPRequestHandler):
    container = ""
    _cache: tuple[float, bool] = (0.0, False)
    _lock = threading.Lock()

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        with Beacon._lock:
            stamp, up = Beacon._cache
            if time.monotonic() - stamp > 1.0:
                up = container_running(self.container)
                Beacon._cache = (time.monotonic(), up)
        body = f"{self.container} {'running' if up else 'not running'}\n".encode()
        self.send_response(200 if up else 503)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


class PeerWatch:
    """Decides when a rank must stop because a peer is gone (pure: fed observations)."""

    def __init__(self, peers: list[str], fails: int, grace: float, now: float) -> None:
        self.fails = fails
        self.deadline = now + grace
        self.seen = {p: False for p in peers}
        self.misses = {p: 0 for p in peers}

    def observe(self, peer: str, up: bool) -> None:
        if up:
            self.seen[peer] = True
            self.misses[peer] = 0
        else:
            self.misses[peer] += 1

    def verdict(self, now: float) -> str | None:
        for peer, seen in self.seen.items():
            if seen and self.misses[peer] >= self.fails:
                return f"peer {peer} went down ({self.misses[peer]} failed probes)"
            if not seen and now >= self.deadline:
                return f"peer {peer} never came up within the grace period"
        return None


def watch(args: argparse.Namespace) -> int:
    host, _, port = args.listen.rpartition(":")
    Beacon.container = args.container
    server = http.server.ThreadingHTTPServer((host, int(port)), Beacon)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    peers = [p for p in args.peers.split(",") if p]
    log(f"beacon on {args.listen} for {args.container}; watching {', '.join(peers)}")
    state = PeerWatch(peers, args.fails, args.grace, time.monotonic())
    while True:
        for peer in peers:
            state.observe(peer, beacon_up(peer, args.port))
        reason = state.verdict(time.monotonic())
        if reason:
            log(f"{reason}: stopping {args.unit} so the pair goes down together")
            subprocess.run(["systemctl", "--no-block", "stop", args.unit], check=False)
            return 0
        time.sleep(args.interval)


def wait(args: argparse.Namespace) -> int:
    peers = [p for p in args.peers.split(",") if p]
    deadline = time.monotonic() + args.timeout
    started = time.monotonic()
    while True:
        down = [p for p in peers if not beacon_up(p, args.port)]
        if not down:
            log(f"every peer is up ({', '.join(peers)}) after {time.monotonic() - started:.1f} s")
            return 0
        if time.monotonic() >= deadline:
            log(f"timed out after {args.timeout:.0f} s waiting for {', '.join(down)}")
            return 1
        time.sleep(args.interval)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="mode", required=True)
    w = sub.add_parser("watch", help="beacon + stop this rank when a peer goes down")
    w.add_argument("--unit", required=True)
    w.add_argument("--container", required=True)
    w.add_argument("--listen", required=True, help="fabric IP:port of this rank's beacon")
    w.add_argument("--fails", type=int, default=3)
    w.add_argument("--grace", type=float, default=1800)
    for sp in (w, sub.add_parser("wait", help="wait until every peer's beacon answers")):
        sp.add_argument("--peers", required=True, help="comma-separated fabric IPs")
        sp.add_argument("--port", type=int, required=True)
        sp.add_argument("--interval", type=float, default=1.0)
    sub.choices["wait"].add_argument("--timeout", type=float, default=600)
    args = p.parse_args(argv)
    return watch(args) if args.mode == "watch" else wait(args)


if __name__ == "__main__":
    sys.exit(main())
