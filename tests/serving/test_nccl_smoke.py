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


SMALL = ("--bytes", str(2**20), "--warmup", "2", "--iters", "4")  # quick; the real loop


def test_gloo_all_reduce_two_ranks() -> None:
    """Two ranks of the real job on loopback (gloo): the sum, then the timed loop; each rank's
    line carries the same figure, and that figure is nccl-tests' arithmetic on its own time."""
    pytest.importorskip("torch")
    procs = _launch(2, _free_port(), "--backend", "gloo", "--timeout", "60", *SMALL)
    reports = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        reports.append(json.loads(out.strip().splitlines()[-1]))
    assert sorted(r["rank"] for r in reports) == [0, 1]
    assert all(r["ok"] and r["sum"] == 3.0 for r in reports)
    for r in reports:
        assert (r["bytes"], r["warmup"], r["iters"]) == (2**20, 2, 4)
        assert r["time_us"] == reports[0]["time_us"] > 0  # the ranks' mean, as nccl-tests
        algbw = r["bytes"] / 1e9 / (r["time_us"] / 1e6)
        assert r["algbw_gbs"] == pytest.approx(algbw, rel=1e-3, abs=1e-3)  # both rounded
        assert r["busbw_gbs"] == r["algbw_gbs"]  # 2(n-1)/n = 1 for two ranks
        result = ns.parse_result(["some log line", json.dumps(r)])
        assert result is not None and result.ok and result.rank == r["rank"]
        assert result.figure() == {"busbw_gbs": r["busbw_gbs"], "algbw_gbs": r["algbw_gbs"],
                                   "bytes": 2**20, "iters": 4, "transport": None}  # fmt: skip


def test_gloo_busbw_below_the_floor_fails_both_ranks_naming_the_figure() -> None:
    """The floor verdict on a real measurement, launched by the job's own --spawn."""
    pytest.importorskip("torch")
    res = subprocess.run([sys.executable, *SCRIPT, "--spawn", "2", "--backend", "gloo",
                          "--timeout", "60", *SMALL, "--min-busbw-gbs", "100000"],
                         capture_output=True, text=True, timeout=180,
                         env={**os.environ, "GLOO_SOCKET_IFNAME": "lo"})  # fmt: skip
    assert res.returncode == ns.EXIT_SLOW, res.stderr
    lines = res.stdout.strip().splitlines()
    reports = [json.loads(x) for x in lines]
    assert [r["rank"] for r in reports] == [0, 1]
    for r in reports:
        assert r["ok"] is False and r["busbw_gbs"] > 0
        assert f"all-reduce bus bandwidth {r['busbw_gbs']:.2f} GB/s" in r["error"]
        assert "below the floor 100000 GB/s (fabric_busbw_min_gbs)" in r["error"]
        assert "transport gloo" in r["error"]
        assert "ethtool" in r["error"] and "mtu 9000" in r["error"]
        assert "NCCL_IB_HCA" in r["error"]
    assert res.stderr.count("below the floor") == 2


# --- the arithmetic against nccl-tests' own formula and its own printed rows -----------------


@pytest.mark.parametrize(
    ("nbytes", "seconds", "ranks", "algbw", "busbw"),
    [
        # by hand: 256 MiB in 22.4 ms over 2 ranks; 268435456 / 1e9 / 0.0224 = 11.98373 GB/s,
        # x 2(2-1)/2 = 1
        (268435456, 0.0224, 2, 11.98373, 11.98373),
        # by hand: 1 GiB in 100 ms over 8 ranks: 10.73742 GB/s, x 2*7/8 = 1.75 -> 18.79048
        (1073741824, 0.1, 8, 10.73742, 18.79048),
        # nccl-tests all_reduce_perf rows as printed (2 decimals): 16 ranks (2 x p3dn.24xlarge,
        # gist jacobkahn/a92f4425) "32768 ... 184.8 us 0.18 0.33"; 24 ranks (NVIDIA/nccl-tests
        # #119) "127926280 ... 2560.7 us 49.96 95.75"
        (32768, 184.8e-6, 16, 0.18, 0.33),
        (127926280, 2560.7e-6, 24, 49.96, 95.75),
    ],
)
def test_busbw_is_nccl_tests_formula(nbytes, seconds, ranks, algbw, busbw) -> None:
    got_alg, got_bus = ns.bandwidth(nbytes, seconds, ranks)
    places = 2 if algbw == round(algbw, 2) else 5
    assert (round(got_alg, places), round(got_bus, places)) == (algbw, busbw)


# --- the verdicts: NET/IB AND busbw >= floor ------------------------------------------------


def smoke_args(**over: object) -> ns.argparse.Namespace:
    base = {"backend": "nccl", "timeout": 5.0, "allow_socket": False, "bytes": 2**28,
            "warmup": 5, "iters": 20, "min_busbw_gbs": 8.0}  # fmt: skip
    return ns.argparse.Namespace(**{**base, **over})


def judged(
    monkeypatch: pytest.MonkeyPatch,
    log: Path,
    seconds: float,
    env_over: dict[str, str] | None = None,
    **over: object,
):
    """``run`` on the real verdict path: the collectives replaced by a measured time (256 MiB
    each), NCCL's log where NCCL_DEBUG_FILE points."""

    def timed(*_: object) -> ns.Timing:
        return ns.Timing(3.0, seconds, 2**28, 5, 20)

    monkeypatch.setattr(ns, "run_collectives", timed)
    pytest.importorskip("torch")
    env = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29883",
           "NCCL_IB_HCA": "rocep1s0f1", "SPARKRIG_FABRIC_INTERFACE": "enp1s0f1np1",
           "NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET",
           "NCCL_DEBUG_FILE": str(log), **(env_over or {})}  # fmt: skip
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return ns.run(smoke_args(**over), dict(os.environ))


def test_net_ib_at_the_plateau_passes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "nccl.log").write_text(IB_LOG)
    code, report = judged(monkeypatch, tmp_path / "nccl.log", 2**28 / 12.1e9)  # 12.1 GB/s
    assert code == ns.EXIT_OK and report["ok"] and report["transport"] == "IB"
    assert report["busbw_gbs"] == 12.1 and "busbw 12.10 GB/s" in report["detail"]


def test_net_ib_below_the_floor_fails_naming_figure_transport_and_checks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An MTU-1500 fabric: NET/IB, 1.5 GB/s (himorishige's June baseline)."""
    (tmp_path / "nccl.log").write_text(IB_LOG)
    code, report = judged(monkeypatch, tmp_path / "nccl.log", 2**28 / 1.5e9)
    assert code == ns.EXIT_SLOW and report["ok"] is False
    err = report["error"]
    assert "all-reduce bus bandwidth 1.50 GB/s" in err and "below the floor 8 GB/s" in err
    assert "transport NET/IB (RoCE)" in err and "rocep1s0f1:1/RoCE" in err
    assert "ip link show enp1s0f1np1: mtu 9000" in err and "ethtool enp1s0f1np1" in err
    assert "NCCL_IB_HCA=rocep1s0f1" in err


@pytest.mark.parametrize("case", ["default", "forced_net"])
def test_a_real_socket_fallback_fails_on_transport_with_the_figure(
    case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NCCL 2.28.9's real logs of a socket fallback: the transport verdict decides (exit 3),
    however fast the figure, and the message carries the figure."""
    logs = REAL / case / "nccl.%h.%p.log"
    code, report = judged(monkeypatch, logs, 2**28 / 20.0e9)
    assert code == ns.EXIT_TRANSPORT and report["transport"] == "Socket"
    assert "fell back to NET/Socket" in report["error"]
    assert "measured busbw 20.00 GB/s" in report["error"]
    code, report = judged(monkeypatch, logs, 2**28 / 20.0e9, allow_socket=True)
    assert code == ns.EXIT_OK and report["busbw_gbs"] == 20.0


def test_result_lines_that_are_not_reports_are_skipped() -> None:
    assert ns.parse_result(["", "nccl_smoke: rank 1: failed", '{"gate": "x"}', "[1]"]) is None
    r = ns.SmokeResult.from_line('{"ok": false, "rank": 1, "error": "e", "busbw_gbs": true}')
    assert r is not None and r.busbw_gbs is None and r.figure() is None and r.error == "e"


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

    monkeypatch.setattr(ns, "run_collectives", fail)
    pytest.importorskip("torch")
    env = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29883",
           "NCCL_NET": "IB", "NCCL_IB_HCA": "rocep1s0f1",
           "NCCL_DEBUG_FILE": str(REAL / "net_ib_env" / "nccl.%h.%p.log")}  # fmt: skip
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    code, report = ns.run(smoke_args(), dict(os.environ))
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


def test_ports_layout_fails_when_nccl_left_a_named_function_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """fabric_layout "ports" (docs/rings.md): NCCL_IB_HCA names both functions of the pair's
    cable; NCCL logging only one of them is a transport failure naming the other."""
    (tmp_path / "nccl.log").write_text(IB_LOG)  # NCCL used rocep1s0f1 alone
    ports = {"SPARKRIG_FABRIC_LAYOUT": "ports", "NCCL_IB_HCA": "=rocep1s0f1:1,roceP2p1s0f1:1"}
    code, report = judged(monkeypatch, tmp_path / "nccl.log", 2**28 / 21.0e9, ports)
    assert code == ns.EXIT_TRANSPORT and report["ok"] is False
    assert "but not roceP2p1s0f1, which NCCL_IB_HCA names" in report["error"]
    both = IB_LOG.replace("[0]rocep1s0f1:1/RoCE", "[0]rocep1s0f1:1/RoCE [1]roceP2p1s0f1:1/RoCE")
    (tmp_path / "nccl.log").write_text(both)
    code, report = judged(monkeypatch, tmp_path / "nccl.log", 2**28 / 21.0e9, ports)
    assert code == ns.EXIT_OK, report
