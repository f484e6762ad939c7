"""status.py through the real CLI against strict @fake hosts: one read per rank, nothing that
changes a host, non-zero naming what is off, --limit."""

from __future__ import annotations

import json
import time

import pytest

from tests.plan import fakehosts
from tests.plan.harness import Run, run
from tests.plan.test_plan import ACTION, HEAD, INVENTORY, WORKER, converge_state, settings


def status(monkeypatch, *extra: str) -> Run:
    return run(["-y", *extra, INVENTORY, "status.py"], monkeypatch)


def only_reads(r: Run) -> None:
    for name, cmds in r.commands.items():
        if not cmds:
            continue  # outside the run (--limit)
        changing = [c for c in cmds if ACTION.search(c) or c.startswith(("mv ", "rm ", "docker "))]
        assert changing == [], f"{name}: {changing}"
        assert sum(bool(fakehosts.RANK_STATUS.search(c)) for c in cmds) == 1, cmds


def test_a_healthy_pair_prints_one_line_per_rank_and_exits_zero(monkeypatch):
    converge_state()
    r = status(monkeypatch)
    assert r.exit_code == 0, r.output
    only_reads(r)
    assert "rank0 sparkrig-head active/running" in r.output
    assert "rank1 sparkrig-worker active/running" in r.output
    assert "gid env=3 live=3" in r.output and "pair gates: health ok" in r.output
    assert not [c for cmds in r.commands.values() for c in cmds if fakehosts.FAIL_HOST.search(c)]


def test_what_is_off_fails_that_rank_by_name_and_sends_nothing_that_changes_it(monkeypatch):
    converge_state(**{"spark-b": {"mtu": 1500, "gid_index": 5}})
    r = status(monkeypatch)
    assert r.exit_code != 0
    only_reads(r)
    assert "MTU 1500 on enp1s0f1np1, want 9000" in r.output
    assert "GID index: env file 3, live table 5" in r.output
    failed = [c for c in r.commands[WORKER] if fakehosts.FAIL_HOST.search(c)]
    assert len(failed) == 1 and "MTU 1500" in failed[0]
    assert not [c for c in r.commands[HEAD] if fakehosts.FAIL_HOST.search(c)]
    # issue 47: the rank that is off says why, as a failed start does; the one that is not, not
    assert "rank1 why: firewall: nothing dropped on the fabric" in r.output
    assert not any(fakehosts.WHY.search(c) for c in r.commands[HEAD])


def test_limit_worker_reads_the_worker_alone(monkeypatch):
    converge_state()
    r = status(monkeypatch, "--limit", "worker")
    assert r.exit_code == 0, r.output
    assert r.commands.get(HEAD, []) == []
    only_reads(r)
    assert "rank1 sparkrig-worker" in r.output and "rank0" not in r.output


def test_a_bare_rank_is_off(monkeypatch):
    r = status(monkeypatch, "--limit", "worker")
    assert r.exit_code != 0
    assert "sparkrig-worker is inactive/dead" in r.output


def rank_lines(short: str, **extra) -> None:
    """The converged rank's status read, with ``extra`` key=value lines (replacing its own)."""
    name = f"@fake/{short}"
    lines = [x for x in fakehosts.converged(settings()[name])[fakehosts.RANK_STATUS]]
    end = lines.pop()
    keys = {f"{k}=" for k in extra}
    lines = [x for x in lines if not any(x.startswith(k) for k in keys)]
    lines += [f"{k}={v}" for k, v in extra.items()] + [end]
    fakehosts.inject(short, {fakehosts.RANK_STATUS: lines})


def budget(*ages: float, max_restarts: int = 3, window: int = 21600) -> str:
    now = time.time()
    return json.dumps({"restarts": [now - a for a in ages], "max_restarts": max_restarts,
                       "window_s": window})  # fmt: skip


def test_the_head_shows_the_restarts_its_helpers_used_in_their_window(monkeypatch):
    converge_state()
    rank_lines("spark-a", budget_supervisor=budget(100, 30000))  # one in the window, one before
    r = status(monkeypatch, "--data", "watchdog=True")
    assert r.exit_code == 0, r.output
    only_reads(r)
    assert "pair helpers: supervisor restarts 1/3 in 6 h; watchdog restarts unknown" in r.output


def test_a_spent_restart_budget_is_off(monkeypatch):
    converge_state()
    rank_lines("spark-a", budget_supervisor=budget(100, 200, 300))
    r = status(monkeypatch, "--data", "watchdog=False")
    assert r.exit_code != 0
    assert "the supervisor spent its restart budget (3/3 in 6 h)" in r.output
    assert "pair helpers: supervisor restarts 3/3 in 6 h; watchdog off" in r.output


def test_the_head_shows_the_watchdogs_last_probe(monkeypatch):
    """As the watchdog wrote it (sparkhost.wedge.format_probe); none yet before its first."""
    from sparkhost import wedge

    converge_state()
    r = status(monkeypatch)
    assert "; last probe: none yet" in r.output, r.output
    seen = wedge.Probe("progress", None, "running=1 waiting=0; nothing moved for 120 s",
                       at=time.time() - 30)  # fmt: skip
    rank_lines("spark-a", probe=wedge.format_probe(seen))
    r = status(monkeypatch)
    assert r.exit_code == 0, r.output
    only_reads(r)
    assert "last probe: progress watching (running=1 waiting=0; nothing moved for 120 s, 3" in (
        r.output
    )


def test_the_gpu_clock_cap_is_shown_and_a_lock_that_is_not_active_is_off(monkeypatch):
    converge_state()
    r = status(monkeypatch)
    assert "| gpu clock unlocked |" in r.output, r.output
    for short in ("spark-a", "spark-b"):
        rank_lines(short, gpu_clock_unit="active", gpu_sm_mhz="2405")
    r = status(monkeypatch, "--data", "gpu_clock_max_mhz=2400")
    assert r.exit_code == 0, r.output
    only_reads(r)
    assert "| gpu clock <= 2400 MHz (active), sm 2405 MHz |" in r.output
    rank_lines("spark-b", gpu_clock_unit="inactive")
    r = status(monkeypatch, "--data", "gpu_clock_max_mhz=2400")
    assert r.exit_code != 0
    assert "GPU clock lock sparkrig-gpu-clock is inactive: the clock is not capped at 2400" in (
        r.output
    )


@pytest.mark.parametrize(
    ("active", "memfree_gib", "off"),
    [("inactive", 99, True), ("inactive", 101, False), ("active", 10, False)],
)
def test_memfree_of_a_down_rank_is_judged_against_the_start_gates_floor(
    monkeypatch, active, memfree_gib, off
):
    converge_state()
    rank_lines(
        "spark-b",
        unit_ActiveState=active,
        memfree_kb=memfree_gib * 1024**2,
        memtotal_kb=128 * 1024**2,
    )
    r = status(monkeypatch, "--data", "memfree_min_gib=100")  # the gate's floor, pinned
    said = f"MemFree {memfree_gib:.1f} GiB is below the start gate's floor 100.0 GiB"
    assert (said in r.output) == off, r.output
    assert "(start floor 102400 MiB)" in r.output


def test_status_asks_nothing_and_ends_cleanly_with_stdin_closed(monkeypatch):
    """Issue 49: read-only, so no "Press enter to execute..." even without -y; with stdin closed
    (cron, `< /dev/null`) pyinfra's prompt ended in EOFError."""
    converge_state()
    r = run([INVENTORY, "status.py"], monkeypatch, stdin="")
    assert r.exit_code == 0, r.output
    assert "Press enter" not in r.output and r.exception is None, r.output
    only_reads(r)
