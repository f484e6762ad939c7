#!/usr/bin/python3
"""Stop-together for sparkrig ranks: no half-alive pair.

`watch` runs beside a rank (sparkrig-pair.service, BindsTo the rank unit). It answers HTTP on the
rank's fabric address: 200 while the rank's container runs, 503 otherwise. It polls the peers'
beacons (the head polls every worker, a worker polls the head); when a peer that was up stops
answering `--fails` times in a row, or never comes up within `--grace` seconds, it stops its own
rank unit, which brings this rank down too.

`wait` blocks until every peer's beacon answers 200 (the head's start gate), or times out.

`agent` runs on each worker: on an authenticated POST /start from the head it starts the worker's
rank unit (the head cannot reach a worker's systemd otherwise). `restart` (on the head) restarts
the pair in order: head down, workers down, workers up (through their agents), head up.
`watchdog` (on the head, opt-in) restarts the pair that way when the pair went down because a rank
died, or when a real completion fails `--fails` times in a row; at most `--max-restarts` per
`--window` seconds, never within `--grace` seconds of a start, never after an operator's stop.

Stdlib only. Exit codes: 0 ok, 1 timed out / failed / usage.
"""

from __future__ import annotations

import argparse
import hmac
import http.server
import os
import subprocess
import sys
import threading
import time
import urllib.request


def log(msg: str) -> None:
    print(f"sparkrig-pair: {msg}", flush=True)


def beacon_up(peer: str, port: int, timeout: float = 5.0) -> bool:
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
        timeout=30,
    )
    return out.stdout.strip() == "true"


class Beacon(http.server.BaseHTTPRequestHandler):
    """Answers from a cache a background thread keeps fresh: a slow `docker inspect` must never
    make a peer's probe time out and take the pair down."""

    container = ""
    running = False

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        up = Beacon.running
        body = f"{self.container} {'running' if up else 'not running'}\n".encode()
        try:
            self.send_response(200 if up else 503)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except OSError:
            pass  # the prober gave up; nothing to tell it

    def log_message(self, format: str, *args: object) -> None:
        pass


def refresh_container_state(name: str, interval: float = 1.0) -> None:
    while True:
        try:
            Beacon.running = container_running(name)
        except subprocess.TimeoutExpired:
            pass  # keep the last answer; a hung daemon shows up in the next rounds
        time.sleep(interval)


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


MARKER = "/run/sparkrig/pair-down"  # written when a rank is stopped because its peer went down


def mark_pair_down(reason: str) -> None:
    try:
        os.makedirs(os.path.dirname(MARKER), exist_ok=True)
        with open(MARKER, "w") as f:
            f.write(reason + "\n")
    except OSError:
        pass


def watch(args: argparse.Namespace) -> int:
    host, _, port = args.listen.rpartition(":")
    Beacon.container = args.container
    threading.Thread(target=refresh_container_state, args=(args.container,), daemon=True).start()
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
            mark_pair_down(reason)
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


def read_token(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read().strip()


class Agent(http.server.BaseHTTPRequestHandler):
    unit = ""
    token = ""

    def do_POST(self) -> None:  # noqa: N802
        given = self.headers.get("X-Sparkrig-Token", "")
        action = {"/start": ["--no-block", "start"], "/stop": ["stop"]}.get(self.path)
        if action is None or not hmac.compare_digest(given, self.token):
            self.send_response(403)
            self.end_headers()
            return
        log(f"{self.path[1:]} of {self.unit} requested by {self.client_address[0]}")
        done = subprocess.run(["systemctl", *action, self.unit], check=False).returncode == 0
        self.send_response(202 if done else 500)
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


def agent(args: argparse.Namespace) -> int:
    host, _, port = args.listen.rpartition(":")
    Agent.unit, Agent.token = args.unit, read_token(args.token_file)
    log(f"agent for {args.unit} on {args.listen}")
    http.server.ThreadingHTTPServer((host, int(port)), Agent).serve_forever()
    return 0


def ask(worker: str, port: int, token: str, action: str) -> bool:
    """Ask a worker's agent to start or stop its rank (a stop returns once it is down)."""
    req = urllib.request.Request(
        f"http://{worker}:{port}/{action}", method="POST", headers={"X-Sparkrig-Token": token}
    )
    try:
        with urllib.request.urlopen(req, timeout=180) as r:
            return bool(r.status == 202)
    except OSError as err:
        log(f"agent on {worker} did not {action} its rank: {err}")
        return False


def wait_all(peers: list[str], port: int, up: bool, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(beacon_up(p, port) == up for p in peers):
            return True
        time.sleep(1)
    return False


def restart_pair(args: argparse.Namespace) -> int:
    """Head down, workers down, workers up, head up: the only order NCCL survives."""
    workers = [p for p in args.workers.split(",") if p]
    token = read_token(args.token_file)
    log(f"restarting the pair: {args.head_unit}, then {', '.join(workers)}")
    subprocess.run(["systemctl", "stop", args.head_unit], check=False)
    if not all(ask(w, args.agent_port, token, "stop") for w in workers):
        return 1
    if not all(ask(w, args.agent_port, token, "start") for w in workers):
        return 1
    if not wait_all(workers, args.port, up=True, timeout=args.timeout):
        log("workers did not come up")
        return 1
    try:
        os.unlink(MARKER)
    except OSError:
        pass
    subprocess.run(["systemctl", "--no-block", "start", args.head_unit], check=False)
    log("workers up; head starting")
    return 0


def unit_state(unit: str) -> tuple[bool, bool]:
    out = subprocess.run(
        ["systemctl", "show", "--property=ActiveState", "--property=Result", unit],
        capture_output=True,
        text=True,
    ).stdout
    return parse_unit_state(out)


def parse_unit_state(show: str) -> tuple[bool, bool]:
    """(active or starting, went down on its own: a non-success result such as a dead container)
    from ``systemctl show`` KEY=VALUE lines (systemd prints them in its own order)."""
    props = dict(line.partition("=")[::2] for line in show.splitlines() if "=" in line)
    active = props.get("ActiveState") in ("active", "activating", "reloading")
    crashed = props.get("Result", "success") not in ("success", "")
    return active, crashed


class WatchdogPolicy:
    """When to restart (pure: fed observations and the clock)."""

    def __init__(self, fails: int, grace: float, max_restarts: int, window: float) -> None:
        self.fails, self.grace = fails, grace
        self.max_restarts, self.window = max_restarts, window
        self.misses = 0
        self.started_at: float | None = None
        self.restarts: list[float] = []

    def observe(self, now: float, active: bool, pair_down: bool, probe_ok: bool | None) -> str:
        """Returns "restart", "give-up" or "" (nothing to do)."""
        self.restarts = [t for t in self.restarts if now - t < self.window]
        if self.restarts and now - self.restarts[-1] < self.grace:
            return ""  # a restart is still taking (the unit may not even be activating yet)
        if not active:
            self.started_at, self.misses = None, 0
            if not pair_down:
                return ""  # an operator stopped it: leave it down
            return self._restart(now, "the pair went down")
        if self.started_at is None:
            self.started_at = now
        if now - self.started_at < self.grace or probe_ok is None:
            return ""
        self.misses = 0 if probe_ok else self.misses + 1
        return self._restart(now, "completions fail") if self.misses >= self.fails else ""

    def _restart(self, now: float, why: str) -> str:
        if len(self.restarts) >= self.max_restarts:
            return "give-up"
        self.restarts.append(now)
        self.misses, self.started_at = 0, None
        return "restart"


def watchdog(args: argparse.Namespace) -> int:
    policy = WatchdogPolicy(args.fails, args.grace, args.max_restarts, args.window)
    gave_up = False
    log(
        f"watchdog for {args.head_unit}: probe every {args.interval:.0f} s after {args.grace:.0f} s"
    )
    while True:
        now = time.monotonic()
        active, crashed = unit_state(args.head_unit)
        probe_ok = None
        if active and policy.started_at is not None and now - policy.started_at >= args.grace:
            probe_ok = subprocess.run(args.probe, shell=True, check=False).returncode == 0
        verdict = policy.observe(now, active, crashed or os.path.exists(MARKER), probe_ok)
        if verdict == "restart":
            gave_up = False
            log("restarting the pair in order")
            restart_pair(args)
        elif verdict == "give-up" and not gave_up:
            gave_up = True
            log(f"{args.max_restarts} restarts in {args.window:.0f} s: giving up, pair stays down")
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
    a = sub.add_parser("agent", help="worker: start the rank unit when the head asks")
    a.add_argument("--listen", required=True)
    a.add_argument("--unit", required=True)
    a.add_argument("--token-file", required=True)
    r = sub.add_parser("restart", help="head: restart the pair in order")
    d = sub.add_parser("watchdog", help="head: restart the pair when it is down or fails")
    for sp in (r, d):
        sp.add_argument("--head-unit", required=True)
        sp.add_argument("--workers", required=True, help="comma-separated worker fabric IPs")
        sp.add_argument("--port", type=int, required=True, help="beacon port")
        sp.add_argument("--agent-port", type=int, required=True)
        sp.add_argument("--token-file", required=True)
        sp.add_argument("--timeout", type=float, default=300)
    d.add_argument("--probe", required=True, help="shell command: a real completion")
    d.add_argument("--interval", type=float, default=60)
    d.add_argument("--fails", type=int, default=3)
    d.add_argument("--grace", type=float, default=1800)
    d.add_argument("--max-restarts", type=int, default=3)
    d.add_argument("--window", type=float, default=21600)
    args = p.parse_args(argv)
    modes = {"watch": watch, "wait": wait, "agent": agent, "restart": restart_pair}
    return modes.get(args.mode, watchdog)(args)


if __name__ == "__main__":
    sys.exit(main())
