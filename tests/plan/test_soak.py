"""The soak gate in the plan (tasks/verify.py, sparkrig/soakgate.py): a first release or a
changed one is held under load on the head after the gates and the bench gate, its figure kept
with the release on every rank; a converged pair is not soaked; a failed soak rolls an upgrade
back; soak_minutes = 0 skips it."""

from __future__ import annotations

import re

from tests.plan import fakehosts
from tests.plan.test_plan import HEAD, WORKER, apply, converge_state, position
from tests.plan.test_release import UPGRADE, uploaded_record

SOAK_OP = "Hold the new release under load for soak_minutes"


def soaks(r, host: str) -> list[str]:
    return [c for c in r.commands.get(host, []) if fakehosts.SOAK.search(c)]


def test_a_first_release_is_soaked_on_the_head_after_the_gates_and_keeps_the_figure(monkeypatch):
    r = apply(monkeypatch)  # bare hosts
    assert r.exit_code == 0, r.output[-3000:]
    [command] = soaks(r, HEAD)
    assert not soaks(r, WORKER)
    assert "--minutes 30 --streams 4 --stall-s 300 --floor 0.5" in command
    assert "--url https://127.0.0.1:8000 --ca-file /etc/sparkrig/api-ca.crt" in command
    assert "--metrics-url http://127.0.0.1:8001/metrics" in command  # the engine's own counters
    assert position(r, "Pass the five serving gates") < position(r, SOAK_OP)
    assert position(r, "Hold a new release to the previous release's bench figures") < position(
        r, SOAK_OP
    )
    for host in (HEAD, WORKER):
        (release,) = uploaded_record(r, host)
        kept = dict(release.soak)
        assert kept["requests"] == 1210 and kept["stalls"] == 0 and kept["p99_s"] == 7.9


def test_a_converged_pair_is_not_soaked(monkeypatch):
    converge_state()
    r = apply(monkeypatch)
    assert r.exit_code == 0, r.output
    assert not soaks(r, HEAD)


def test_an_upgrade_that_wedges_in_the_soak_rolls_back_naming_the_minute(monkeypatch):
    converge_state()
    said = "soak failed at minute 22: wedged: running=4 waiting=0; nothing moved for 300 s"
    fakehosts.inject("spark-a", {fakehosts.SOAK: {"success": False, "stderr": said}})
    r = apply(monkeypatch, *UPGRADE)
    assert r.exit_code != 0
    assert re.search(r"upgrade failed \(.* -> .*profile long\): soak: ", r.output), r.output[-3000:]
    assert "Rolled back: the previous release" in r.output
    assert all(uploaded_record(r, host) == () for host in (HEAD, WORKER))  # nothing recorded


def test_soak_minutes_zero_skips_it(monkeypatch):
    r = apply(monkeypatch, "--data", "soak_minutes=0")
    assert r.exit_code == 0, r.output[-3000:]
    assert not soaks(r, HEAD)
    (release,) = uploaded_record(r, HEAD)
    assert release.soak == ()
