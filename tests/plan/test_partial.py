"""Partial runs never leave half a pair: without the head nothing that needs it runs and the run
says what to run instead; weights_verify = "full" never restarts a healthy pair and refuses to
hash beside a serving rank."""

from __future__ import annotations

import re

from tests.plan import fakehosts
from tests.plan.test_plan import HEAD, STOP, WORKER, acting, apply, converge_state

WITH_THE_HEAD = "run `pyinfra inventory.py deploy.py` with the head (no --limit)"
RANK = re.compile(r"^systemctl (start|stop) sparkrig-(head|worker)")
IMAGE_LOAD = re.compile(r"^sh -c 'set -e\nmkdir -p -m 700 /var/lib/sparkrig/images\n")


def test_limit_worker_without_its_weights_fails_naming_the_run_that_copies_them(monkeypatch):
    r = apply(monkeypatch, "--limit", "worker")  # a bare worker: the head must serve it weights
    assert r.exit_code != 0
    said = "the head (@fake/spark-a) serves the weights to the workers and is not in this run: "
    assert said + WITH_THE_HEAD in r.output
    assert r.commands.get(HEAD, []) == []
    worker = r.commands[WORKER]
    assert not any(fakehosts.FETCH.search(c) for c in worker)  # no copy from no one
    assert not any(RANK.match(c) or "sparkhost pair request" in c for c in worker)


def test_limit_worker_without_the_base_image_fails_naming_the_run_that_copies_it(monkeypatch):
    converge_state()
    absent = fakehosts.image_state(fakehosts.IMAGE, pulled=False, base=False, patched=False)
    fakehosts.inject("spark-b", {fakehosts.IMAGE_FACT: absent})
    r = apply(monkeypatch, "--limit", "worker")
    assert r.exit_code != 0
    assert "is not here; the head (@fake/spark-a) serves it to the workers" in r.output
    assert WITH_THE_HEAD in r.output
    assert not any(IMAGE_LOAD.match(c) for c in r.commands[WORKER])
    assert r.commands.get(HEAD, []) == []
    # with the head in the run the same worker copies it
    ok = apply(monkeypatch)
    assert ok.exit_code == 0, ok.output
    assert any(IMAGE_LOAD.match(c) for c in ok.commands[WORKER])


def test_limit_worker_says_what_it_skipped_and_what_to_run_instead(monkeypatch):
    converge_state(**{"spark-b": {"mtu": 1500}})
    r = apply(monkeypatch, "--limit", "worker")
    assert r.exit_code == 0, r.output
    said = "the NCCL smoke test and the serving gates are skipped, and so is the image prune: "
    assert said + WITH_THE_HEAD + " for them" in r.output
    # (the state read names the host package's nccl_smoke.py: the smoke test is its container)
    assert not any("sparkrig-nccl-smoke" in c for c in r.commands[WORKER])


def test_full_verify_refuses_to_hash_beside_a_serving_rank(monkeypatch):
    converge_state()
    r = apply(monkeypatch, "--data", "weights_verify=full")
    assert r.exit_code != 0
    assert "weights_verify = 'full' re-hashes every weights file through the page cache" in r.output
    assert "stop the pair first (on the head: `sudo systemctl stop sparkrig-head`" in r.output
    assert not acting(r)
    assert not any(fakehosts.REHASH.search(c) for cmds in r.commands.values() for c in cmds)


def stopped_pair() -> None:
    """A converged pair the operator stopped (systemctl stop sparkrig-head; the worker followed)."""
    converge_state()
    for short, unit in (("spark-a", "sparkrig-head"), ("spark-b", "sparkrig-worker")):
        dead = [f"Id={unit}.service", "SubState=dead"]
        fakehosts.inject(short, {fakehosts.unit_fact(unit, "SubState"): dead})


def test_full_verify_of_a_stopped_pair_re_hashes_and_restarts_nothing(monkeypatch):
    stopped_pair()
    # the watchdog runs: it is paused only for an ordered pair restart, which shows the decision
    running = ["Id=sparkrig-watchdog.service", "SubState=running"]
    fakehosts.inject("spark-a", {fakehosts.unit_fact("sparkrig-watchdog", "SubState"): running})
    r = apply(monkeypatch, "--data", "weights_verify=full", "--data", "watchdog=True")
    assert r.exit_code == 0, r.output
    for name in (HEAD, WORKER):
        cmds = r.commands[name]
        assert any(fakehosts.REHASH.search(c) for c in cmds), name
        assert not any(fakehosts.FETCH.search(c) for c in cmds)  # every file passed
        assert not any(re.match(r"systemctl stop sparkrig-(head|worker)", c) for c in cmds)
        assert STOP not in " ".join(r.changed_ops[name])
    # the re-hash is no restart trigger: no ordered pair restart was decided
    assert "systemctl stop sparkrig-watchdog.service" not in r.commands[HEAD]
    # the stopped pair is started again in order, as any deploy does
    assert r.commands[WORKER].count(fakehosts.start_of("sparkrig-worker")) == 1
    assert r.commands[HEAD].count(fakehosts.start_of("sparkrig-head")) == 1


def test_quick_verify_of_a_stopped_pair_re_hashes_nothing(monkeypatch):
    stopped_pair()
    r = apply(monkeypatch)
    assert r.exit_code == 0, r.output
    assert not any(fakehosts.REHASH.search(c) for cmds in r.commands.values() for c in cmds)
    assert fakehosts.start_of("sparkrig-head") in r.commands[HEAD]
