"""Two pairs behind one endpoint, planned through the real CLI on @fake hosts (docs/pairs.md): a
release change of both serving pairs in one run is refused before any change; the same change on
one pair (--limit) drains that pair out of the balance before its ranks stop and puts it back
after its gates; a pair alone drains nothing."""

from __future__ import annotations

from sparkrig import endpoint
from tests.plan import fakehosts
from tests.plan.harness import Run, run
from tests.plan.test_release import UPGRADE

PAIRS = "tests/plan/inventory_pairs.py"
A_HEAD, A_WORKER, B_HEAD, B_WORKER = (f"@fake/spark-{n}" for n in "abcd")
DRAIN = "Drain the pair out of the endpoint's balance before it restarts"
RESTORE = "Put the pair back into the endpoint's balance once it passed its gates"
STOP = "Stop every rank for an ordered pair restart"
REFUSAL = "Refuse a release change of several serving pairs at once"


def converge_pairs() -> None:
    for name, s in fakehosts.settings_of(PAIRS).items():
        fakehosts.STATE[name.split("/")[1]] = fakehosts.converged(s)


def apply(monkeypatch, *extra: str) -> Run:
    return run(["-y", *extra, PAIRS, "deploy.py"], monkeypatch)


def acted(r: Run, host: str, name: str) -> bool:
    return any(op.endswith(name) for op in r.changed_ops.get(host, []))


def index(r: Run, host: str, name: str) -> int:
    ops = r.host_ops[host]
    found = [i for i, op in enumerate(ops) if op.endswith(name)]
    assert found, f"{host}: no operation {name!r}"
    return found[0]


def test_a_release_change_of_both_serving_pairs_at_once_is_refused_before_any_change(
    monkeypatch,
):
    converge_pairs()
    r = apply(monkeypatch, *UPGRADE)
    assert r.exit_code != 0, r.output
    assert "the release changes on pairs pair_a, pair_b at once" in r.output
    assert "python3 -m sparkrig roll" in r.output
    for host in (A_HEAD, A_WORKER, B_HEAD, B_WORKER):
        ops = r.changed_ops.get(host, [])
        assert [op for op in ops if not op.endswith(REFUSAL)] == [], r.changed_ops


def test_one_pairs_upgrade_drains_it_first_and_puts_it_back_after_its_gates(monkeypatch):
    converge_pairs()
    r = apply(monkeypatch, *UPGRADE, "--limit", "pair_a")
    assert r.exit_code == 0, r.output
    reached = {host for host, commands in r.commands.items() if commands}
    assert reached == {A_HEAD, A_WORKER}  # pair_b is never reached
    assert acted(r, A_HEAD, DRAIN) and acted(r, A_HEAD, RESTORE)
    assert index(r, A_HEAD, DRAIN) < index(r, A_HEAD, STOP)
    for gate in ("Pass the five serving gates", "Hold the new release under load for soak_minutes"):
        assert index(r, A_HEAD, gate) < index(r, A_HEAD, RESTORE)
    drain = [c for c in r.commands[A_HEAD] if "sparkhost gate drain" in c]
    assert (
        len(drain) == 1
        and endpoint.drain_include(fakehosts.settings_of(PAIRS)[A_HEAD]) in (drain[0])
    )
    assert "default 1;" in drain[0] and "--timeout 120" in drain[0]
    restore = [c for c in r.commands[A_HEAD] if "default 0;" in c and "api-drain.conf" in c]
    assert len(restore) == 1, r.commands[A_HEAD]
    # the front phase leaves the drained pair's include alone (the restore writes it)
    assert not acted(r, A_HEAD, "Keep the pair in the endpoint's balance (drain include)")


def test_a_converged_endpoint_drains_nothing_and_a_lost_drain_include_is_put_back(monkeypatch):
    converge_pairs()
    r = apply(monkeypatch)
    assert r.exit_code == 0, r.output
    assert r.changed_ops == {}, r.changed_ops
    s = fakehosts.settings_of(PAIRS)[B_HEAD]
    fakehosts.STATE["spark-c"] = fakehosts.converged(
        s, files={endpoint.drain_include(s): (endpoint.drain_text(True).encode(), "644")}
    )
    r = apply(monkeypatch)
    assert r.exit_code == 0, r.output
    assert acted(r, B_HEAD, "Keep the pair in the endpoint's balance (drain include)")
    assert r.uploads[B_HEAD][endpoint.drain_include(s)] == endpoint.drain_text(False).encode()
    assert not acted(r, B_HEAD, DRAIN)


def test_a_pair_alone_has_no_drain_and_its_front_balances_nothing(monkeypatch):
    r = run(["-y", "tests/plan/inventory_state.py", "deploy.py"], monkeypatch)
    assert r.exit_code == 0, r.output
    changed = {op for ops in r.changed_ops.values() for op in ops}
    assert not [n for n in changed if "endpoint's balance" in n], changed
    assert not [c for cmds in r.commands.values() for c in cmds if "api-drain" in c]
    site = r.uploads["@fake/spark-a"]["/etc/nginx/conf.d/sparkrig-api.conf"].decode()
    assert "sparkrig_pairs" not in site and endpoint.LOCAL_HEADER not in site
