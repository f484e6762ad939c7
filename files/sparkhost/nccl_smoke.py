"""``sparkhost nccl-smoke``: NCCL all-reduce smoke test and fabric bandwidth floor, run in the
serving image on every rank (worker first) before the first start and after a fabric change
(docs/sources.md), with the rank's env file.

    docker run --rm --entrypoint python3 --env-file /etc/sparkrig/rank.env -e RANK=<r> \\
        -e WORLD_SIZE=<n> -e MASTER_ADDR=<head fabric ip> -e MASTER_PORT=<port> \\
        --gpus all --network host --ipc host --device /dev/infiniband:/dev/infiniband \\
        --ulimit memlock=-1:-1 --cap-add IPC_LOCK \\
        -v /opt/sparkrig/lib/sparkhost:/opt/sparkrig/lib/sparkhost:ro \\
        IMAGE /opt/sparkrig/lib/sparkhost nccl-smoke [--backend nccl] [--timeout 300] \\
        [--bytes 268435456] [--warmup 5] [--iters 20] [--min-busbw-gbs 8]

(the host package mounted read-only: the image does not carry it, so a change here rebuilds
no image and restarts no pair)

It initialises torch.distributed from the environment (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE;
WORLD is accepted for WORLD_SIZE; LOCAL_RANK picks the GPU, as torchrun sets it), runs one
all_reduce and checks the sum. Then it measures all-reduce bandwidth the way nccl-tests reports it
(doc/PERFORMANCE.md, src/all_reduce.cu of NVIDIA/nccl-tests): ``--warmup`` all-reduces of
``--bytes`` float32, then ``--iters`` timed ones; the time of one is the timed loop's wall time over
``--iters``, averaged over the ranks; algbw = bytes / time and busbw = algbw x 2(n-1)/n, in GB/s of
10^9 bytes. With NCCL it turns on NCCL_DEBUG=INFO (to NCCL_DEBUG_FILE unless one is set) and reads
which transport NCCL used: without /dev/infiniband or with a wrong HCA/GID, NCCL silently falls
back to sockets (16 vs 187 Gb/s, §3.1), so anything but NET/IB (InfiniBand or RoCE) fails the test;
so does a busbw below ``--min-busbw-gbs`` (the deploy's fabric_busbw_min_gbs), and, in
fabric_layout "ports", a device NCCL_IB_HCA names that NCCL did not use (exit 3).

Output: one JSON line per rank {"ok", "rank", "world_size", "backend", "sum", "transport",
"busbw_gbs", "algbw_gbs", "bytes", "iters", ...} (``SmokeResult.from_line`` reads it back).
Exit: 0 ok; 1 all-reduce failed or wrong sum; 2 bad environment/usage; 3 transport not IB/RoCE
(or unknown), including NCCL_NET=IB with no usable IB/RoCE device ("Failed to initialize any NET
plugin": NCCL fails init instead of falling back to sockets; the message names the HCA and what to
check); 4 torch not importable; 5 busbw below the floor (the message names the figure, the
transport and what to check).
    sparkhost nccl-smoke parse LOGFILE   judge an existing NCCL_DEBUG=INFO log (exit 0 or 3).
    sparkhost nccl-smoke --spawn N ...   run N ranks on this machine (127.0.0.1, a free port,
                                         LOCAL_RANK = rank), print their lines in rank order.
Stdlib only at import time; torch is imported when the test runs.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

EXIT_OK, EXIT_FAIL, EXIT_ENV, EXIT_TRANSPORT, EXIT_NO_TORCH, EXIT_SLOW = 0, 1, 2, 3, 4, 5
GB = 1e9  # nccl-tests' GB/s: bytes / 1.0E9 / seconds (src/all_reduce.cu, AllReduceGetBw)

_USING_NETWORK = re.compile(r"NCCL INFO Using network (\S+)")
_VIA = re.compile(r"\bvia (NET/[A-Za-z]+|P2P(?:/\S+)?|SHM(?:/\S+)?)")
_NET_USING = re.compile(r"NET/(IB|Socket)\s*:\s*Using\s+(.*)$")
_IB_DEV = re.compile(r"\[\d+\]([\w.-]+):(\d+)/(IB|RoCE)")
_NO_IB = re.compile(r"NET/IB : No device found|Failed to open libibverbs|NET/IB : Unable to")
# With NCCL_NET=IB (the env file's setting) a missing IB/RoCE device is not a socket fallback:
# NCCL 2.28.9 fails init with this line and torch reports "invalid usage" (real logs:
# tests/serving/data/nccl-2.28.9-no-ib/net_ib_env).
_NET_INIT_FAILED = re.compile(r"Failed to initialize any NET plugin")


@dataclass
class TransportInfo:
    network: str | None = None  # "IB" or "Socket" from "Using network X"
    paths: list[str] = field(default_factory=list)  # distinct "via NET/IB", "via NET/Socket", ...
    ib_devices: list[str] = field(default_factory=list)  # "rocep1s0f1:1/RoCE"
    socket_devices: str | None = None
    ib_unavailable: list[str] = field(default_factory=list)
    net_init_failed: bool = False  # "Failed to initialize any NET plugin"

    @property
    def transport(self) -> str | None:
        """The inter-node transport NCCL used: "IB" (incl. RoCE), "Socket", or None if unseen."""
        nets = {p.split("/", 1)[1] for p in self.paths if p.startswith("NET/")}
        if "Socket" in nets or (not nets and self.network == "Socket"):
            return "Socket"
        if nets == {"IB"} or (not nets and self.network == "IB"):
            return "IB"
        return None

    @property
    def link_layer(self) -> str | None:
        layers = {d.rsplit("/", 1)[-1] for d in self.ib_devices}
        return "RoCE" if "RoCE" in layers else ("IB" if layers else None)


def parse_nccl_log(lines: Iterable[str]) -> TransportInfo:
    info = TransportInfo()
    for line in lines:
        m = _USING_NETWORK.search(line)
        if m:
            info.network = m.group(1)
        for v in _VIA.findall(line):
            if v not in info.paths:
                info.paths.append(v)
        m = _NET_USING.search(line)
        if m:
            if m.group(1) == "IB":
                for dev, port, layer in _IB_DEV.findall(m.group(2)):
                    d = f"{dev}:{port}/{layer}"
                    if d not in info.ib_devices:
                        info.ib_devices.append(d)
            else:
                info.socket_devices = m.group(2).strip()
        if _NO_IB.search(line):
            info.ib_unavailable.append(line.strip()[:200])
        if _NET_INIT_FAILED.search(line):
            info.net_init_failed = True
    return info


def no_net_message(info: TransportInfo, env: Mapping[str, str]) -> str:
    """What to tell the operator when NCCL found no usable NET plugin (NCCL_NET=IB, no device)."""
    hca = env.get("NCCL_IB_HCA") or "(NCCL_IB_HCA unset)"
    seen = f" NCCL logged: {info.ib_unavailable[0]}." if info.ib_unavailable else ""
    return (
        f"NCCL found no IB/RoCE device for NCCL_NET={env.get('NCCL_NET', 'IB')}: "
        f"'Failed to initialize any NET plugin' (HCA {hca} missing or unusable in the "
        f"container).{seen} With NCCL_NET=IB NCCL does not fall back to sockets. Check that the "
        f"container gets --device /dev/infiniband, that {hca} is listed in "
        "/sys/class/infiniband on the host with its port ACTIVE (ibv_devinfo), and that the "
        "rdma modules (mlx5_ib) are loaded."
    )


def hca_names(value: str) -> list[str]:
    """The RDMA devices an NCCL_IB_HCA value names (``=dev:1,dev2:1``; ``^`` exclusions: none)."""
    if value.startswith("^"):
        return []
    return [d.split(":", 1)[0] for d in value.removeprefix("=").split(",") if d]


def unused_hcas(info: TransportInfo, env: Mapping[str, str]) -> list[str]:
    """fabric_layout "ports" (docs/rings.md): the devices NCCL_IB_HCA names that NCCL did not
    take ("NET/IB : Using ..."): the pair then runs on fewer functions than the plan."""
    if env.get("SPARKRIG_FABRIC_LAYOUT") != "ports":
        return []
    used = {d.split(":", 1)[0] for d in info.ib_devices}
    return [d for d in hca_names(env.get("NCCL_IB_HCA", "")) if d not in used]


def verdict(info: TransportInfo) -> tuple[bool, str]:
    """(ok, message): ok only when NCCL went over NET/IB (InfiniBand or RoCE)."""
    t = info.transport
    if info.net_init_failed and t is None:
        return False, no_net_message(info, {})
    if t == "IB":
        devs = ", ".join(info.ib_devices) or "device not logged"
        return True, f"NCCL used NET/IB ({info.link_layer or 'IB'}: {devs})"
    if t == "Socket":
        why = f"; IB unavailable: {info.ib_unavailable[0]}" if info.ib_unavailable else ""
        return False, (
            f"NCCL fell back to NET/Socket ({info.socket_devices or 'socket'}), not IB/RoCE{why}. "
            "Check --device /dev/infiniband, NCCL_IB_HCA, NCCL_IB_GID_INDEX and NCCL_NET=IB."
        )
    if info.paths:
        return False, f"no inter-node NET transport seen (paths: {', '.join(info.paths)})"
    return False, "could not tell which transport NCCL used (no NCCL_DEBUG=INFO lines found)"


@dataclass
class Rendezvous:
    master_addr: str
    master_port: int
    rank: int
    world_size: int
    local_rank: int = 0  # the GPU of this rank on its machine (torchrun's LOCAL_RANK)


def rendezvous_from_env(env: Mapping[str, str]) -> Rendezvous:
    """Read MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE (or WORLD), LOCAL_RANK (default 0);
    ValueError names what is wrong."""
    missing = [k for k in ("MASTER_ADDR", "MASTER_PORT", "RANK") if not env.get(k)]
    world = env.get("WORLD_SIZE") or env.get("WORLD")
    if not world:
        missing.append("WORLD_SIZE")
    if missing:
        raise ValueError(f"missing environment: {', '.join(missing)}")
    try:
        rv = Rendezvous(
            env["MASTER_ADDR"],
            int(env["MASTER_PORT"]),
            int(env["RANK"]),
            int(world or 0),
            int(env.get("LOCAL_RANK") or 0),
        )
    except ValueError:
        raise ValueError("MASTER_PORT, RANK, WORLD_SIZE and LOCAL_RANK must be integers") from None
    if rv.world_size < 1 or not 0 <= rv.rank < rv.world_size:
        raise ValueError(f"RANK {rv.rank} is outside 0..{rv.world_size - 1}")
    if not 1 <= rv.master_port <= 65535:
        raise ValueError(f"MASTER_PORT {rv.master_port} is not a TCP port")
    return rv


def expected_sum(world_size: int) -> float:
    """Each rank contributes rank + 1."""
    return world_size * (world_size + 1) / 2


# ---------------------------------------------------------------------------------------------
# Bandwidth, as nccl-tests reports it (NVIDIA/nccl-tests doc/PERFORMANCE.md, "AllReduce")
# ---------------------------------------------------------------------------------------------


def bus_factor(world_size: int) -> float:
    """All-reduce's correction from algorithm to bus bandwidth: 2(n-1)/n (n ranks)."""
    return 2 * (world_size - 1) / world_size


def bandwidth(nbytes: int, seconds: float, world_size: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s of one all-reduce of ``nbytes`` that took ``seconds``:
    algbw = S/t, busbw = algbw x 2(n-1)/n."""
    algbw = nbytes / GB / seconds
    return algbw, algbw * bus_factor(world_size)


@dataclass(frozen=True)
class Timing:
    """What the collectives gave: the checked sum, and one all-reduce's time (the ranks' mean)."""

    value: float
    seconds: float
    nbytes: int
    warmup: int
    iters: int


def _mib(nbytes: int) -> str:
    return f"{nbytes / 2**20:g} MiB"


def floor_message(report: Mapping[str, Any], floor: float, env: Mapping[str, str]) -> str:
    """Why a busbw below ``floor`` fails: the figure, the transport, and what to check."""
    iface = env.get("SPARKRIG_FABRIC_INTERFACE") or env.get("NCCL_SOCKET_IFNAME") or "<fabric if>"
    hca = env.get("NCCL_IB_HCA") or "(NCCL_IB_HCA unset)"
    devs = ", ".join(report.get("ib_devices") or []) or "none logged"
    return (
        f"all-reduce bus bandwidth {report['busbw_gbs']:.2f} GB/s (algbw "
        f"{report['algbw_gbs']:.2f} GB/s, {_mib(report['bytes'])} x {report['iters']}, "
        f"{report['world_size']} ranks) is below the floor {floor:g} GB/s "
        f"(fabric_busbw_min_gbs), transport {figure_transport(report)} (IB devices: {devs}). "
        f"Check the fabric MTU on every rank (ip link show {iface}: mtu 9000; a fabric left at "
        f"MTU 1500 measures about 1.5 GB/s), the link speed (ethtool {iface}: Speed "
        f"200000Mb/s), and the HCA list (NCCL_IB_HCA={hca}: each listed device's port ACTIVE "
        "in ibv_devinfo, at its full PCIe width in lspci -vv)."
    )


def figure_transport(report: Mapping[str, Any]) -> str:
    t = report.get("transport")
    if t in ("IB", "Socket"):
        layer = report.get("link_layer")
        return f"NET/{t}" + (f" ({layer})" if t == "IB" and layer else "")
    return str(report.get("backend", "?")) if t is None else str(t)


@dataclass(frozen=True)
class SmokeResult:
    """One rank's line of the smoke test, typed: what the control side keeps with the release."""

    ok: bool
    rank: int | None
    transport: str | None
    busbw_gbs: float | None
    algbw_gbs: float | None
    bytes: int | None
    iters: int | None
    error: str = ""

    @classmethod
    def from_line(cls, line: str) -> SmokeResult | None:
        """The result of one output line; None when the line is not a smoke-test report."""
        try:
            raw = json.loads(line)
        except ValueError:
            return None
        if not isinstance(raw, dict) or not isinstance(raw.get("ok"), bool):
            return None

        def num(key: str, kind: Any) -> Any:
            v = raw.get(key)
            return kind(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None

        return cls(
            ok=raw["ok"],
            rank=num("rank", int),
            transport=raw.get("transport") if isinstance(raw.get("transport"), str) else None,
            busbw_gbs=num("busbw_gbs", float),
            algbw_gbs=num("algbw_gbs", float),
            bytes=num("bytes", int),
            iters=num("iters", int),
            error=str(raw.get("error") or ""),
        )

    def figure(self) -> dict[str, Any] | None:
        """What the release record keeps: the figure and how it was measured (None: no figure)."""
        if self.busbw_gbs is None:
            return None
        return {"busbw_gbs": self.busbw_gbs, "algbw_gbs": self.algbw_gbs, "bytes": self.bytes,
                "iters": self.iters, "transport": self.transport}  # fmt: skip


def parse_result(lines: Iterable[str]) -> SmokeResult | None:
    """The last smoke-test report among ``lines`` (a rank's output); None when there is none."""
    found = None
    for line in lines:
        if line.lstrip().startswith("{"):
            found = SmokeResult.from_line(line.strip()) or found
    return found


def nccl_debug_env(env: Mapping[str, str], log_dir: str) -> dict[str, str]:
    """Variables to set so NCCL logs its transport choice to a file we can read."""
    out: dict[str, str] = {}
    if env.get("NCCL_DEBUG", "").upper() not in ("INFO", "TRACE"):
        out["NCCL_DEBUG"] = "INFO"
    if not env.get("NCCL_DEBUG_SUBSYS"):
        out["NCCL_DEBUG_SUBSYS"] = "INIT,NET,GRAPH"
    if not env.get("NCCL_DEBUG_FILE"):
        out["NCCL_DEBUG_FILE"] = os.path.join(log_dir, "nccl.%h.%p.log")
    return out


def run_collectives(
    rv: Rendezvous, backend: str, timeout_s: float, nbytes: int, warmup: int, iters: int
) -> Timing:
    """init_process_group from the environment; one all_reduce whose sum is checked, then
    ``warmup`` and ``iters`` timed all_reduces of ``nbytes`` (float32, in place)."""
    import torch
    import torch.distributed as dist

    device = "cpu"
    if backend == "nccl":
        torch.cuda.set_device(rv.local_rank)
        device = "cuda"

    def sync() -> None:
        if backend == "nccl":
            torch.cuda.synchronize()

    def barrier() -> None:  # NCCL's on this rank's GPU, not one guessed from the rank
        if backend == "nccl":
            dist.barrier(device_ids=[rv.local_rank])
        else:
            dist.barrier()

    dist.init_process_group(
        backend=backend,
        init_method=f"tcp://{rv.master_addr}:{rv.master_port}",
        rank=rv.rank,
        world_size=rv.world_size,
        timeout=datetime.timedelta(seconds=timeout_s),
    )
    try:
        t = torch.full((1024,), float(rv.rank + 1), device=device)
        dist.all_reduce(t)
        sync()
        value = float(t[0].item())
        if not bool((t == t[0]).all()):
            value = float("nan")
        count = max(1, nbytes // 4)
        buf = torch.zeros(count, dtype=torch.float32, device=device)
        for _ in range(warmup):
            dist.all_reduce(buf)
        sync()
        barrier()
        start = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(buf)
        sync()
        mine = (time.perf_counter() - start) / iters
        # nccl-tests averages the per-iteration time over the ranks (src/common.cu, BenchTime)
        mean = torch.tensor([mine], dtype=torch.float64, device=device)
        dist.all_reduce(mean)
        sync()
        seconds = float(mean.item()) / rv.world_size
        barrier()
        return Timing(value, seconds, count * 4, warmup, iters)
    finally:
        dist.destroy_process_group()


def _read_logs(pattern_path: str) -> list[str]:
    d = os.path.dirname(pattern_path) or "."
    prefix = os.path.basename(pattern_path).split("%", 1)[0]
    lines: list[str] = []
    try:
        names = sorted(os.listdir(d))
    except OSError:
        return lines
    for name in names:
        if name.startswith(prefix):
            with open(os.path.join(d, name), errors="replace") as fh:
                lines += fh.read().splitlines()
    return lines


def run(args: argparse.Namespace, env: Mapping[str, str]) -> tuple[int, dict[str, Any]]:
    report: dict[str, Any] = {"ok": False, "backend": args.backend}
    try:
        rv = rendezvous_from_env(env)
    except ValueError as exc:
        report["error"] = str(exc)
        return EXIT_ENV, report
    report.update(
        rank=rv.rank, world_size=rv.world_size, master=f"{rv.master_addr}:{rv.master_port}"
    )
    log_dir = tempfile.mkdtemp(prefix="nccl_smoke.")
    if args.backend == "nccl":
        extra = nccl_debug_env(env, log_dir)
        os.environ.update(extra)
        report["nccl_env"] = {k: v for k, v in env.items() if k.startswith("NCCL_")}
    try:
        import torch  # noqa: F401
    except ImportError as exc:
        report["error"] = f"torch is not importable here ({exc}); run inside the serving image"
        return EXIT_NO_TORCH, report
    t0 = time.monotonic()
    try:
        timing = run_collectives(rv, args.backend, args.timeout, args.bytes, args.warmup,
                                 args.iters)  # fmt: skip
    except Exception as exc:  # noqa: BLE001 - report any failure as one line
        report["error"] = f"all_reduce failed: {type(exc).__name__}: {exc}"[:1000]
        if args.backend == "nccl":
            info = parse_nccl_log(_read_logs(os.environ.get("NCCL_DEBUG_FILE", "")))
            if info.net_init_failed or _NET_INIT_FAILED.search(str(exc)):
                report.update(transport=None, error=no_net_message(info, env),
                              cause=report["error"])  # fmt: skip
                return EXIT_TRANSPORT, report
        return EXIT_FAIL, report
    report["seconds"] = round(time.monotonic() - t0, 3)
    report["sum"] = timing.value
    want = expected_sum(rv.world_size)
    if timing.value != want:
        report["error"] = f"all_reduce sum {timing.value} != expected {want}"
        return EXIT_FAIL, report
    algbw, busbw = bandwidth(timing.nbytes, timing.seconds, rv.world_size)
    report.update(busbw_gbs=round(busbw, 3), algbw_gbs=round(algbw, 3), bytes=timing.nbytes,
                  warmup=timing.warmup, iters=timing.iters,
                  time_us=round(timing.seconds * 1e6, 1), min_busbw_gbs=args.min_busbw_gbs,
                  transport=None)  # fmt: skip
    if rv.world_size == 1:  # nothing crosses the fabric; accept and say so
        report.update(ok=True, detail="world_size 1: no inter-node transport to check")
        return EXIT_OK, report
    detail = f"{args.backend}: sum {timing.value} ok"
    if args.backend == "nccl":
        info = parse_nccl_log(_read_logs(os.environ.get("NCCL_DEBUG_FILE", "")))
        ok, detail = verdict(info)
        report.update(transport=info.transport, link_layer=info.link_layer, paths=info.paths,
                      ib_devices=info.ib_devices)  # fmt: skip
        if not ok and not args.allow_socket:
            report.update(detail=detail, error=f"{detail} (measured busbw {busbw:.2f} GB/s)")
            return EXIT_TRANSPORT, report
        unused = unused_hcas(info, env)
        if ok and unused:
            report["error"] = (
                f"{detail}, but not {', '.join(unused)}, which NCCL_IB_HCA names (every "
                "function facing a peer, fabric_layout 'ports'): check that device's port is "
                f"ACTIVE (ibv_devinfo) and its address's RoCE v2 GID (measured busbw {busbw:.2f} "
                "GB/s)"
            )
            return EXIT_TRANSPORT, report
    report["detail"] = f"{detail}; busbw {busbw:.2f} GB/s"
    if busbw < args.min_busbw_gbs:
        report["error"] = floor_message(report, args.min_busbw_gbs, env)
        return EXIT_SLOW, report
    report["ok"] = True
    return EXIT_OK, report


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def spawn(world: int, argv: Sequence[str]) -> int:
    """Run ``world`` ranks of this job on this machine (MASTER_ADDR 127.0.0.1, a free port,
    LOCAL_RANK = RANK), the highest rank first as the deploy does; print each rank's output in
    rank order; exit with the lowest rank's failure, else 0."""
    package = os.path.dirname(os.path.abspath(__file__))
    port = str(_free_port())
    procs = {}
    for rank in reversed(range(world)):
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "RANK": str(rank),
               "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank)}  # fmt: skip
        procs[rank] = subprocess.Popen(
            [sys.executable, package, "nccl-smoke", *argv], env=env, text=True,
            stdout=subprocess.PIPE,
        )  # fmt: skip
    codes = []
    for rank in range(world):
        out, _ = procs[rank].communicate()
        sys.stdout.write(out)
        codes.append(procs[rank].returncode)
    sys.stdout.flush()
    return next((c for c in codes if c != EXIT_OK), EXIT_OK)


def without_spawn(argv: Sequence[str]) -> list[str]:
    """A rank's argv: the launcher's, less ``--spawn N`` (or ``--spawn=N``)."""
    out, skip = [], False
    for a in argv:
        if skip or a.startswith("--spawn="):
            skip = False
        elif a == "--spawn":
            skip = True
        else:
            out.append(a)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["parse"]:
        if len(argv) != 2:
            print("usage: sparkhost nccl-smoke parse LOGFILE", file=sys.stderr)
            return EXIT_ENV
        with open(argv[1], errors="replace") as fh:
            info = parse_nccl_log(fh)
        ok, msg = verdict(info)
        print(json.dumps({"ok": ok, "transport": info.transport, "detail": msg, **asdict(info)}))
        return EXIT_OK if ok else EXIT_TRANSPORT
    ap = argparse.ArgumentParser(
        prog="sparkhost nccl-smoke",
        description="all-reduce across ranks: sum check, transport, bus bandwidth floor",
    )
    ap.add_argument("--backend", choices=("nccl", "gloo"), default="nccl")
    ap.add_argument("--timeout", type=float, default=300.0, help="rendezvous/collective seconds")
    ap.add_argument("--allow-socket", "--any-transport", dest="allow_socket",
                    action="store_true",
                    help="report, but pass, a transport other than NET/IB")  # fmt: skip
    ap.add_argument("--bytes", type=int, default=256 * 2**20, help="all-reduce size (float32)")
    ap.add_argument("--warmup", type=int, default=5, help="untimed all-reduces first")
    ap.add_argument("--iters", type=int, default=20, help="timed all-reduces")
    ap.add_argument("--min-busbw-gbs", type=float, default=0.0,
                    help="fail below this bus bandwidth (GB/s); 0: no floor")  # fmt: skip
    ap.add_argument("--spawn", type=int, default=0, metavar="N",
                    help="run N ranks here (127.0.0.1, a free port, one GPU each)")  # fmt: skip
    args = ap.parse_args(argv)
    if args.bytes < 4 or args.warmup < 0 or args.iters < 1 or args.min_busbw_gbs < 0:
        ap.error("--bytes >= 4, --warmup >= 0, --iters >= 1 and --min-busbw-gbs >= 0")
    if args.spawn:
        if args.spawn < 1:
            ap.error("--spawn N needs N >= 1")
        return spawn(args.spawn, without_spawn(argv))
    code, report = run(args, os.environ)
    if code != EXIT_OK:
        report.setdefault("error", "failed")
        print(f"nccl_smoke: rank {report.get('rank', '?')}: {report['error']}", file=sys.stderr)
    print(json.dumps(report, sort_keys=True), flush=True)
    return code
