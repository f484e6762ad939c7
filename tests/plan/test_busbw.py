"""The fabric bandwidth floor through the real CLI against strict @fake hosts: a smoke test on
NET/IB below ``fabric_busbw_min_gbs`` stops the run before the pair starts, naming the figure;
a passing one's figure is kept with the release on each rank and shown by status.py.

The smoke test's lines are the job's own (files/sparkhost/nccl_smoke.py builds the message)."""

from __future__ import annotations

import json

from sparkhost import nccl_smoke as ns

from sparkrig.release import parse_record, record_path
from tests.plan import fakehosts
from tests.plan.test_plan import HEAD, WORKER, apply, converge_state, settings
from tests.plan.test_status import rank_lines, status

SMOKE = {"spark-a": (0, fakehosts.SMOKE_HEAD), "spark-b": (1, fakehosts.SMOKE_CHECK)}
ENV = {"NCCL_IB_HCA": fakehosts.HCA, "SPARKRIG_FABRIC_INTERFACE": "enp1s0f1np1"}


def smoke_report(rank: int, busbw: float) -> dict[str, object]:
    """A rank's line as the job prints it after an all-reduce over NET/IB (RoCE)."""
    return {"ok": True, "rank": rank, "world_size": 2, "backend": "nccl", "sum": 3.0,
            "transport": "IB", "link_layer": "RoCE", "ib_devices": [f"{fakehosts.HCA}:1/RoCE"],
            "busbw_gbs": busbw, "algbw_gbs": busbw, "bytes": 268435456, "warmup": 5,
            "iters": 20, "min_busbw_gbs": 8.0}  # fmt: skip


def test_net_ib_below_the_floor_stops_the_run_before_the_pair_starts(monkeypatch):
    """An MTU-1500 fabric: NCCL used NET/IB and measured 1.5 GB/s (himorishige's figure)."""
    for short, (rank, matcher) in SMOKE.items():
        report = smoke_report(rank, 1.5)
        report.update(ok=False, error=ns.floor_message(report, 8.0, ENV))
        fakehosts.inject(short, {matcher: {"success": False, "stdout": json.dumps(report),
                                           "stderr": f"nccl_smoke: rank {rank}: "
                                                     f"{report['error']}"}})  # fmt: skip
    r = apply(monkeypatch)
    assert r.exit_code != 0
    said = "all-reduce bus bandwidth 1.50 GB/s (algbw 1.50 GB/s, 256 MiB x 20, 2 ranks) is below "
    assert f"nccl_smoke: rank 0: {said}the floor 8 GB/s (fabric_busbw_min_gbs)" in r.output
    assert "transport NET/IB (RoCE)" in r.output and "rocep1s0f1:1/RoCE" in r.output
    assert "ip link show enp1s0f1np1: mtu 9000" in r.output and "ethtool enp1s0f1np1" in r.output
    assert "NCCL_IB_HCA=rocep1s0f1" in r.output
    # the floor reached the job from the knob, and nothing of the pair started
    assert any("--min-busbw-gbs 8" in c for c in r.commands[HEAD] if fakehosts.SMOKE_HEAD.match(c))
    assert fakehosts.start_of("sparkrig-worker") not in r.commands[WORKER]
    assert fakehosts.start_of("sparkrig-head") not in r.commands[HEAD]
    assert not any(fakehosts.BOOT_WAIT.match(c) for c in r.commands[HEAD])


def test_the_floor_knob_reaches_the_job_on_every_rank(monkeypatch):
    r = apply(monkeypatch, "--data", "fabric_busbw_min_gbs=16", "--data", "nccl_smoke_iters=7")
    assert r.exit_code == 0, r.output
    for name, matcher in ((HEAD, fakehosts.SMOKE_HEAD), (WORKER, fakehosts.SMOKE_WORKER)):
        runs = [c for c in r.commands[name] if matcher.match(c)]
        assert len(runs) == 1 and runs[0].endswith(
            " nccl-smoke --timeout 300 --bytes 268435456 --warmup 5 --iters 7 --min-busbw-gbs 16"
        ), runs


def test_each_rank_keeps_its_measured_figure_with_the_release(monkeypatch):
    for short, (rank, matcher) in SMOKE.items():
        lines = ["some NCCL chatter", json.dumps(smoke_report(rank, 12.1 - rank / 10))]
        fakehosts.inject(short, {matcher: lines})
    r = apply(monkeypatch)
    assert r.exit_code == 0, r.output
    for name, busbw in ((HEAD, 12.1), (WORKER, 12.0)):
        s = settings()[name]
        record = parse_record(r.uploads[name][record_path(s.knobs.config_dir)].decode())
        assert dict(record[0].fabric) == {"busbw_gbs": busbw, "algbw_gbs": busbw, "iters": 20,
                                          "bytes": 268435456, "transport": "IB"}  # fmt: skip


def test_status_shows_the_serving_releases_figure(monkeypatch):
    converge_state()  # its release record holds no figure: the line says so
    r = status(monkeypatch)
    assert r.exit_code == 0, r.output
    assert "| busbw - |" in r.output
    text = json.dumps({"version": 1, "releases": [{
        "image": "i", "base": "b", "model_revision": "m", "drafter_revision": "", "profile": "p",
        "files": {}, "fabric": {"busbw_gbs": 12.1, "algbw_gbs": 12.1, "bytes": 268435456,
                                "iters": 20, "transport": "IB"}}]}, indent=1)  # fmt: skip
    rank_lines("spark-a", release_record=text.replace("\n", ""))
    r = status(monkeypatch)
    assert r.exit_code == 0, r.output
    assert "| busbw 12.1 GB/s (NET/IB, 256 MiB x 20) | nccl " in r.output


def test_a_run_that_measures_nothing_keeps_the_recorded_figure(monkeypatch):
    """A converged pair restarts nothing, so no smoke test runs: its record, figure included,
    stays as it is (nothing uploaded)."""
    converge_state()
    figure = tuple(sorted({"busbw_gbs": 12.1, "transport": "IB"}.items()))
    for name in settings():
        fakehosts.serving_recorded(name.split("/")[1], fabric=figure)
    r = apply(monkeypatch)
    assert r.exit_code == 0, r.output
    assert r.uploads == {}, r.uploads
