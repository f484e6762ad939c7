"""status.py through the real CLI against strict @fake hosts: one read per rank, nothing that
changes a host, non-zero naming what is off, --limit."""

from __future__ import annotations

import pytest

from tests.plan import fakehosts
from tests.plan.harness import Run, run
from tests.plan.test_plan import ACTION, HEAD, INVENTORY, WORKER, converge_state


@pytest.fixture(autouse=True)
def _clean_state():
    fakehosts.STATE.clear()
    yield
    fakehosts.STATE.clear()


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
