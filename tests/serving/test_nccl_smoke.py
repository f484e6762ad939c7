"""The nccl-smoke job (files/sparkhost/nccl_smoke.py): transport parsing (pure) and the
all-reduce over gloo on CPU (needs torch)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from sparkhost import nccl_smoke as ns

from sparkrig.hostpkg import SOURCE

SCRIPT = [str(SOURCE), "nccl-smoke"]

IB_LOG = """\
spark1:123:123 [0] NCCL INFO Bootstrap : Using enp1s0f1np1:192.168.100.10<0>
s1:1:1 [0] NCCL INFO NET/IB : Using [0]rocep1s0f1:1/RoCE [RO]; OOB enp1s0f1np1:192.168.100.10<0>
spark1:123:123 [0] NCCL INFO Using network IB
spark1:123:200 [0] NCCL INFO Channel 00/0 : 1[0] -> 0[0] [receive] via NET/IB/0/GDRDMA
spark1:123:200 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0/GDRDMA
"""
SOCKET_LOG = """\
spark1:123:123 [0] NCCL INFO NET/IB : No device found.
spark1:123:123 [0] NCCL INFO NET/Socket : Using [0]enp1s0f1np1:192.168.100.10<0>
spark1:123:123 [0] NCCL INFO Using network Socket
spark1:123:200 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/Socket/0
"""


def test_parse_ib_roce() -> None:
    info = ns.parse_nccl_log(IB_LOG.splitlines())
    assert info.network == "IB" and info.transport == "IB" and info.link_layer == "RoCE"
    assert info.ib_devices == ["rocep1s0f1:1/RoCE"]
    assert info.paths == ["NET/IB"]
    ok, msg = ns.verdict(info)
    assert ok and "RoCE" in msg


def test_parse_socket_fallback() -> None:
    info = ns.parse_nccl_log(SOCKET_LOG.splitlines())
    assert info.transport == "Socket" and info.ib_unavailable
    ok, msg = ns.verdict(info)
    assert not ok and "NET/Socket" in msg and "/dev/infiniband" in msg


def test_mixed_paths_count_as_socket() -> None:
    info = ns.parse_nccl_log((IB_LOG + SOCKET_LOG.splitlines()[-1]).splitlines())
    assert info.transport == "Socket"


def test_unknown_transport() -> None:
    ok, msg = ns.verdict(ns.parse_nccl_log(["hello"]))
    assert not ok and "could not tell" in msg
    info = ns.parse_nccl_log(["NCCL INFO Channel 00 : 0[0] -> 1[0] via P2P/CUMEM"])
    assert info.transport is None and not ns.verdict(info)[0]


def test_only_network_line() -> None:
    assert ns.parse_nccl_log(["x NCCL INFO Using network IB"]).transport == "IB"


@pytest.mark.parametrize(
    ("env", "err"),
    [
        ({}, "MASTER_ADDR"),
        ({"MASTER_ADDR": "a", "MASTER_PORT": "1", "RANK": "0"}, "WORLD_SIZE"),
        ({"MASTER_ADDR": "a", "MASTER_PORT": "x", "RANK": "0", "WORLD_SIZE": "2"}, "integers"),
        ({"MASTER_ADDR": "a", "MASTER_PORT": "1", "RANK": "2", "WORLD_SIZE": "2"}, "outside"),
        ({"MASTER_ADDR": "a", "MASTER_PORT": "0", "RANK": "0", "WORLD_SIZE": "2"}, "TCP port"),
    ],
)
def test_rendezvous_env_errors(env: dict[str, str], err: str) -> None:
    with pytest.raises(ValueError, match=err):
        ns.rendezvous_from_env(env)


def test_rendezvous_accepts_world() -> None:
    rv = ns.rendezvous_from_env(
        {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29521", "RANK": "1", "WORLD": "2"}
    )
    assert (rv.rank, rv.world_size, rv.master_port) == (1, 2, 29521)
    assert ns.expected_sum(2) == 3


def test_debug_env_respects_operator_settings(tmp_path: Path) -> None:
    env = ns.nccl_debug_env({}, str(tmp_path))
    assert env["NCCL_DEBUG"] == "INFO" and env["NCCL_DEBUG_FILE"].startswith(str(tmp_path))
    assert (
        ns.nccl_debug_env(
            {"NCCL_DEBUG": "info", "NCCL_DEBUG_FILE": "/x", "NCCL_DEBUG_SUBSYS": "ALL"}, "/t"
        )
        == {}
    )


def test_parse_subcommand(tmp_path: Path) -> None:
    for text, code in ((IB_LOG, 0), (SOCKET_LOG, 3)):
        f = tmp_path / "nccl.log"
        f.write_text(text)
        res = subprocess.run(
            [sys.executable, *SCRIPT, "parse", str(f)], capture_output=True, text=True
        )
        assert res.returncode == code, res.stderr
        assert json.loads(res.stdout)["ok"] is (code == 0)


def test_missing_env_exits_2() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "MASTER_ADDR")}
    res = subprocess.run([sys.executable, *SCRIPT, "--backend", "gloo"], capture_output=True,
                         text=True, env=env)  # fmt: skip
    assert res.returncode == 2 and "missing environment" in res.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _launch(world: int, port: int, *extra: str) -> list[subprocess.Popen[str]]:
    procs = []
    for rank in reversed(range(world)):  # worker(s) first, like the deploy
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
               "RANK": str(rank), "WORLD_SIZE": str(world), "GLOO_SOCKET_IFNAME": "lo"}  # fmt: skip
        procs.append(subprocess.Popen([sys.executable, *SCRIPT, *extra], env=env, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE))  # fmt: skip
    return procs


def test_gloo_all_reduce_two_ranks() -> None:
    pytest.importorskip("torch")
    procs = _launch(2, _free_port(), "--backend", "gloo", "--timeout", "60")
    reports = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        reports.append(json.loads(out.strip().splitlines()[-1]))
    assert sorted(r["rank"] for r in reports) == [0, 1]
    assert all(r["ok"] and r["sum"] == 3.0 for r in reports)


def test_gloo_lonely_worker_times_out() -> None:
    pytest.importorskip("torch")
    port = _free_port()
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": "1",
           "WORLD_SIZE": "2"}  # fmt: skip
    res = subprocess.run([sys.executable, *SCRIPT, "--backend", "gloo", "--timeout", "3"],
                         env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert res.returncode == 1
    assert "all_reduce failed" in json.loads(res.stdout.strip().splitlines()[-1])["error"]


# --- real NCCL 2.28.9 logs: two ranks, no IB/RoCE device (tests/serving/data/.../README.md) -------
REAL = Path(__file__).parent / "data" / "nccl-2.28.9-no-ib"


def real_logs(case: str) -> list[list[str]]:
    logs = sorted((REAL / case).glob("nccl.*.log"))
    assert len(logs) == 2, logs  # one per rank
    return [p.read_text().splitlines() for p in logs]


@pytest.mark.parametrize("case", ["default", "forced_net", "allow_socket"])
def test_real_logs_socket_fallback(case: str) -> None:
    for lines in real_logs(case):
        info = ns.parse_nccl_log(lines)
        assert info.transport == "Socket" and not info.net_init_failed
        assert info.socket_devices and "eth0" in info.socket_devices
        assert any("No device found" in u for u in info.ib_unavailable)
        ok, msg = ns.verdict(info)
        assert not ok and "fell back to NET/Socket" in msg and "No device found" in msg


def test_real_logs_net_ib_without_device_fails_init() -> None:
    for lines in real_logs("net_ib_env"):
        info = ns.parse_nccl_log(lines)
        assert info.net_init_failed and info.transport is None
        ok, msg = ns.verdict(info)
        assert not ok
        assert "Failed to initialize any NET plugin" in msg and "/dev/infiniband" in msg
        assert "does not fall back to sockets" in msg


def test_run_names_the_missing_device_on_net_plugin_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The smoke test itself, with the real failure: the all_reduce raises what torch raised on
    the real run (rank0.json) and NCCL's real logs are where NCCL_DEBUG_FILE points."""
    real = json.loads((REAL / "net_ib_env" / "rank0.json").read_text())
    cause = real["error"].removeprefix("all_reduce failed: DistBackendError: ")

    def fail(*_: object) -> float:
        raise RuntimeError(cause)

    monkeypatch.setattr(ns, "all_reduce_once", fail)
    pytest.importorskip("torch")
    env = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29883",
           "NCCL_NET": "IB", "NCCL_IB_HCA": "rocep1s0f1",
           "NCCL_DEBUG_FILE": str(REAL / "net_ib_env" / "nccl.%h.%p.log")}  # fmt: skip
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    args = ns.argparse.Namespace(backend="nccl", timeout=5.0, allow_socket=False)
    code, report = ns.run(args, dict(os.environ))
    assert code == ns.EXIT_TRANSPORT and report["ok"] is False
    assert "HCA rocep1s0f1" in report["error"] and "/dev/infiniband" in report["error"]
    assert "NET/IB : No device found" in report["error"]  # the real log line, quoted
    assert "invalid usage" in report["cause"]


def test_real_smoke_reports_match_the_readme() -> None:
    """The fixtures are what the README says: a guard against swapping cases by mistake."""
    for case, ok in (("default", False), ("forced_net", False), ("net_ib_env", False),
                     ("allow_socket", True)):  # fmt: skip
        for rank in (0, 1):
            report = json.loads((REAL / case / f"rank{rank}.json").read_text())
            assert report["ok"] is ok and report["rank"] == rank
