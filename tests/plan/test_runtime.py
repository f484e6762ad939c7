"""The runtime as it loads, in the plan (tasks/verify.py, sparkrig/runtime.py): every rank reads
what its engine mapped once the head serves; the head refuses a known-bad NCCL build or ranks on
different builds before the gates; an upgrade refused so rolls back; a converged pair changes
nothing; the reading is kept with the release."""

from __future__ import annotations

import copy
import json
import re

from tests.plan import fakehosts
from tests.plan.test_plan import HEAD, WORKER, apply, converge_state
from tests.plan.test_release import UPGRADE, uploaded_record
from tests.plan.test_status import status

AGREED = "Refuse a release whose ranks loaded different or known-bad NCCL builds"
GATES = "Pass the five serving gates"
WHEEL = "/usr/local/lib/python3.12/dist-packages/nvidia/nccl/lib/libnccl.so.2"
PIP = "a7f420a1" + "3" * 32  # pip's nvidia-nccl-cu13 2.28.9, as vllm#41725 names it


def loads(host: str, build: str, version: str = "2.28.9") -> None:
    said = copy.deepcopy(fakehosts.RUNTIME_SAYS)
    said["nccl"][0].update(build_id=build, version=version, path=WHEEL)
    fakehosts.inject(host, {fakehosts.ENGINE_RUNTIME: [json.dumps(said)]})


def ran(r, host: str, name: str) -> bool:
    return any(op.endswith(name) for op in r.changed_ops.get(host, []))


def test_a_converged_pair_reads_its_runtime_and_changes_nothing(monkeypatch):
    converge_state()
    r = apply(monkeypatch)
    assert r.exit_code == 0, r.output
    for host in (HEAD, WORKER):
        assert [c for c in r.commands[host] if fakehosts.ENGINE_RUNTIME.search(c)], host
        assert uploaded_record(r, host) == ()  # the kept reading is the one read
    assert (
        f"[{WORKER}] nccl 2.28.9 build c0db9360 /usr/lib/aarch64-linux-gnu/libnccl.so.2.28.9"
        in (r.output)
    )
    assert not any(ops for ops in r.changed_ops.values()), r.changed_ops


def test_a_first_release_keeps_what_each_rank_loaded(monkeypatch):
    r = apply(monkeypatch)  # bare hosts
    assert r.exit_code == 0, r.output[-3000:]
    for host in (HEAD, WORKER):
        (release,) = uploaded_record(r, host)
        kept = dict(release.runtime)
        assert kept["nccl"] == [
            "2.28.9 build c0db9360 /usr/lib/aarch64-linux-gnu/libnccl.so.2.28.9"
        ]
        assert kept["driver"] == "580.95.05"


def test_a_worker_on_the_pip_build_is_refused_before_the_gates(monkeypatch):
    converge_state()
    loads("spark-b", PIP)
    r = apply(monkeypatch)
    assert r.exit_code != 0
    assert f"{WORKER}: its engine loaded pip's nvidia-nccl-cu13 2.28.9 (219 MB)" in r.output
    assert "dist-packages/nvidia/nccl/lib/libnccl.so.2 (Build ID a7f420a1" in r.output
    assert "vllm-project/vllm#42354" in r.output
    assert f"[{HEAD}] failed" in r.output or "Error" in r.output
    assert not ran(r, HEAD, GATES)  # it stopped before the gates


def test_ranks_on_two_builds_of_one_version_are_refused(monkeypatch):
    converge_state()
    loads("spark-b", "d" * 40)
    r = apply(monkeypatch)
    assert r.exit_code != 0
    assert "the ranks loaded different NCCL builds" in r.output
    assert re.search(r"2\.28\.9 build c0db9360 .*2\.28\.9 build dddddddd", r.output)


def test_an_upgrade_onto_a_known_bad_build_rolls_back(monkeypatch):
    converge_state()
    loads("spark-a", PIP)
    loads("spark-b", PIP)
    r = apply(monkeypatch, *UPGRADE)
    assert r.exit_code != 0
    assert re.search(r"upgrade failed \(.* -> .*profile long\): runtime: failed", r.output), (
        r.output[-3000:]
    )
    assert "Rolled back: the previous release" in r.output


def test_the_operators_word_serves_on_a_known_bad_build_warned(monkeypatch):
    converge_state()
    loads("spark-a", PIP)
    loads("spark-b", PIP)
    r = apply(monkeypatch, "--data", "nccl_known_bad_ok=True")
    assert r.exit_code == 0, r.output[-3000:]
    assert "serving on a known-bad NCCL build" in r.output and "nccl_known_bad_ok" in r.output


def test_status_shows_what_each_ranks_engine_loaded(monkeypatch):
    converge_state()  # the record keeps DGX OS's build of 2.28.9 (fakehosts.RUNTIME_SAYS)
    r = status(monkeypatch)
    assert r.exit_code == 0, r.output
    line = "| nccl 2.28.9 build c0db9360 /usr/lib/aarch64-linux-gnu/libnccl.so.2.28.9 |"
    ranks = [x for x in r.output.splitlines() if " sparkrig-head " in x or " sparkrig-worker " in x]
    assert ranks and all(line in x for x in ranks), ranks
