"""``sparkhost pair``: stop-together for sparkrig ranks, no half-alive pair.

`watch` runs beside a rank (sparkrig-pair.service, BindsTo the rank unit). It answers HTTP on the
rank's fabric address: 200 while the rank's container runs, 503 otherwise. It polls the peers'
beacons (the head polls every worker, a worker polls the head); when a peer that was up stops
answering `--fails` times in a row, or never comes up within `--grace` seconds, it stops its own
rank unit, which brings this rank down too. A reload (SIGHUP) execs the watch's program again in
the same process, the beacon's socket kept open: a new host package never reads as a peer gone.

`alone` (a worker's start gate) refuses to start a worker while the head's engine runs: a rank
started alone cannot join a running engine; it asks the head's supervisor for an ordered restart.

`wait` blocks until every peer's beacon answers 200 (the head's start gate), or times out.

`wait` can also ask each missing worker's agent to start its rank (the head's start gate does:
starting the head starts the pair, e.g. after the head rebooted alone).

`agent` runs on each worker: on a signed POST /start or /stop from the head it starts or
stops the worker's rank unit (the head cannot reach a worker's systemd otherwise); GET /ready says
whether the worker may be started (200) or an operator stopped it (409). `restart` (on the head)
restarts the pair in order: head down, workers down, workers up (through their agents), head up;
one at a time (a lock). With `--in-turn` the workers come up one at a time in the order given
(a stack that starts its ranks last-to-first: rank N-1 up before rank N-2 starts, ...).

`stopping` is every rank unit's first ExecStop: a stop requested while the container runs that is
neither stop-together nor an ordered restart is an operator's, and is recorded in /run (a reboot
forgets it, as systemd forgets a stop); the next start of the rank clears it.

`supervise` (on the head, always on) restarts the pair in order when it went down by itself (a
rank died, a node rebooted, the head's start gate timed out) and every worker's agent answers
ready again, at most `--max-restarts` per `--window` seconds; never after an operator's stop. It
also takes a signed POST /restart-pair, which `request` sends from a worker whose deploy
ran without the head (`--limit worker`), under the same budget.

`watchdog` (on the head) restarts the pair that way when the engine is wedged: requests in flight
and nothing in vLLM's /metrics moved for `--stall` seconds, or, while idle, a short real completion
(the canary) failed `--fails` times in a row (sparkhost.wedge); at most `--max-restarts` per
`--window` seconds, never within `--grace` seconds of a start. A pair that is down is the
supervisor's business, not the watchdog's.

Every POST is signed with the pair secret (sparkhost.pairmac: a MAC over method, path, receiver,
time and nonce; no secret on the wire, no request answered twice); a helper refuses to start on an
empty or short secret. The helpers' servers time out idle connections and cap them
(sparkhost.helperhttp).

Stdlib only. Exit codes: 0 ok, 1 timed out / failed / usage.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

from sparkhost import pairmac, wedge
from sparkhost.common import bind_device, device_opener, listen_addresses, serve_every
from sparkhost.common import read_text as read_flag
from sparkhost.helperhttp import GuardedServer, Handler
from sparkhost.units import unit_state


def log(msg: str) -> None:
    print(f"sparkrig-pair: {msg}", flush=True)


def beacon_probe(peer: str, port: int, timeout: float = 5.0) -> bool | None:
    """The peer's beacon: True (200), False (another answer, refused, unreachable), None
    (connected but no answer within ``timeout``: the peer's watch holds its socket open but is
    busy, e.g. starting its new program after a reload on a loaded host)."""
    try:
        with urllib.request.urlopen(f"http://{peer}:{port}/", timeout=timeout) as r:
            return bool(r.status == 200)
    except urllib.error.URLError:  # the connection itself failed (refused, unreachable)
        return False
    except TimeoutError:  # connected, the answer did not come: alive, not answering yet
        return None
    except OSError:
        return False


def beacon_up(peer: str, port: int, timeout: float = 5.0) -> bool:
    return beacon_probe(peer, port, timeout) is True


def container_running(name: str) -> bool:
    out = subprocess.run(
        ["docker", "inspect", "--format", "{{.State.Running}}", name],
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
    )
    return out.stdout.strip() == "true"


class Beacon(Handler):
    """Answers from a cache a background thread keeps fresh: a slow `docker inspect` must never
    make a peer's probe time out and take the pair down."""

    container = ""
    running = False

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        self.server.settle(self.request)  # being answered: a reload waits for it
        up = Beacon.running
        body = f"{self.container} {'running' if up else 'not running'}\n".encode()
        try:
            self.send_response(200 if up else 503)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except OSError:
            pass  # the prober gave up; nothing to tell it


def refresh_container_state(name: str, interval: float = 1.0) -> None:
    while True:
        try:
            Beacon.running = container_running(name)
        except subprocess.TimeoutExpired:
            pass  # keep the last answer; a hung daemon shows up in the next rounds
        time.sleep(interval)


class PeerWatch:
    """Decides when a rank must stop because a peer is gone (pure: fed observations). A probe
    that connected but got no answer in time (None) is no miss: the peer's beacon socket is open
    (a reload keeps it), only its program is busy; ``silent`` seconds of such probes alone are."""

    def __init__(
        self, peers: list[str], fails: int, grace: float, now: float, silent: float = 120.0
    ) -> None:
        self.fails = fails
        self.silent = silent
        self.deadline = now + grace
        self.seen = {p: False for p in peers}
        self.misses = {p: 0 for p in peers}
        self.answered = {p: now for p in peers}  # when the peer last answered at all

    def observe(self, peer: str, up: bool | None, now: float | None = None) -> None:
        if up is None:
            return
        if now is not None:
            self.answered[peer] = now
        if up:
            self.seen[peer] = True
            self.misses[peer] = 0
        else:
            self.misses[peer] += 1

    def verdict(self, now: float) -> str | None:
        for peer, seen in self.seen.items():
            if seen and self.misses[peer] >= self.fails:
                return f"peer {peer} went down ({self.misses[peer]} failed probes)"
            if seen and now - self.answered[peer] >= self.silent:
                return f"peer {peer} went silent ({now - self.answered[peer]:.0f} s unanswered)"
            if not seen and now >= self.deadline:
                return f"peer {peer} never came up within the grace period"
        return None


RUN = os.environ.get("SPARKRIG_RUN_DIR", "/run/sparkrig")  # tests point it elsewhere
MARKER = f"{RUN}/pair-down"  # written before sparkrig's own machinery stops a rank
OPERATOR = f"{RUN}/operator-stop"  # written when a stop was someone else's (an operator's)
RESTART_LOCK = f"{RUN}/restart.lock"  # one ordered restart at a time


def write_flag(path: str, text: str) -> None:
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text + "\n")
    except OSError:
        pass


def budget_file(helper: str) -> str:
    """Where the watchdog or supervisor keeps its restart budget for status.py (in /run, like the
    budget itself, which lives as long as the helper: a fresh helper starts a fresh budget)."""
    return f"{RUN}/{helper}-restarts.json"


def write_budget(helper: str, restarts: list[float], max_restarts: int, window: float) -> None:
    """The restarts in the window as wall-clock times (the policies count on the monotonic
    clock), written whole and renamed into place; a failure only loses the report."""
    now, wall = time.monotonic(), time.time()
    data = {
        "restarts": [round(wall - (now - t)) for t in restarts],
        "max_restarts": max_restarts,
        "window_s": window,
    }
    path = budget_file(helper)
    # the supervisor writes it from its rounds and from workers' requests: one name per thread
    tmp = f"{path}.{threading.get_ident()}.tmp"
    try:
        os.makedirs(RUN, exist_ok=True)
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(json.dumps(data, sort_keys=True) + "\n")
        os.replace(tmp, path)
    except OSError:
        pass


def mark_pair_down(reason: str) -> None:
    write_flag(MARKER, reason)


DOCKER_UNITS = ("docker.service", "docker.socket")


def docker_gone(active: str, jobs: str) -> str:
    """Why docker is going away or gone, "" while it serves (pure: ``active`` is
    ``systemctl is-active docker.service``, ``jobs`` is ``systemctl list-jobs`` of docker's
    units). A stop or restart of docker that systemd propagates to the rank is still queued
    (waiting) while the rank's ExecStop runs, the rank being ordered after docker."""
    queued = [" ".join(line.split()[1:3]) for line in jobs.splitlines() if len(line.split()) >= 3]
    if queued:
        return f"docker is going away ({', '.join(queued)})"
    if active.strip() != "active":
        return f"docker.service is {active.strip() or 'unknown'}"
    return ""


def docker_state() -> str:
    """docker_gone() of this host's docker, as systemd sees it now."""

    def run(*argv: str) -> str:
        out = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=30)
        return out.stdout

    jobs = run("systemctl", "list-jobs", "--no-legend", "--plain", *DOCKER_UNITS)
    return docker_gone(run("systemctl", "is-active", DOCKER_UNITS[0]), jobs)


def stopping(args: argparse.Namespace) -> int:
    """ExecStop hook: record an operator's stop (systemd sets EXIT_CODE once the main process
    has exited, i.e. the container died and this is no stop request at all). A rank that goes
    down with docker (stopped with it, or its container gone with the daemon) went down by
    itself: marked so, the head's supervisor restarts the pair in order once docker is back."""
    if os.path.exists(MARKER):
        return 0  # stop-together or an ordered restart: sparkrig's own
    gone = docker_state()
    if gone:
        mark_pair_down(f"{args.unit} went down with docker: {gone}")
        log(f"{args.unit} went down with docker ({gone}): the pair restarts once docker is back")
        return 0
    if os.environ.get("EXIT_CODE"):
        return 0
    write_flag(OPERATOR, f"{args.unit} stopped by request at {time.strftime('%FT%T%z')}")
    log(
        f"{args.unit} stopped by request (not stop-together, not a restart): sparkrig leaves the "
        "pair down until the head is started again (systemctl start sparkrig-head, "
        "sparkrig-restart-pair or the deploy)"
    )
    return 0


# A reload (SIGHUP: `systemctl reload sparkrig-pair`, what the deploy does when the host package
# changed) execs the watch's new program in the same process and hands it the beacon's listening
# socket and the peers it has seen up: the socket never closes, so a peer's probe made meanwhile
# waits in its backlog and is answered by the new program; a restart would leave the port closed
# for seconds, read by every peer as this rank going down (issue 31).
BEACON_FD = "SPARKRIG_BEACON_FD"  # the inherited listening sockets' descriptors (comma-separated)
SEEN_UP = "SPARKRIG_PEERS_SEEN"  # peers the previous program saw up (comma-separated)
RUNNING = "SPARKRIG_CONTAINER_RUNNING"  # the container's state as the previous program knew it


def beacon_sockets(listen: str, device: str = "") -> list[socket.socket]:
    """The beacon's listening sockets, one per address of ``listen``: those a reload handed
    over, else new ones (bound to ``device`` when given)."""
    fds = os.environ.pop(BEACON_FD, "")
    if fds:
        return [socket.socket(fileno=int(fd)) for fd in fds.split(",")]
    socks = []
    for host, port in listen_addresses(listen):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if device:
            bind_device(sock, device)
        sock.bind((host, port))
        sock.listen(128)
        socks.append(sock)
    return socks


def beacon_server(sock: socket.socket) -> GuardedServer:
    server = GuardedServer(sock.getsockname(), Beacon, bind_and_activate=False)
    server.socket.close()
    server.socket = sock
    return server


def reexec(socks: list[socket.socket], seen: list[str]) -> None:
    """Exec this program again (its files may be new), keeping ``socks`` open across the exec.
    Returns only when the exec failed (the old program goes on)."""
    for sock in socks:
        os.set_inheritable(sock.fileno(), True)
    env = {
        **os.environ,
        BEACON_FD: ",".join(str(sock.fileno()) for sock in socks),
        SEEN_UP: ",".join(seen),
        RUNNING: "1" if Beacon.running else "0",
    }
    log("reload: handing the beacon's sockets to the new program")
    handler = signal.signal(signal.SIGHUP, signal.SIG_IGN)  # ignored until the new one listens
    try:
        os.execve(sys.executable, sys.orig_argv, env)
    except OSError as err:
        signal.signal(signal.SIGHUP, handler)
        log(f"reload failed ({err}): the running program goes on")


def first_container_state(name: str) -> bool:
    """Known before the first answer: after a reload, what the previous program knew (a docker
    that is slow to answer must not hold up the beacon while the peers' probes wait on it)."""
    inherited = os.environ.pop(RUNNING, "")
    if inherited:
        return inherited == "1"
    try:
        return container_running(name)
    except subprocess.TimeoutExpired:
        return False


def watch(args: argparse.Namespace) -> int:
    reload = threading.Event()
    signal.signal(signal.SIGHUP, lambda *_: reload.set())
    Beacon.container = args.container
    Beacon.running = first_container_state(args.container)
    threading.Thread(target=refresh_container_state, args=(args.container,), daemon=True).start()
    socks = beacon_sockets(args.listen, args.bind_device)
    servers = [beacon_server(sock) for sock in socks]
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    peers = [p for p in args.peers.split(",") if p]
    seen = [p for p in os.environ.pop(SEEN_UP, "").split(",") if p in peers]
    log(
        f"beacon on {args.listen} for {args.container}; watching {', '.join(peers)}"
        + (f" (seen up before the reload: {', '.join(seen)})" if seen else "")
    )
    state = PeerWatch(peers, args.fails, args.grace, time.monotonic())
    for peer in seen:
        state.observe(peer, True, time.monotonic())
    while True:
        for peer in peers:
            state.observe(peer, beacon_probe(peer, args.port), time.monotonic())
        reason = state.verdict(time.monotonic())
        if reason:
            log(f"{reason}: stopping {args.unit} so the pair goes down together")
            mark_pair_down(reason)
            subprocess.run(["systemctl", "--no-block", "stop", args.unit], check=False)
            return 0
        if reload.wait(args.interval):
            reload.clear()
            for server in servers:
                server.shutdown()  # stops answering; the socket stays open, connections queue
            for server in servers:
                server.drain()
            reexec(socks, [p for p, up in state.seen.items() if up])
            for server in servers:
                threading.Thread(target=server.serve_forever, daemon=True).start()


def wait(args: argparse.Namespace) -> int:
    peers = [p for p in args.peers.split(",") if p]
    deadline = time.monotonic() + args.timeout
    started = time.monotonic()
    key = read_key(args.token_file) if args.token_file else b""
    asked: dict[str, float] = {}
    while True:
        down = [p for p in peers if not beacon_up(p, args.port)]
        if not down:
            log(f"every peer is up ({', '.join(peers)}) after {time.monotonic() - started:.1f} s")
            return 0
        if time.monotonic() >= deadline:
            log(
                f"timed out after {args.timeout:.0f} s waiting for {', '.join(down)}; the "
                "supervisor restarts the pair in order once every worker's agent answers"
            )
            return 1
        # starting the head starts the pair: --in-turn asks only the first worker down (in the
        # order given), the next once it is up
        for peer in (down[:1] if args.in_turn else down) if key else []:
            if time.monotonic() - asked.get(peer, -1e9) >= 30:
                asked[peer] = time.monotonic()
                if ask(peer, args.agent_port, key, "start", timeout=10):
                    log(f"asked {peer}'s agent to start its rank")
        time.sleep(args.interval)


def read_key(path: str) -> bytes:
    """The signing key of the pair secret in ``path``; pairmac.SecretError (said by main) when
    it is missing, empty or short."""
    return pairmac.load_secret(path)


class Agent(Handler):
    unit = ""

    def do_GET(self) -> None:  # noqa: N802
        """/ready: 200 when the head may start this rank, 409 when an operator stopped it, 503
        while docker is not running here (starting the rank would pull docker up mid-upgrade)."""
        if self.path != "/ready":
            self.send_response(404)
            self.end_headers()
            return
        stopped = read_flag(OPERATOR)
        gone = "" if stopped else docker_state()
        body = (stopped or gone or "ready").encode() + b"\n"
        self.send_response(409 if stopped else 503 if gone else 200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:  # noqa: N802
        if not self.signed():
            return
        if self.path == "/ping":  # an ordered restart asks every agent before it stops anything
            self.answer(200, "ready")
            return
        action = {"/start": ["--no-block", "start"], "/stop": ["stop"]}.get(self.path)
        if action is None:
            self.answer(404)
            return
        log(f"{self.path[1:]} of {self.unit} requested by {self.client_address[0]}")
        if self.path == "/stop":
            mark_pair_down(f"ordered restart requested by {self.client_address[0]}")
        done = subprocess.run(["systemctl", *action, self.unit], check=False).returncode == 0
        self.answer(202 if done else 500)


def serve_all(listen: str, handler: type[Handler], block: bool = True) -> None:
    """Answer ``handler`` on every address of ``listen`` (``ADDR:PORT[,ADDR:PORT...]``: each
    address a peer dials this rank at), every socket bound before any is served (a bind that
    fails raises here); ``block``: until a server stops, else in the background."""
    serve_every([GuardedServer(address, handler) for address in listen_addresses(listen)], block)


def agent(args: argparse.Namespace) -> int:
    Agent.unit = args.unit
    Agent.verifier = pairmac.Verifier(read_key(args.token_file), args.mac_window)
    log(f"agent for {args.unit} on {args.listen}")
    serve_all(args.listen, Agent)
    return 0


def signed_post(host: str, port: int, path: str, key: bytes) -> urllib.request.Request:
    """A POST to a helper at ``host:port``, signed with the pair secret's ``key`` now."""
    headers = pairmac.sign(key, "POST", path, f"{host}:{port}")
    return urllib.request.Request(f"http://{host}:{port}{path}", method="POST", headers=headers)


def ask(worker: str, port: int, key: bytes, action: str, timeout: float = 180) -> bool:
    """Ask a worker's agent to start or stop its rank (a stop returns once it is down), or
    (``ping``) whether it takes a signed call at all."""
    req = signed_post(worker, port, f"/{action}", key)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return bool(r.status == (200 if action == "ping" else 202))
    except OSError as err:
        what = "take a signed call" if action == "ping" else f"{action} its rank"
        log(f"agent on {worker} did not {what}: {refusal(err)}")
        return False


def refusal(err: OSError) -> str:
    """Why a helper's request failed: the helper's answer when it gave one, else the error."""
    if isinstance(err, urllib.error.HTTPError):
        return err.read().decode(errors="replace").strip() or f"HTTP {err.code}"
    return str(err)


def wait_all(peers: list[str], port: int, up: bool, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(beacon_up(p, port) == up for p in peers):
            return True
        time.sleep(1)
    return False


LOCKED = 75  # restart_pair's exit when another ordered restart holds the lock (EX_TEMPFAIL)


def restart_under_way() -> bool:
    lock = RestartLock()
    if not lock.acquire():
        return True
    lock.release()
    return False


class RestartLock:
    """One ordered restart at a time (supervisor, watchdog, an operator's sparkrig-restart-pair)."""

    def __init__(self, path: str = "") -> None:
        self.path = path or RESTART_LOCK
        self.fd = -1

    def acquire(self, timeout: float = 0) -> bool:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return True
            except OSError:
                if time.monotonic() >= deadline:
                    os.close(self.fd)
                    self.fd = -1
                    return False
                time.sleep(1)

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def restart_pair(args: argparse.Namespace) -> int:
    """Head down, workers down, workers up, head up: the only order NCCL survives."""
    lock = RestartLock()
    if not lock.acquire():
        log("another ordered restart of the pair is under way; not starting a second one")
        return LOCKED
    try:
        return _restart_pair(args)
    finally:
        lock.release()


def _restart_pair(args: argparse.Namespace) -> int:
    workers = [p for p in args.workers.split(",") if p]
    try:
        key = read_key(args.token_file)
    except pairmac.SecretError as err:
        log(f"the pair is not restarted: {err}")
        return 1
    # every agent must take a signed call before anything stops: one that refuses (a clock off
    # by more than the window, another secret, the agent down) would leave the head stopped
    silent = [w for w in workers if not ask(w, args.agent_port, key, "ping", timeout=10)]
    if silent:
        log(
            f"the pair is not restarted, nothing was stopped: {', '.join(silent)} did not take a "
            "signed call (its refusal above; a clock off: `timedatectl set-ntp true` on every rank)"
        )
        return 1
    log(f"restarting the pair: {args.head_unit}, then {', '.join(workers)}")
    mark_pair_down("ordered restart of the pair")  # so the head's stop is not an operator's
    subprocess.run(["systemctl", "stop", args.head_unit], check=False)
    if not all(ask(w, args.agent_port, key, "stop") for w in workers):
        return head_back(args, "a worker did not stop")
    # --in-turn (a stack that starts its ranks last-to-first): each worker, in the order given,
    # started and seen up before the next; else every worker at once
    for turn in [[w] for w in workers] if args.in_turn else [workers]:
        if not all(ask(w, args.agent_port, key, "start") for w in turn):
            return head_back(args, "a worker did not start")
        if not wait_all(turn, args.port, up=True, timeout=args.timeout):
            return head_back(
                args, f"{', '.join(turn) if args.in_turn else 'workers'} did not come up"
            )
    head_started(args)
    log("workers up; head starting")
    return 0


def head_started(args: argparse.Namespace) -> None:
    try:
        os.unlink(MARKER)
    except OSError:
        pass
    subprocess.run(["systemctl", "--no-block", "start", args.head_unit], check=False)


def head_back(args: argparse.Namespace, why: str) -> int:
    """A restart that failed after the head stopped: the head is started again (its start gate
    waits for the workers and asks a missing one's agent to start), never left down."""
    head_started(args)
    log(
        f"the ordered restart failed ({why}): the head is starting again (its start gate "
        "waits for the workers)"
    )
    return 1


class WatchdogPolicy:
    """When to restart (pure: fed observations and the clock)."""

    def __init__(self, fails: int, grace: float, max_restarts: int, window: float) -> None:
        self.fails, self.grace = fails, grace
        self.max_restarts, self.window = max_restarts, window
        self.misses = 0
        self.started_at: float | None = None
        self.healthy = False  # /health answered 200 since this start
        self.restarts: list[float] = []

    def observe(
        self,
        now: float,
        active: bool,
        probe_ok: bool | None,
        health_ok: bool | None = None,
        stalled: bool = False,
    ) -> str:
        """Returns "restart", "give-up" or "" (nothing to do). Failed completions count only
        after the first /health 200 since the start: a cold boot (~25-36 min) is not a failure,
        and a boot that never gets healthy is the start's (and its ready timeout's) to fail.
        ``stalled`` (work in flight that did not move for stall_s) restarts at once."""
        self.restarts = [t for t in self.restarts if now - t < self.window]
        if self.restarts and now - self.restarts[-1] < self.grace:
            return ""  # a restart is still taking (the unit may not even be activating yet)
        if not active:
            self.started_at, self.misses, self.healthy = None, 0, False
            return ""  # down: the supervisor's business (and an operator's stop is left alone)
        if self.started_at is None:
            self.started_at = now
        self.healthy = self.healthy or bool(health_ok)
        if now - self.started_at < self.grace or not self.healthy:
            return ""
        if stalled:
            return self._restart(now, "stall")
        if probe_ok is None:
            return ""
        self.misses = 0 if probe_ok else self.misses + 1
        return self._restart(now, "completions fail") if self.misses >= self.fails else ""

    def _restart(self, now: float, why: str) -> str:
        if len(self.restarts) >= self.max_restarts:
            return "give-up"
        self.restarts.append(now)
        self.misses, self.started_at, self.healthy = 0, None, False
        return "restart"


def http_ok(url: str, timeout: float = 10.0) -> bool:
    """True when GET url answers 200 (the watchdog's /health check)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def watchdog(args: argparse.Namespace) -> int:
    read_key(args.token_file)  # its restarts sign with it: refuse to start without a good one
    policy = WatchdogPolicy(args.fails, args.grace, args.max_restarts, args.window)
    clock = wedge.StallClock(args.stall)
    write_budget("watchdog", policy.restarts, args.max_restarts, args.window)
    gave_up = False
    log(
        f"watchdog for {args.head_unit}: probe every {args.interval:.0f} s after {args.grace:.0f} s"
        f"; stalled when requests in flight move nothing in {args.metrics_url} for "
        f"{args.stall:.0f} s; while idle a short completion, {args.fails} failures in a row"
    )
    while True:
        now = time.monotonic()
        active, _ = unit_state(args.head_unit)
        health_ok = None
        seen: wedge.Probe | None = None
        if active and policy.started_at is not None and now - policy.started_at >= args.grace:
            if not policy.healthy:
                health_ok = http_ok(args.health_url)
            if policy.healthy or health_ok:
                seen = wedge.probe(
                    args.metrics_url, clock, now, lambda: canary(args.probe),
                    read=lambda url: wedge.read_metrics(url, parser=args.progress_parser),
                )  # fmt: skip
                wedge.write_probe(wedge.probe_file(RUN), seen)
        else:
            clock.reset()
        probe_ok = None if seen is None else seen.ok
        stalled = seen is not None and seen.rule == "stall"
        verdict = policy.observe(now, active, probe_ok, health_ok, stalled=stalled)
        if verdict == "restart" and seen is not None:
            gave_up = False
            clock.reset()
            write_budget("watchdog", policy.restarts, args.max_restarts, args.window)
            rule = fired(seen, args.fails)
            log(f"rule {rule} fired: {seen.detail}; restarting the pair in order")
            restart_pair(args)
        elif verdict == "give-up" and not gave_up:
            gave_up = True
            log(
                f"{args.max_restarts} restarts in {args.window:.0f} s: giving up, pair stays down "
                f"(last probe: {seen.text(time.time()) if seen else '-'})"
            )
        time.sleep(args.interval)


# the probe's exits that are the watchdog's own failure, not the engine's: 2 (sparkhost gate's
# usage error: the API key file unreadable or empty), 126 and 127 (the program not runnable)
OWN_EXITS = (2, 126, 127)


def canary(command: str) -> bool | None:
    """The short real completion (the gate job's probe) run while the engine is idle; None when
    the probe itself could not run (``OWN_EXITS``: said in the journal, never a failed
    completion: a deleted key file must not restart a healthy pair)."""
    try:  # an argv (shlex-joined in the unit), never a shell: nothing in it is interpreted
        done = subprocess.run(
            shlex.split(command), check=False, capture_output=True, text=True, timeout=300
        )
    except (OSError, ValueError, subprocess.TimeoutExpired) as err:
        if isinstance(err, subprocess.TimeoutExpired):
            log("the canary failed: no answer in 300 s")
            return False
        log(f"the canary could not run ({err}); not the engine's failure")
        return None
    if done.returncode in OWN_EXITS:
        said = (done.stderr.strip().splitlines() or ["no message"])[-1]
        log(f"the canary could not run (exit {done.returncode}: {said}); not the engine's failure")
        return None
    if done.returncode != 0:
        log(f"the canary failed (exit {done.returncode}): {done.stdout.strip()[-300:]}")
    return done.returncode == 0


def fired(seen: wedge.Probe, fails: int) -> str:
    """The rule a restart came from, as the journal names it."""
    if seen.rule == "stall":
        return "stall"
    return f"canary ({fails} failed completions in a row)"


class SupervisorPolicy:
    """When the head restarts a pair that went down by itself (pure: fed observations)."""

    def __init__(self, max_restarts: int, window: float, settle: float) -> None:
        self.max_restarts, self.window, self.settle = max_restarts, window, settle
        self.restarts: list[float] = []
        self.lock = threading.Lock()  # the rounds and the workers' requests share the budget

    def observe(
        self, now: float, active: bool, went_down: bool, operator: bool, workers_ready: bool
    ) -> str:
        """Returns restart, wait (down by itself, a worker not back), give-up or nothing ("")."""
        with self.lock:
            return self._observe(now, active, went_down, operator, workers_ready)

    def _observe(
        self, now: float, active: bool, went_down: bool, operator: bool, workers_ready: bool
    ) -> str:
        self.restarts = [t for t in self.restarts if now - t < self.window]
        if active or operator or not went_down:
            return ""  # serving or starting; an operator's stop; never started (a fresh host)
        if self.restarts and now - self.restarts[-1] < self.settle:
            return ""  # the last restart is still taking
        if not workers_ready:
            return "wait"
        if len(self.restarts) >= self.max_restarts:
            return "give-up"
        self.restarts.append(now)
        return "restart"

    def request(self, now: float) -> str:
        """A worker's request for an ordered restart, under the rounds' budget: "" when granted
        (and counted), else why it is refused."""
        with self.lock:
            self.restarts = [t for t in self.restarts if now - t < self.window]
            if len(self.restarts) < self.max_restarts:
                self.restarts.append(now)
                return ""
            again = self.restarts[0] + self.window - now
        return (
            f"refused: the supervisor's budget of {self.max_restarts} restarts in "
            f"{self.window:.0f} s is spent; the next is allowed in {again:.0f} s (or on the "
            "head: sudo sparkrig-restart-pair)"
        )

    def forget(self, when: float) -> None:
        """Uncount the restart granted at ``when`` (another one was under way)."""
        with self.lock:
            if when in self.restarts:
                self.restarts.remove(when)


def agent_ready(worker: str, port: int) -> tuple[bool, str]:
    try:
        with urllib.request.urlopen(f"http://{worker}:{port}/ready", timeout=5) as r:
            return bool(r.status == 200), "ready"
    except urllib.error.HTTPError as err:
        return False, refusal(err)
    except OSError:
        return False, f"agent {worker}:{port} not answering"


def down_reason(head_unit: str, failed: bool) -> str:
    return read_flag(MARKER) or (f"{head_unit} failed" if failed else "")


class Supervisor(Handler):
    """POST /restart-pair (signed): a worker whose deploy ran without the head asks for an
    ordered restart, under the supervisor's own budget (429 and why when it is spent); answered
    once the head's start was issued (202) or the restart failed (500)."""

    args: argparse.Namespace
    policy: SupervisorPolicy

    def do_POST(self) -> None:  # noqa: N802
        if not self.signed():
            return
        if self.path != "/restart-pair":
            self.answer(404)
            return
        client = self.client_address[0]
        lock = RestartLock()
        if lock.acquire():
            try:
                refused = self.policy.request(time.monotonic())
                if refused:
                    log(f"ordered restart of the pair requested by {client} {refused}")
                    self.answer(429, refused)
                    return
                p = self.policy
                write_budget("supervisor", p.restarts, p.max_restarts, p.window)
                log(f"ordered restart of the pair requested by {client}")
                ok = _restart_pair(self.args) == 0
            finally:
                lock.release()
        else:  # a restart is under way: wait for it, never run a second one
            log(f"ordered restart requested by {client}: one is under way; waiting for it")
            ok = lock.acquire(timeout=self.args.timeout + 300)
            lock.release()
            ok = ok and unit_state(self.args.head_unit)[0]
        self.answer(202 if ok else 500)


def supervise(args: argparse.Namespace) -> int:
    policy = SupervisorPolicy(args.max_restarts, args.window, settle=args.timeout)
    Supervisor.args, Supervisor.policy = args, policy
    Supervisor.verifier = pairmac.Verifier(read_key(args.token_file), args.mac_window)
    serve_all(args.listen, Supervisor, block=False)
    workers = [p for p in args.workers.split(",") if p]
    write_budget("supervisor", policy.restarts, args.max_restarts, args.window)
    log(
        f"supervisor for {args.head_unit} on {args.listen}: restarts the pair in order when it "
        f"went down by itself and {', '.join(workers)} answer ready"
    )
    said = ""
    while True:
        said = supervise_round(args, policy, workers, said)
        time.sleep(args.interval)


def supervise_round(
    args: argparse.Namespace, policy: SupervisorPolicy, workers: list[str], said: str
) -> str:
    """One look at the pair. While someone else's ordered restart (an operator's
    sparkrig-restart-pair, a worker's request, the watchdog) has the head stopped, the pair did not
    go down by itself: the round neither restarts nor spends the budget. The lock is only tested,
    not held, so a worker's request arriving meanwhile is never mistaken for a restart under way.
    Returns what was said."""
    if restart_under_way():
        return said
    now = time.monotonic()
    active, failed = unit_state(args.head_unit)
    went_down = failed or os.path.exists(MARKER)
    operator = os.path.exists(OPERATOR)
    waiting: list[str] = []
    if went_down and not active and not operator:
        gone = docker_state()
        if gone:
            waiting.append(f"the head ({gone})")
        for w in workers:
            ok, why = agent_ready(w, args.agent_port)
            if not ok:
                waiting.append(f"{w} ({why})")
    verdict = policy.observe(now, active, went_down, operator, not waiting)
    reason = down_reason(args.head_unit, failed)
    if verdict == "restart":
        log(f"the pair went down by itself ({reason}); every worker is back: restarting it")
        if restart_pair(args) == LOCKED:  # one began since the test above: not ours to count
            policy.forget(now)
        write_budget("supervisor", policy.restarts, args.max_restarts, args.window)
        return ""
    msg = ""
    if verdict == "wait":
        msg = (
            f"the pair went down by itself ({reason}); waiting for {', '.join(waiting)}: it "
            "restarts in order once every worker's agent answers ready"
        )
    elif verdict == "give-up":
        msg = (
            f"{args.max_restarts} restarts in {args.window:.0f} s did not keep the pair up "
            f"({reason}); leaving it down for a human: read journalctl -u {args.head_unit} "
            "-u sparkrig-pair on every rank, then run sudo sparkrig-restart-pair on the head"
        )
    elif active:
        return ""
    if msg and msg != said:
        log(msg)
        return msg
    return said


def restart_pair_request(args: argparse.Namespace) -> urllib.request.Request:
    """The signed POST /restart-pair to the head's supervisor (``--head``, ``--agent-port``,
    ``--token-file``)."""
    return signed_post(args.head, args.agent_port, "/restart-pair", read_key(args.token_file))


def alone(args: argparse.Namespace) -> int:
    """A worker's start gate: refuse to start while the head's rank runs (its beacon answers
    200). A rank started alone cannot join an engine that is already running (vLLM's head
    refuses it, and NCCL's communicator was made without it): the head's supervisor is asked
    for an ordered restart, which stops the head, then starts this worker, then the head."""
    if not beacon_up(args.head, args.port):
        return 0
    log(
        f"the head's rank runs ({args.head}:{args.port} answers): a worker started alone cannot "
        "join its engine; this start is refused and the head's supervisor is asked to restart "
        "the pair in order"
    )
    try:  # not waited for: the restart it starts stops and starts this very unit
        urllib.request.urlopen(restart_pair_request(args), timeout=3).close()
    except OSError:
        pass
    return 1


def request(args: argparse.Namespace) -> int:
    """A worker's deploy without the head: ask the head's supervisor for an ordered restart."""
    req = restart_pair_request(args)
    log(f"asking the head's supervisor at {args.head}:{args.agent_port} for an ordered restart")
    try:
        with urllib.request.urlopen(req, timeout=args.timeout) as r:
            ok = r.status == 202
    except OSError as err:
        log(f"the head's supervisor did not restart the pair: {refusal(err)}")
        ok = False
    if not ok:
        log(
            "the pair is not restarted: run the deploy with the head in it "
            "(pyinfra inventory.py deploy.py), or on the head: sudo sparkrig-restart-pair"
        )
        return 1
    if not wait_all([args.head], args.port, up=True, timeout=args.timeout):
        log(f"the head's rank did not come up within {args.timeout:.0f} s")
        return 1
    log("the head restarted the pair in order; its rank is up")
    return 0


def use_device(device: str) -> None:
    """Bind every listener (GuardedServer) and every urlopen of this process to ``device``."""
    if device:
        GuardedServer.device = device
        urllib.request.install_opener(device_opener(device))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="mode", required=True)
    w = sub.add_parser("watch", help="beacon + stop this rank when a peer goes down")
    w.add_argument("--unit", required=True)
    w.add_argument("--container", required=True)
    w.add_argument("--listen", required=True,
                   help="fabric IP:port of this rank's beacon (comma-separated: each address a "
                   "peer dials this rank at)")  # fmt: skip
    w.add_argument("--fails", type=int, default=3)
    w.add_argument("--grace", type=float, default=1800)
    wt = sub.add_parser("wait", help="wait until every peer's beacon answers")
    for sp in (w, wt):
        sp.add_argument("--peers", required=True, help="comma-separated fabric IPs")
        sp.add_argument("--port", type=int, required=True)
        sp.add_argument("--interval", type=float, default=1.0)
    wt.add_argument("--timeout", type=float, default=600)
    wt.add_argument("--agent-port", type=int, default=0, help="ask missing workers' agents ...")
    wt.add_argument("--token-file", default="", help="... to start their ranks (head)")
    wt.add_argument(
        "--in-turn", action="store_true", help="ask the workers' agents one at a time, in order"
    )
    st = sub.add_parser("stopping", help="ExecStop hook: record an operator's stop")
    st.add_argument("--unit", required=True)
    rq = sub.add_parser("request", help="worker: ask the head's supervisor for an ordered restart")
    al = sub.add_parser("alone", help="worker's start gate: refuse while the head's rank runs")
    for sp in (rq, al):
        sp.add_argument("--head", required=True, help="the head's fabric IP")
        sp.add_argument("--port", type=int, required=True, help="beacon port")
        sp.add_argument("--agent-port", type=int, required=True)
        sp.add_argument("--token-file", required=True)
    rq.add_argument("--timeout", type=float, default=600)
    a = sub.add_parser("agent", help="worker: start the rank unit when the head asks")
    a.add_argument("--listen", required=True, help="IP:port[,IP:port...] (as watch's)")
    a.add_argument("--unit", required=True)
    a.add_argument("--token-file", required=True)
    r = sub.add_parser("restart", help="head: restart the pair in order")
    d = sub.add_parser("watchdog", help="head: restart the pair when the engine is wedged")
    su = sub.add_parser("supervise", help="head: restart a pair that went down by itself")
    for sp in (r, d, su):
        sp.add_argument("--head-unit", required=True)
        sp.add_argument("--workers", required=True, help="comma-separated worker fabric IPs")
        sp.add_argument("--port", type=int, required=True, help="beacon port")
        sp.add_argument("--agent-port", type=int, required=True)
        sp.add_argument("--token-file", required=True)
        sp.add_argument("--timeout", type=float, default=300)
        sp.add_argument("--in-turn", action="store_true",
                        help="start the workers one at a time in --workers' order, each seen "
                        "up before the next (a stack that starts last-to-first)")  # fmt: skip
    d.add_argument("--probe", required=True, help="shell command: a real completion")
    d.add_argument("--health-url", default="http://127.0.0.1:8000/health",
                   help="probing starts after this answers 200 once since the start")  # fmt: skip
    d.add_argument("--metrics-url", default="http://127.0.0.1:8000/metrics",
                   help="vLLM's Prometheus metrics on the head")  # fmt: skip
    d.add_argument("--progress-parser", choices=sorted(wedge.PARSERS), default="vllm-metrics",
                   help="how --metrics-url is read (the engine family's counters)")  # fmt: skip
    d.add_argument("--stall", type=float, default=300,
                   help="seconds requests in flight may move nothing in /metrics")  # fmt: skip
    d.add_argument("--interval", type=float, default=60)
    d.add_argument("--fails", type=int, default=3)
    d.add_argument("--grace", type=float, default=1800)
    for sp in (d, su):
        sp.add_argument("--max-restarts", type=int, default=3)
        sp.add_argument("--window", type=float, default=21600)
    su.add_argument("--listen", required=True,
                    help="the head's fabric IP:agent port[,IP:port...] (as watch's)")  # fmt: skip
    su.add_argument("--interval", type=float, default=5)
    for sp in (a, su):
        sp.add_argument("--mac-window", type=float, default=pairmac.WINDOW_S,
                        help="seconds a signed request's time may be off")  # fmt: skip
    for sp in (w, wt, rq, al, a, su):  # the jobs that talk over the fabric alone
        sp.add_argument("--bind-device", default="",
                        help="the fabric netdev: listening and client sockets bound to it "
                        "(SO_BINDTODEVICE), so nothing is answered or sent on another")  # fmt: skip
    args = p.parse_args(argv)
    use_device(getattr(args, "bind_device", ""))
    modes = {
        "watch": watch,
        "wait": wait,
        "agent": agent,
        "restart": restart_pair,
        "stopping": stopping,
        "supervise": supervise,
        "request": request,
        "alone": alone,
    }
    try:
        return modes.get(args.mode, watchdog)(args)
    except pairmac.SecretError as err:  # a helper never starts on a secret that cannot sign
        log(str(err))
        return 1
