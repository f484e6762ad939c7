#!/usr/bin/env python3
"""Weights pipeline benchmarks (needs root; not a test). Results go to docs/weights.md by hand.

  python3 bench/weights/bench_weights.py [--files 40] [--file-mb 4] [--out results.json]

Lanes are veth pairs between two network namespaces (tests/weights/topo.py), shaped with tbf on
the server side (download direction) at the real uplink rates (11 and 4 MB/s). The volume is
scaled down: N files of M MiB instead of 123 files averaging 1.5 GiB.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from lab import fakehub  # noqa: E402
from sparkrig import lockfile  # noqa: E402
from tests.weights.topo import SERVER_IP, Topo, fetch_argv  # noqa: E402

FETCH = str(ROOT / "files" / "sparkhost")  # the host package
MB = 1e6

RAW_SERVER = r"""
import socket, sys
n = int(sys.argv[2]); buf = b"\0" * (1 << 20)
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[3]))); s.listen(8)
while True:
    c, _ = s.accept(); left = n
    while left > 0:
        left -= c.send(buf[: min(left, len(buf))])
    c.close()
"""
RAW_CLIENT = r"""
import socket, sys, time
dev, src, host, port = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
s = socket.socket()
if dev != "-":
    s.setsockopt(socket.SOL_SOCKET, 25, dev.encode() + b"\0")
if src != "-":
    s.bind((src, 0))
for _ in range(100):
    try:
        t0 = time.monotonic(); s.connect((host, port)); break
    except OSError:
        time.sleep(0.1); s.close(); s = socket.socket()
        if dev != "-": s.setsockopt(socket.SOL_SOCKET, 25, dev.encode() + b"\0")
        if src != "-": s.bind((src, 0))
got = 0; buf = bytearray(1 << 20)
while True:
    k = s.recv_into(buf)
    if not k: break
    got += k
print(got / (time.monotonic() - t0))
"""


def sh(cmd: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, check=False, **kw)  # type: ignore[call-overload]


def make_repo(root: Path, files: int, file_mb: float) -> tuple[Path, dict[str, object]]:
    sizes = [int(file_mb * (1 << 20))] * files
    fakehub.generate_repo(str(root), "bench/model", sizes, extra_small=True)
    st = fakehub.HubState(str(root), None, None, None)
    srv = fakehub.make_servers(st, ("127.0.0.1", 0), None)[0]
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    lock = lockfile.build_lock("bench/model", "main", f"http://127.0.0.1:{srv.server_address[1]}")
    srv.shutdown()
    path = root / "bench.lock.json"
    lockfile.write(lock, str(path))
    return path, lock


def timed(cmds: list[list[str]]) -> tuple[float, list[subprocess.CompletedProcess[str]]]:
    t0 = time.monotonic()
    procs = [
        subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for c in cmds
    ]
    outs = []
    for p in procs:
        out, _ = p.communicate()
        outs.append(subprocess.CompletedProcess(p.args, p.returncode, out, ""))
    return time.monotonic() - t0, outs


NICE = ["nice", "-n", "-10"]  # the build machine is shared with busy VMs: measure our code


def fetch_cmd(t: Topo, url: str, lock: Path, dest: Path, lanes: list[str]) -> list[str]:
    args = fetch_argv(
        lock, dest, url, "--progress-interval", "5", "--stamps", str(dest) + ".stamps.json"
    )
    for ln in lanes:
        args += ["--uplink", ln]
    return NICE + t.fetch_cmd(*args)


def raw_lane(t: Topo, i: int, nbytes: int) -> float:
    port = 9300 + i
    srv = subprocess.Popen(
        NICE + t.in_ns(t.srv, sys.executable, "-c", RAW_SERVER, SERVER_IP, str(nbytes), str(port))
    )
    time.sleep(0.3)
    try:
        out = sh(
            NICE
            + t.in_ns(
                t.cli, sys.executable, "-c", RAW_CLIENT, f"up{i}", t.up_ip(i), SERVER_IP, str(port)
            )
        )
        return float(out.stdout.strip())
    finally:
        srv.terminate()
        srv.wait()


def split_half(lock: dict[str, object], d: Path) -> list[Path]:
    """Two lockfiles with half the bytes each: the static split a recipe would do."""
    files = sorted(lock["files"], key=lambda f: -f["size"])  # type: ignore[index]
    halves: list[list[dict[str, object]]] = [[], []]
    sums = [0, 0]
    for f in files:  # static split by bytes: greedy to the lighter half
        k = 0 if sums[0] <= sums[1] else 1
        halves[k].append(f)
        sums[k] += int(f["size"])  # type: ignore[arg-type]
    out = []
    for k in range(2):
        p = d / f"half{k}.lock.json"
        lockfile.write(dict(lock, files=halves[k]), str(p))
        out.append(p)
    return out


def inner_seconds(out: str) -> float:
    """The fetcher's own transfer time from its 'done: ... in X s' line."""
    for line in out.splitlines():
        if " done: " in line and " in " in line:
            return float(line.split(" in ", 1)[1].split("s", 1)[0])
    return float("nan")


def lanes_bench(work: Path, files: int, file_mb: float, repeat: int) -> dict[str, object]:
    lock_path, lock = make_repo(work / "hub", files, file_mb)
    total = sum(int(f["size"]) for f in lock["files"])  # type: ignore[index]
    res: dict[str, object] = {"files": len(lock["files"]), "bytes": total, "repeat": repeat}  # type: ignore[arg-type]
    halves = split_half(lock, work)
    with Topo("b") as t:
        url = t.start_hub(work / "hub", nice=-10)
        sh(t.fetch_cmd("routes", "--uplink", "up0", "--uplink", "up1"))
        for name, rates in (("equal", (11 * MB, 11 * MB)), ("unequal", (11 * MB, 4 * MB))):
            t.shape(0, rates[0])
            t.shape(1, rates[1])
            raw = [raw_lane(t, i, int(rates[i] * 4)) for i in (0, 1)]
            r: dict[str, object] = {"tbf_rates": rates, "raw_tcp_lane": raw}
            d = work / "dst"
            dests = [work / "h0", work / "h1"]
            cases = {
                "two_lanes": ([fetch_cmd(t, url, lock_path, d, ["up0", "up1"])], [d]),
                "one_lane": ([fetch_cmd(t, url, lock_path, d, ["up0"])], [d]),
                "static_half": (
                    [fetch_cmd(t, url, halves[k], dests[k], [f"up{k}"]) for k in (0, 1)],
                    dests,
                ),
            }
            for case, (cmds, dd) in cases.items():
                walls, inners = [], []
                for _ in range(repeat):
                    for x in dd:
                        sh(["rm", "-rf", str(x), str(x) + ".stamps.json"])
                    el, outs = timed(cmds)
                    for o in outs:
                        if o.returncode != 0:
                            raise RuntimeError(f"{case}: {o.stdout}")
                    walls.append(el)
                    inners.append(max(inner_seconds(o.stdout) for o in outs))
                walls.sort()
                inners.sort()
                med, best, inner_med = walls[len(walls) // 2], walls[0], inners[len(inners) // 2]
                r[case] = {
                    "wall_s": walls,
                    "rate_median": total / med,
                    "vs_raw_sum_median": total / med / sum(raw),
                    "vs_raw_sum_best": total / best / sum(raw),
                    "vs_tbf_sum_median": total / med / sum(rates),
                    "vs_raw_sum_inner_median": total / inner_med / sum(raw),
                }
            res[name] = r
            print(name, json.dumps(r), flush=True)
    return res


def verify_bench(work: Path) -> dict[str, object]:
    res: dict[str, object] = {}
    # many small files: quick re-verify (stat vs stamp) of 123 and 5000 files
    for n in (123, 5000):
        d = work / f"many{n}"
        d.mkdir(parents=True, exist_ok=True)
        files = []
        for i in range(n):
            data = os.urandom(64)
            (d / f"model-{i:05d}.safetensors").write_bytes(data)
            files.append(
                {
                    "path": f"model-{i:05d}.safetensors",
                    "size": 64,
                    "sha256": hashlib.sha256(data).hexdigest(),
                }
            )
        lp = work / f"many{n}.lock.json"
        lp.write_text(json.dumps({"version": 1, "repo": "a/b", "commit": "0" * 40, "files": files}))
        base = [sys.executable, FETCH, "verify", "--lock", str(lp), "--dest", str(d)]
        sh(base)  # first pass hashes and stamps
        t0 = time.monotonic()
        out = sh(base + ["--mode", "quick"])
        wall = time.monotonic() - t0
        j = json.loads(out.stdout)
        assert j["hashed_bytes"] == 0 and j["verified"] == n
        res[f"quick_{n}_files"] = {"inner_s": j["seconds"], "wall_s_incl_python": wall}
    # full verify vs single-core hashlib: 4 x 256 MiB in page cache
    d = work / "big"
    d.mkdir(exist_ok=True)
    files = []
    chunk = os.urandom(1 << 20)
    for i in range(4):
        h = hashlib.sha256()
        with open(d / f"s{i}.safetensors", "wb") as fh:
            for _ in range(256):
                fh.write(chunk)
                h.update(chunk)
        files.append({"path": f"s{i}.safetensors", "size": 256 << 20, "sha256": h.hexdigest()})
    lp = work / "big.lock.json"
    lp.write_text(json.dumps({"version": 1, "repo": "a/b", "commit": "0" * 40, "files": files}))
    total = 4 * (256 << 20)
    os.sync()  # no writeback of the fresh files during the timing
    for f in files:  # warm the page cache
        Path(d / f["path"]).read_bytes()
    singles, fulls = [], []
    for _ in range(3):  # best of 3 each: the build machine is shared
        t0 = time.monotonic()
        for f in files:
            h = hashlib.sha256()
            with open(d / f["path"], "rb", buffering=0) as fh:
                buf = bytearray(8 << 20)
                mv = memoryview(buf)
                while k := fh.readinto(buf):
                    h.update(mv[:k])
        singles.append(total / (time.monotonic() - t0))
        out = json.loads(sh([sys.executable, FETCH, "verify", "--lock", str(lp), "--dest",
                             str(d), "--mode", "full"]).stdout)  # fmt: skip
        fulls.append(out["hash_rate"])
    single, full = max(singles), max(fulls)
    res["full_verify"] = {
        "cores": os.cpu_count(),
        "bytes": total,
        "single_core_hashlib": single,
        "full_verify_rate": full,
        "speedup": full / single,
        "runs": {"single": singles, "full": fulls},
    }
    print("verify", json.dumps(res), flush=True)
    return res


def copy_bench(work: Path) -> dict[str, object]:
    """Fabric-copy stand-in: serve + bound lane(s) vs a raw TCP stream on the same veth.
    The copy writes to tmpfs (/dev/shm) so the disk of this VM is not what is measured."""
    src = work / "big"
    lp = work / "big.lock.json"
    total = sum(f["size"] for f in json.loads(lp.read_text())["files"])
    res: dict[str, object] = {}
    shm = Path(tempfile.mkdtemp(prefix="srw-copy-", dir="/dev/shm"))
    try:
        with Topo("c", lanes=1) as t:
            for label, rate in (("unshaped", None), ("shaped_100MB", 100 * MB)):
                if rate:
                    t.shape(0, rate, burst=256 * 1024)
                serve = [FETCH, "serve", "--dir", str(src), "--listen", f"{t.dn_ip(0)}:9200",
                         "--bind-device", "dn0"]  # fmt: skip
                srv = subprocess.Popen(
                    t.in_ns(t.srv, sys.executable, *serve),
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                )  # fmt: skip
                time.sleep(0.5)
                r: dict[str, object] = {"bytes": total}
                for streams in (1, 2):
                    dst = shm / f"copy-{label}-{streams}"
                    t0 = time.monotonic()
                    out = sh(t.fetch_cmd(
                        "fetch", "--lock", str(lp), "--dest", str(dst), "--base-url",
                        f"http://{t.dn_ip(0)}:9200/", "--uplink", "up0",
                        "--streams", str(streams),
                    ))  # fmt: skip
                    el = time.monotonic() - t0
                    assert out.returncode == 0, out.stdout
                    r[f"copy_rate_{streams}_streams"] = total / el
                    sh(["rm", "-rf", str(dst), str(dst) + ".stamps.json",
                        str(dst) + ".fetch-status.json"])  # fmt: skip
                srv.terminate()
                srv.wait()
                raw_srv = subprocess.Popen(
                    t.in_ns(t.srv, sys.executable, "-c", RAW_SERVER, t.dn_ip(0), str(total), "9201")
                )
                time.sleep(0.3)
                raw = float(sh(t.in_ns(t.cli, sys.executable, "-c", RAW_CLIENT, "up0",
                                       t.up_ip(0), t.dn_ip(0), "9201")).stdout)  # fmt: skip
                raw_srv.terminate()
                raw_srv.wait()
                r["raw_tcp_rate"] = raw
                for streams in (1, 2):
                    r[f"ratio_{streams}_streams"] = float(r[f"copy_rate_{streams}_streams"]) / raw  # type: ignore[arg-type]
                res[label] = r
    finally:
        sh(["rm", "-rf", str(shm)])
    print("copy", json.dumps(res), flush=True)
    return res


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=120)
    ap.add_argument("--file-mb", type=float, default=1.4)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", default="-")
    ap.add_argument("--only", choices=["lanes", "verify", "copy"], action="append")
    a = ap.parse_args()
    only = set(a.only or ["lanes", "verify", "copy"])
    with tempfile.TemporaryDirectory(prefix="srw-bench-") as tmp:
        work = Path(tmp)
        res: dict[str, object] = {"cpu": os.cpu_count(), "kernel": os.uname().release}
        if "lanes" in only:
            res["lanes"] = lanes_bench(work, a.files, a.file_mb, a.repeat)
        if "verify" in only or "copy" in only:
            res["verify"] = verify_bench(work)
        if "copy" in only:
            res["copy"] = copy_bench(work)
    text = json.dumps(res, indent=1, sort_keys=True)
    if a.out == "-":
        print(text)
    else:
        Path(a.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
