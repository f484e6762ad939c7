"""``sparkhost fetch``: download every file of a lockfile not yet verified, one lane per uplink.

From a Hub endpoint (``{endpoint}/{repo}/resolve/{commit}/{path}``, following the redirect to the
CDN) or from a plain file server (``--base-url``, the fabric copy from the head). Files land as
``<dest>/<path>.part``, are hashed while streaming, resumed with Range after a restart, and renamed
into place only when size and hash match. Exit 0 when every file is verified, 1 otherwise.

The HF token is read from a file (``--token-file``, should be 0600); it is sent only to the hub
origin, never to a redirect target or a --base-url server, and never printed."""

from __future__ import annotations

import argparse
import fcntl
import http.client
import os
import queue
import socket
import ssl
import subprocess
import sys
import threading
import time
from typing import Any
from urllib.parse import quote, urljoin, urlsplit

from sparkhost import tokenfile
from sparkhost.common import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    SO_BINDTODEVICE,
    VERSION,
    gib,
    log,
    progress_line,
    write_json_atomic,
)
from sparkhost.lockfile import Entry, load_lock
from sparkhost.routes import iface_ipv4, plan_routes
from sparkhost.stamps import (
    Stamps,
    add_lock_args,
    classify,
    default_stamps,
    default_status,
    hash_into,
    new_hasher,
    parallel_hash,
)

CHUNK = 1 << 20  # read/write/hash unit; at most this much is re-fetched after a kill -9
USER_AGENT = "sparkrig-fetch/" + VERSION


# ---------------------------------------------------------------------------------------------
# network: bound connections


class NetError(Exception):
    """Transport trouble: the file goes back to the queue and counts against the lane."""


class HttpStatusError(Exception):
    def __init__(self, status: int, url: str):
        super().__init__(f"HTTP {status} for {redact_url(url)}")
        self.status = status


class SizeMismatch(Exception):
    """The server's size for a file differs from the lockfile's: that file fails alone (no retry,
    never counted against the lane): the lockfile or the repo is wrong, not the network."""


class VerifyError(Exception):
    pass


def redact_url(url: str) -> str:
    u = urlsplit(url)
    return f"{u.scheme}://{u.netloc}{u.path}" + ("?…" if u.query else "")


class Lane:
    def __init__(self, name: str, iface: str | None, src: str | None, auto_src: bool):
        self.name = name
        self.iface = iface
        self.fixed_src = src
        self.auto_src = auto_src
        self.bytes = 0
        self.samples: list[tuple[float, int]] = []
        self.failures = 0  # consecutive
        self.total_failures = 0
        self.state = "idle"
        self.current: str | None = None
        self.files_done = 0
        self.lock = threading.Lock()
        # keep-alive connections of this lane, one per origin (used by its own thread only)
        self.conns: dict[tuple[str, str, int], http.client.HTTPConnection] = {}

    def drop_conns(self) -> None:
        for c in self.conns.values():
            c.close()
        self.conns.clear()

    def src(self) -> str | None:
        if self.fixed_src:
            return self.fixed_src
        if self.iface and self.auto_src:
            return iface_ipv4(self.iface)
        return None

    def count(self, n: int) -> None:
        with self.lock:
            self.bytes += n

    def rate(self, now: float, window: float = 10.0) -> float:
        with self.lock:
            self.samples.append((now, self.bytes))
            while len(self.samples) > 2 and now - self.samples[0][0] > window:
                self.samples.pop(0)
            t0, b0 = self.samples[0]
        return (self.bytes - b0) / (now - t0) if now - t0 > 0.2 else 0.0


def open_socket(
    host: str, port: int, lane: Lane, connect_timeout: float, read_timeout: float
) -> socket.socket:
    src = lane.src()
    if lane.iface and lane.auto_src and src is None:
        raise NetError(f"lane {lane.name}: {lane.iface} has no IPv4 address")
    family = socket.AF_INET if src and ":" not in src else 0
    try:
        infos = socket.getaddrinfo(host, port, family, socket.SOCK_STREAM)
    except OSError as e:
        raise NetError(f"resolve {host}: {e}") from e
    last: Exception | None = None
    for fam, kind, proto, _, sa in infos:
        s = socket.socket(fam, kind, proto)
        try:
            if lane.iface:  # before connect: this picks the output interface
                s.setsockopt(socket.SOL_SOCKET, SO_BINDTODEVICE, lane.iface.encode() + b"\0")
            if src:
                s.bind((src, 0))  # and the source address the policy rule matches
            s.settimeout(connect_timeout)
            s.connect(sa)
            s.settimeout(read_timeout)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return s
        except OSError as e:
            last = e
            s.close()
    raise NetError(f"connect {host}:{port} via {lane.name}: {last}")


class BoundHTTPConnection(http.client.HTTPConnection):
    def __init__(self, host: str, port: int | None, lane: Lane, ct: float, rt: float):
        super().__init__(host, port, timeout=rt)
        self._lane, self._ct, self._rt = lane, ct, rt

    def connect(self) -> None:
        self.sock = open_socket(self.host, self.port, self._lane, self._ct, self._rt)


class BoundHTTPSConnection(http.client.HTTPSConnection):
    def __init__(self, host: str, port: int | None, lane: Lane, ct: float, rt: float):
        super().__init__(host, port, timeout=rt, context=ssl.create_default_context())
        self._lane, self._ct, self._rt = lane, ct, rt

    def connect(self) -> None:
        raw = open_socket(self.host, self.port, self._lane, self._ct, self._rt)
        self.sock = self._context.wrap_socket(raw, server_hostname=self.host)  # type: ignore[attr-defined]


def origin(url: str) -> tuple[str, str, int]:
    u = urlsplit(url)
    port = u.port or (443 if u.scheme == "https" else 80)
    return (u.scheme, (u.hostname or "").lower(), port)


def request(
    url: str,
    lane: Lane,
    headers: dict[str, str],
    auth_origin: tuple[str, str, int] | None,
    token: str | None,
    ct: float,
    rt: float,
) -> tuple[http.client.HTTPResponse, tuple[str, str, int]]:
    """GET following redirects; Authorization only to auth_origin. Reuses the lane's
    keep-alive connection to each origin; the caller must read the body to the end (then the
    connection stays pooled) or call lane.drop_conns()."""
    for _ in range(6):
        u = urlsplit(url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise NetError(f"bad URL {redact_url(url)}")
        o = origin(url)
        h = {"User-Agent": USER_AGENT, "Accept-Encoding": "identity", **headers}
        if token and auth_origin is not None and o == auth_origin:
            h["Authorization"] = f"Bearer {token}"
        target = (u.path or "/") + (f"?{u.query}" if u.query else "")
        resp = None
        for attempt in (0, 1):
            conn = lane.conns.get(o)
            reused = conn is not None
            if conn is None:
                cls = BoundHTTPSConnection if u.scheme == "https" else BoundHTTPConnection
                conn = lane.conns[o] = cls(u.hostname, u.port, lane, ct, rt)
            try:
                conn.request("GET", target, headers=h)
                resp = conn.getresponse()
                break
            except NetError:
                lane.conns.pop(o, None)
                conn.close()
                raise
            except (OSError, http.client.HTTPException) as e:
                lane.conns.pop(o, None)
                conn.close()
                if reused and attempt == 0:  # a pooled connection the server had closed
                    continue
                raise NetError(f"{type(e).__name__}: {e}") from e
        assert resp is not None
        if resp.will_close:
            lane.conns.pop(o, None)  # the response owns the socket now; closed with it
        if resp.status in (301, 302, 303, 307, 308):
            loc = resp.getheader("Location")
            try:
                resp.read()
            except (OSError, http.client.HTTPException):
                lane.conns.pop(o, None)
            resp.close()
            if not loc:
                raise NetError("redirect without Location")
            url = urljoin(url, loc)
            continue
        return resp, o
    raise NetError("too many redirects")


class Job:
    def __init__(self, e: Entry):
        self.e = e
        self.verify_failures = 0
        self.net_failures = 0
        self.last_have = -1


class Run:
    def __init__(
        self,
        args: argparse.Namespace,
        lock: dict[str, Any],
        jobs: list[Job],
        already: list[Entry] | None = None,
    ):
        self.args = args
        self.lock = lock
        self.dest = args.dest
        self.token = (
            tokenfile.read_secret(args.token_file, warn_shared=True) if args.token_file else None
        )
        if args.base_url:
            self.base = args.base_url.rstrip("/") + "/"
            self.auth_origin = None
        else:
            ep = args.endpoint.rstrip("/")
            self.base = f"{ep}/{lock['repo']}/resolve/{lock['commit']}/"
            self.auth_origin = origin(ep)
        self.pending = sorted(jobs, key=lambda j: (-j.e.size, j.e.path))
        self.cv = threading.Condition()
        self.inflight = 0
        self.failed: list[tuple[str, str]] = []
        already = already or []
        self.done_files = len(already)  # verified before this run, then + finished in it
        self.total_files = len(jobs) + len(already)
        self.total_bytes = sum(j.e.size for j in jobs) + sum(e.size for e in already)
        self.done_bytes = sum(e.size for e in already)
        self.part_bytes: dict[str, int] = {}  # bytes present in .part of files in flight
        self.lanes: list[Lane] = []
        self.alive = 0
        self.t0 = time.monotonic()
        self.stamps = Stamps(args.stamps)
        self.stop = threading.Event()
        self.finalq: queue.Queue[tuple[Job, str, str] | None] = queue.Queue()

    # -- queue --------------------------------------------------------------------------------
    def take(self) -> Job | None:
        with self.cv:
            while True:
                if self.pending:
                    self.inflight += 1
                    return self.pending.pop(0)
                if self.inflight == 0:
                    return None
                self.cv.wait(0.5)

    def finish(self, job: Job, ok: bool, why: str = "") -> None:
        with self.cv:
            self.inflight -= 1
            self.part_bytes.pop(job.e.path, None)
            if ok:
                self.done_files += 1
                self.done_bytes += job.e.size
            else:
                self.failed.append((job.e.path, why))
            self.cv.notify_all()

    def requeue(self, job: Job) -> None:
        with self.cv:
            self.inflight -= 1
            self.pending.append(job)
            self.pending.sort(key=lambda j: (-j.e.size, j.e.path))
            self.cv.notify_all()

    def retire(self, lane: Lane) -> None:
        with self.cv:
            self.alive -= 1
            if self.alive == 0:
                for j in self.pending:
                    self.failed.append((j.e.path, "no lane left"))
                self.pending.clear()
            self.cv.notify_all()

    # -- one file -------------------------------------------------------------------------------
    def fetch_file(self, lane: Lane, job: Job) -> None:
        e = job.e
        final = os.path.join(self.dest, e.path)
        part = final + ".part"
        os.makedirs(os.path.dirname(final), exist_ok=True)
        h = new_hasher(e)
        have = 0
        if os.path.exists(part):
            sz = os.path.getsize(part)
            if sz > e.size:
                log(f"{e.path}: .part larger than expected ({sz} > {e.size}), discarded")
                os.unlink(part)
            elif sz:
                have = hash_into(h, part, sz)  # resume: re-hash what is there
        self.part_bytes[e.path] = have
        if have < e.size or e.size == 0:
            h = self._download(lane, job, part, h, have)
        else:
            open(part, "ab").close()  # a zero-byte file still needs its .part
        got_size = os.path.getsize(part)
        digest = h.hexdigest()
        if got_size != e.size or digest != e.digest:
            os.unlink(part)
            raise VerifyError(
                f"{e.path}: {e.algo} mismatch (size {got_size}/{e.size}, "
                f"got {digest[:16]}…, want {e.digest[:16]}…); .part deleted"
            )
        # matched: fsync + rename + stamp happen on the finalizer thread, so this lane starts
        # its next request at once
        self.finalq.put((job, part, final))

    def finalizer(self) -> None:
        last_save = time.monotonic()
        while True:
            item = self.finalq.get()
            if item is None:
                break
            job, part, final = item
            try:
                fd = os.open(part, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
                os.replace(part, final)
                dfd = os.open(os.path.dirname(final), os.O_RDONLY)
                try:
                    os.fsync(dfd)
                finally:
                    os.close(dfd)
                self.stamps.put(job.e, final)
                if self.finalq.empty() or time.monotonic() - last_save > 5:
                    self.stamps.save()
                    last_save = time.monotonic()
            except OSError as ex:
                log(f"{job.e.path}: finalising failed: {ex}")
                self.finish(job, False, f"finalise: {ex}")
                continue
            self.finish(job, True)
        self.stamps.save()

    def _download(self, lane: Lane, job: Job, part: str, h: Any, have: int) -> Any:
        """Stream the rest of the file into part; returns the hasher (new on a 200 restart)."""
        e = job.e
        url = self.base + quote(e.path)
        headers = {"Range": f"bytes={have}-"} if have else {}
        a = self.args
        resp, o = request(
            url, lane, headers, self.auth_origin, self.token, a.connect_timeout, a.read_timeout
        )
        clean = False
        try:
            if resp.status == 206 and have:
                cr = resp.getheader("Content-Range") or ""
                if not cr.startswith(f"bytes {have}-"):
                    raise NetError(f"{e.path}: unexpected Content-Range {cr!r}")
                total = cr.rpartition("/")[2]
                if total.isdigit() and int(total) != e.size:
                    raise SizeMismatch(
                        f"{e.path}: lockfile says {e.size} bytes, server sent {total}"
                    )
            elif resp.status == 200:
                length = resp.getheader("Content-Length") or ""
                if length.isdigit() and int(length) != e.size:
                    raise SizeMismatch(
                        f"{e.path}: lockfile says {e.size} bytes, server sent {length}"
                    )
                if have:
                    log(f"{e.path}: server ignored Range (200), restarting from 0")
                    have = 0
                    h = new_hasher(e)
            elif resp.status == 416:
                os.unlink(part)
                raise NetError(f"{e.path}: 416 for Range {have}-; .part discarded")
            else:
                raise HttpStatusError(resp.status, url)
            fd = os.open(part, os.O_WRONLY | os.O_CREAT, 0o644)
            try:
                os.ftruncate(fd, have)
                os.lseek(fd, have, os.SEEK_SET)
                buf = bytearray(CHUNK)
                mv = memoryview(buf)
                while True:
                    try:
                        n = resp.readinto(mv)
                    except (OSError, http.client.HTTPException) as ex:
                        raise NetError(f"{e.path}: read: {type(ex).__name__}: {ex}") from ex
                    if not n:
                        break
                    if have + n > e.size:
                        os.ftruncate(fd, 0)
                        raise SizeMismatch(
                            f"{e.path}: lockfile says {e.size} bytes, server sent more"
                        )
                    off = 0
                    while off < n:
                        off += os.write(fd, mv[off:n])
                    h.update(mv[:n])
                    have += n
                    lane.count(n)
                    self.part_bytes[e.path] = have
                    if self.stop.is_set():
                        raise NetError("stopping")
            finally:
                os.close(fd)
            if have != e.size:
                raise NetError(f"{e.path}: connection ended at {have}/{e.size}")
            clean = True
        finally:
            resp.close()
            if not clean:
                lane.drop_conns()
        return h

    # -- lanes ----------------------------------------------------------------------------------
    def lane_loop(self, lane: Lane) -> None:
        a = self.args
        try:
            while not self.stop.is_set():
                job = self.take()
                if job is None:
                    break
                lane.state, lane.current = "busy", job.e.path
                try:
                    self.fetch_file(lane, job)
                except SizeMismatch as ex:
                    log(f"lane {lane.name}: {ex} (not retried; fix the lockfile or the repo)")
                    self.finish(job, False, str(ex))
                    continue
                except VerifyError as ex:
                    job.verify_failures += 1
                    log(f"lane {lane.name}: {ex}")
                    if job.verify_failures >= a.max_verify_failures:
                        self.finish(job, False, str(ex))
                    else:
                        self.requeue(job)
                    continue
                except HttpStatusError as ex:
                    if ex.status in (401, 403, 404, 410):
                        log(f"lane {lane.name}: {job.e.path}: {ex} (not retried)")
                        self.finish(job, False, str(ex))
                        continue
                    self._lane_failed(lane, job, str(ex))
                except (NetError, OSError, http.client.HTTPException) as ex:
                    self._lane_failed(lane, job, f"{type(ex).__name__}: {ex}")
                else:
                    lane.failures = 0
                    lane.files_done += 1  # finish() comes from the finalizer
                    continue
                if lane.failures >= a.lane_failures:
                    log(f"lane {lane.name}: retired after {lane.failures} failures in a row")
                    lane.state = "retired"
                    return
                lane.state = "backoff"
                time.sleep(min(30.0, a.backoff * (2 ** (lane.failures - 1))))
        finally:
            lane.drop_conns()
            lane.current = None
            if lane.state != "retired":
                lane.state = "done"
            self.retire(lane)

    def _lane_failed(self, lane: Lane, job: Job, why: str) -> None:
        lane.failures += 1
        lane.total_failures += 1
        have = self.part_bytes.get(job.e.path, 0)
        if have > job.last_have:
            job.net_failures = 0
            job.last_have = have
        else:
            job.net_failures += 1
        log(f"lane {lane.name}: {job.e.path}: {why}; back to the queue")
        if job.net_failures >= self.args.max_file_attempts:
            self.finish(job, False, f"no progress after {job.net_failures} attempts: {why}")
        else:
            self.requeue(job)

    # -- progress ---------------------------------------------------------------------------------
    def snapshot(self, state: str) -> dict[str, Any]:
        now = time.monotonic()
        lanes = {}
        total_rate = 0.0
        for ln in self.lanes:
            r = ln.rate(now) if ln.state not in ("retired", "done") else 0.0
            total_rate += r
            lanes[ln.name] = {
                "iface": ln.iface,
                "state": ln.state,
                "rate": round(r),
                "bytes": ln.bytes,
                "files": ln.files_done,
                "failures": ln.total_failures,
                "current": ln.current,
            }
        with self.cv:
            in_part = sum(self.part_bytes.values())
            done = self.done_bytes + in_part
            failed = [{"path": p, "error": w} for p, w in self.failed]
        left = self.total_bytes - done
        eta = left / total_rate if total_rate > 0 else None
        return {
            "version": 1,
            "state": state,
            "pid": os.getpid(),
            "repo": self.lock["repo"],
            "commit": self.lock["commit"],
            "dest": self.dest,
            "elapsed_s": round(now - self.t0, 1),
            "updated": time.time(),
            "files_done": self.done_files,
            "files_total": self.total_files,
            "bytes_done": done,
            "bytes_total": self.total_bytes,
            "rate": round(total_rate),
            "eta_s": round(eta) if eta is not None else None,
            "lanes": lanes,
            "failed": failed,
        }

    def write_status(self, state: str) -> dict[str, Any]:
        snap = self.snapshot(state)
        if self.args.status:
            write_json_atomic(self.args.status, snap)
        return snap

    def reporter(self) -> None:
        while not self.stop.wait(self.args.progress_interval):
            print(progress_line(self.write_status("running")), flush=True)


def parse_lanes(specs: list[str], bind_src: bool, streams: int = 1) -> list[Lane]:
    """--uplink IF | IF=SRCIP | 'default' (unbound); `streams` lanes per uplink (name IF#k)."""
    lanes = []
    for spec in specs or ["default"]:
        for k in range(max(1, streams)):
            suffix = f"#{k + 1}" if streams > 1 else ""
            if spec == "default":
                lanes.append(Lane("default" + suffix, None, None, False))
                continue
            iface, _, src = spec.partition("=")
            lanes.append(Lane(iface + suffix, iface, src or None, bind_src and not src))
    return lanes


def prepare(
    entries: list[Entry], dest: str, stamps: Stamps, mode: str, jobs: int
) -> tuple[list[Entry], list[Entry], list[Entry]]:
    """Split into (verified, to_fetch, mismatched) and update stamps. quick: stamps trusted,
    unstamped full-size files hashed; full: everything present is hashed."""
    c = classify(entries, dest, stamps)
    to_hash = [e for e, _ in c["unverified"]]
    verified = [e for e, _ in c["verified"]]
    if mode == "full":
        to_hash += verified
        verified = []
    mismatched = [e for e, _ in c["mismatched"]]
    for e, ok, _err in parallel_hash(to_hash, dest, jobs):
        if ok:
            stamps.put(e, os.path.join(dest, e.path))
            verified.append(e)
        else:
            stamps.drop(e.path)
            mismatched.append(e)
    for e in mismatched:
        stamps.drop(e.path)
    to_fetch = mismatched + [e for e, _ in c["partial"]] + [e for e, _ in c["missing"]]
    return verified, to_fetch, mismatched


def cmd_fetch(args: argparse.Namespace) -> int:
    lock, entries = load_lock(args.lock)
    args.stamps = args.stamps or default_stamps(args.dest)
    if args.status is None:
        args.status = default_status(args.dest)
    if not args.base_url and not args.endpoint:
        print("fetch: need --endpoint or --base-url", file=sys.stderr)
        return EXIT_USAGE
    os.makedirs(args.dest, exist_ok=True)
    lock_fd = os.open(os.path.abspath(args.dest).rstrip("/") + ".lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        print(f"fetch: another fetch is running on {args.dest}", file=sys.stderr)
        return EXIT_FAILED
    # a fresh status at once (pid = this process), so `follow` never reads a previous run's
    write_json_atomic(
        args.status,
        {"version": 1, "state": "checking", "pid": os.getpid(), "repo": lock["repo"],
         "commit": lock["commit"], "dest": args.dest, "updated": time.time(),
         "files_done": 0, "files_total": len(entries), "bytes_done": 0,
         "bytes_total": sum(e.size for e in entries), "rate": 0, "eta_s": None,
         "lanes": {}, "failed": []},
    )  # fmt: skip
    if args.install_routes:
        ifaces = [u.partition("=")[0] for u in args.uplink if u != "default"]
        try:
            cmds, _ = plan_routes(ifaces, args.table_base, args.pref_base, {})
            for c in cmds:
                subprocess.run(c, check=True, capture_output=True)
                log("routes: " + " ".join(c))
        except (RuntimeError, subprocess.CalledProcessError, ValueError) as ex:
            log(f"routes: not installed ({ex}); lanes still bind their device")
    stamps = Stamps(args.stamps)
    t0 = time.monotonic()
    verified, to_fetch, mismatched = prepare(entries, args.dest, stamps, args.verify, args.jobs)
    for e in mismatched:
        final = os.path.join(args.dest, e.path)
        if os.path.exists(final):
            log(f"{e.path}: on-disk copy does not match the lockfile; removed, will re-fetch")
            os.unlink(final)
    stamps.save()
    need = sum(e.size for e in to_fetch)
    for e in to_fetch:
        try:
            need -= os.path.getsize(os.path.join(args.dest, e.path) + ".part")
        except OSError:
            pass
    vfs = os.statvfs(args.dest)
    free = vfs.f_bavail * vfs.f_frsize
    if need > free:
        msg = f"not enough space in {args.dest}: need {gib(need)} GiB, {gib(free)} GiB free"
        log("FAILED " + msg)
        write_json_atomic(
            args.status,
            {"version": 1, "state": "failed", "pid": os.getpid(), "repo": lock["repo"],
             "commit": lock["commit"], "dest": args.dest, "updated": time.time(),
             "files_done": len(verified), "files_total": len(entries), "bytes_done": 0,
             "bytes_total": sum(e.size for e in entries), "rate": 0, "eta_s": None,
             "lanes": {}, "failed": [{"path": args.dest, "error": msg}]},
        )  # fmt: skip
        return EXIT_FAILED
    log(
        f"{lock['repo']}@{lock['commit'][:12]}: {len(verified)}/{len(entries)} verified "
        f"({args.verify} check, {time.monotonic() - t0:.2f}s); fetching {len(to_fetch)} files, "
        f"{gib(sum(e.size for e in to_fetch))} GiB"
    )
    run = Run(args, lock, [Job(e) for e in to_fetch], verified)
    run.stamps = stamps
    run.lanes = parse_lanes(args.uplink, not args.no_bind_src, args.streams)
    if args.max_lanes:
        run.lanes = run.lanes[: args.max_lanes]
    for ln in run.lanes:
        if ln.iface:
            log(f"lane {ln.name}: device {ln.iface}, source {ln.src() or '(none)'}")
    run.alive = len(run.lanes)
    if not to_fetch:
        snap = run.write_status("done")
        print(progress_line(snap), flush=True)
        return EXIT_OK
    threads = [
        threading.Thread(target=run.lane_loop, args=(ln,), name=f"lane-{ln.name}", daemon=True)
        for ln in run.lanes
    ]
    rep = threading.Thread(target=run.reporter, daemon=True)
    fin = threading.Thread(target=run.finalizer, daemon=True)
    run.write_status("running")
    rep.start()
    fin.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    run.finalq.put(None)
    fin.join()
    run.stop.set()
    stamps.save()
    ok = not run.failed and run.done_files == run.total_files
    snap = run.write_status("done" if ok else "failed")
    print(progress_line(snap), flush=True)
    el = time.monotonic() - run.t0
    moved = sum(ln.bytes for ln in run.lanes)
    log(
        f"{'done' if ok else 'FAILED'}: {run.done_files}/{run.total_files} files, "
        f"{moved / 1e6:.1f} MB in {el:.1f}s ({moved / max(el, 1e-9) / 1e6:.2f} MB/s); "
        + ", ".join(f"{ln.name}: {ln.bytes / 1e6:.1f} MB/{ln.files_done} files" for ln in run.lanes)
    )
    for p, why in run.failed:
        log(f"FAILED {p}: {why}")
    return EXIT_OK if ok else EXIT_FAILED


def build_parser() -> argparse.ArgumentParser:
    f = argparse.ArgumentParser(prog="sparkhost fetch", description=__doc__.split("\n")[0])
    add_lock_args(f)
    f.add_argument("--endpoint", help="Hub base URL, e.g. https://huggingface.co")
    f.add_argument("--base-url", help="plain file server holding <path> (fabric copy)")
    f.add_argument(
        "--uplink",
        action="append",
        default=[],
        help="lane: IF (source IP from `ip -j addr` at run time), IF=SRCIP, or default",
    )
    f.add_argument("--no-bind-src", action="store_true", help="bind the device only")
    f.add_argument(
        "--streams",
        type=int,
        default=1,
        help="parallel connections per uplink (fabric copy: spreads hashing over cores)",
    )
    f.add_argument("--max-lanes", type=int, default=0)
    f.add_argument("--token-file", help="file holding the HF token (0600)")
    f.add_argument(
        "--install-routes",
        action="store_true",
        help="first make the per-uplink policy routes hold (as the routes job; needs root)",
    )
    f.add_argument("--table-base", type=int, default=100)
    f.add_argument("--pref-base", type=int, default=1000)
    f.add_argument("--status", help="JSON status file (default <dest>.fetch-status.json)")
    f.add_argument("--verify", choices=["quick", "full"], default="quick")
    f.add_argument("--connect-timeout", type=float, default=10.0)
    f.add_argument("--read-timeout", type=float, default=60.0)
    f.add_argument("--lane-failures", type=int, default=3, help="retire a lane after N in a row")
    f.add_argument("--backoff", type=float, default=2.0, help="first retry delay, doubles")
    f.add_argument("--max-verify-failures", type=int, default=3)
    f.add_argument("--max-file-attempts", type=int, default=8, help="attempts without progress")
    f.add_argument("--progress-interval", type=float, default=10.0)
    return f


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.dest = os.path.abspath(args.dest)
    return cmd_fetch(args)
