"""Two pairs behind one endpoint in one run (issue 52, tests/plan/inventory_pairs.py): each pair
its own agents' secret, its own pair restart and its own rollback; the endpoint one API key and one
CA, each head its own front certificate; ``--limit <pair>`` never reaches the other pair."""

from __future__ import annotations

import json
import re
from pathlib import Path

from cryptography import x509

from sparkrig.fronttls import tls_names
from sparkrig.paths import paths
from tests.plan import fakehosts
from tests.plan.harness import Run, run
from tests.plan.test_plan import acting

INVENTORY = "tests/plan/inventory_pairs.py"
A, B, C, D = (f"@fake/spark-{x}" for x in "abcd")  # pair_a: A (head), B; pair_b: C (head), D
PAIR_A, PAIR_B = (A, B), (C, D)
SECRET, KEY = "/etc/sparkrig/pair-token", "/etc/sparkrig/api-key"
CERT, CA = "/etc/sparkrig/api-front.crt", "/etc/sparkrig/api-ca.crt"
FAILING_GATES = re.compile(
    r"/sparkhost gate gates .* \|\| true$"
)  # the gates as the deploy reads them
COPY = "tasks/api_key.py | Keep a copy of the head's API key on the control machine"
HELD_KEY = open("tests/plan/api-key").read().strip()  # what converge_state installs on the heads
RANK_UNITS = re.compile(r"^systemctl (stop|start|restart) sparkrig-(head|worker)\b")


def settings():  # read when a test runs (loading the inventory patches gevent)
    return fakehosts.settings_of(INVENTORY)


def apply(monkeypatch, *extra: str) -> Run:
    return run(["-y", *extra, INVENTORY, "deploy.py"], monkeypatch)


def converge_state(**overrides) -> None:
    """Every rank of both pairs holds what the deploy renders for it."""
    for name, s in settings().items():
        short = name.split("/")[1]
        fakehosts.STATE[short] = fakehosts.converged(s, **overrides.get(short, {}))


def fresh_control_side(tmp_path: Path) -> list[str]:
    """--data pointing every control copy (secrets, CA) at an empty directory: a first deploy."""
    return [
        *("--data", f"pair_token_file={tmp_path / 'pair-token'}"),
        *("--data", f"api_key_file={tmp_path / 'api-key'}"),
        *("--data", f"api_tls_dir={tmp_path / 'tls'}"),
    ]


def names_of(pem: bytes) -> set[str]:
    cert = x509.load_pem_x509_certificate(pem)
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    ips = [str(ip) for ip in san.get_values_for_type(x509.IPAddress)]
    return {*san.get_values_for_type(x509.DNSName), *ips}


def rank_units_touched(r: Run, name: str) -> list[str]:
    return [c for c in r.commands.get(name, []) if RANK_UNITS.match(c)]


def test_a_first_deploy_gives_each_pair_its_own_secret_and_both_heads_one_key_and_one_ca(
    monkeypatch, tmp_path
):
    r = apply(monkeypatch, *fresh_control_side(tmp_path))
    assert r.exit_code == 0, r.output
    secret = {name: r.uploads[name][SECRET] for name in (A, B, C, D)}
    assert secret[A] == secret[B] and secret[C] == secret[D]  # one per pair
    assert secret[A] != secret[C]  # never one pair's in the other
    # one API key for the endpoint: on both heads, and the control side's copy
    assert r.uploads[A][KEY] == r.uploads[C][KEY] == (tmp_path / "api-key").read_bytes()
    # one CA, made once, signing each head's own certificate
    tls = tmp_path / "tls"
    made = {line.strip() for line in r.output.splitlines() if "made the pair's CA" in line}
    assert len(made) == 1 and made.pop().startswith(f"[{A}] "), r.output  # said once, by A
    ca_pem = (tls / "ca.crt").read_bytes()
    ca = x509.load_pem_x509_certificate(ca_pem)
    assert r.uploads[A][CA] == r.uploads[C][CA] == ca_pem
    assert r.uploads[A][CERT] != r.uploads[C][CERT]
    for head, pair in ((A, "pair_a"), (C, "pair_b")):
        cert = x509.load_pem_x509_certificate(r.uploads[head][CERT])
        cert.verify_directly_issued_by(ca)
        assert set(tls_names(settings()[head])) <= names_of(r.uploads[head][CERT])
        other = C if head == A else A
        assert other.lower() not in names_of(r.uploads[head][CERT])
        assert (tls / f"front-{pair}.crt").read_bytes() == r.uploads[head][CERT]
    assert not (tls / "front.crt").exists()  # a named pair's certificate is front-<pair>.crt


def test_a_converged_two_pair_inventory_plans_nothing(monkeypatch):
    converge_state()
    r = apply(monkeypatch)
    assert r.exit_code == 0, r.output
    assert (r.changed_ops, sorted(r.uploads), acting(r)) == ({}, [], [])
    assert len(r.commands) == 4


def test_a_trigger_in_one_pair_restarts_that_pair_and_never_the_other(monkeypatch):
    """pair_a's worker holds an older rank.env (a pair-restart trigger): pair_a restarts in
    order, pair_b's ranks are neither stopped nor started, nor smoke-tested."""
    env = paths(settings()[B]).env_file
    converge_state(**{"spark-b": {"files": {env: (b"NCCL_IB_HCA=rocep1s0f1\n", "644")}}})
    r = apply(monkeypatch)
    assert r.exit_code == 0, r.output
    assert "systemctl stop sparkrig-worker.service" in r.commands[B]
    assert "systemctl stop sparkrig-head.service" in r.commands[A]
    assert fakehosts.start_of("sparkrig-worker") in r.commands[B]
    assert fakehosts.start_of("sparkrig-head") in r.commands[A]
    untouched = {
        name: (
            rank_units_touched(r, name),
            [c for c in r.commands[name] if "sparkrig-nccl-smoke" in c],
            r.changed_ops.get(name, []),
        )
        for name in PAIR_B
    }
    assert untouched == {name: ([], [], []) for name in PAIR_B}


def test_a_failed_upgrade_in_one_pair_rolls_back_that_pair_and_never_the_other(monkeypatch):
    """pair_b serves and takes a new release whose gates fail on its head: pair_b puts the
    previous release back; pair_a, which serves nothing yet (no release recorded: a release
    goes to one serving pair at a time, so only one of them may be an upgrade), passes its
    gates and has nothing rolled back (a rollback of it would fail: it has no previous
    release)."""
    converge_state()
    for short in ("spark-a", "spark-b"):  # nothing recorded: pair_a is deployed, not upgraded
        fakehosts.inject(short, {fakehosts.RELEASE: fakehosts.release_state()})
    fakehosts.inject("spark-c", {FAILING_GATES: [
        json.dumps({"gate": "health", "ok": True, "detail": "ok", "ms": 5}),
        json.dumps({"gate": "math", "ok": False, "detail": "no 391 in the answer", "ms": 5}),
    ]})  # fmt: skip
    r = apply(monkeypatch, "--data", "profile=long")  # pair_b's release change
    assert r.exit_code != 0
    assert f"[{C}] upgrade failed (" in r.output and "Rolled back: the previous release" in r.output
    restored = {
        name: any(fakehosts.RESTORE.search(c) for c in r.commands[name]) for name in r.commands
    }
    assert restored == {A: False, B: False, C: True, D: True}
    rolled = {
        name: [op for op in r.changed_ops.get(name, []) if "Roll back to the previous" in op]
        for name in PAIR_A
    }
    assert rolled == {A: [], B: []}  # nothing of the rollback acted on pair_a: no rank stopped
    assert "cannot roll back" not in r.output  # pair_a was never asked to
    assert any(fakehosts.GATES.match(c) for c in r.commands[A])  # pair_a's own gates passed


def test_a_fresh_control_side_keeps_the_heads_one_key_and_one_head_writes_its_copy(
    monkeypatch, tmp_path
):
    converge_state()  # both heads hold tests/plan/api-key's key
    path = tmp_path / "api-key"
    r = apply(monkeypatch, "--data", f"api_key_file={path}")
    assert r.exit_code == 0, r.output
    assert r.changed_ops == {A: [COPY]}, r.changed_ops  # once, by the endpoint's first head
    assert r.uploads == {} and not acting(r)
    assert path.read_text() == HELD_KEY + "\n"
    assert f"API key: the one each head holds ({A}, {C})" in r.output


def test_heads_holding_different_keys_are_refused_before_any_change(monkeypatch):
    converge_state()
    fakehosts.inject("spark-c", {fakehosts.API_KEY: fakehosts.held("0" * 48)})
    r = apply(monkeypatch)
    assert r.exit_code != 0
    assert f"the ranks hold different API keys ({A} vs {C})" in r.output
    assert "api_key_rotate = True" in r.output
    assert r.uploads == {} and not acting(r)


def test_a_head_lacking_the_key_the_other_holds_unknown_here_is_refused(monkeypatch, tmp_path):
    """The control side has no copy of the key spark-a holds: it cannot be written to spark-c
    (the deploy never reads a secret back to write a file), so the run is refused, saying how."""
    converge_state()
    fakehosts.inject("spark-c", {fakehosts.API_KEY: fakehosts.held("")})
    r = apply(monkeypatch, "--data", f"api_key_file={tmp_path / 'api-key'}")
    assert r.exit_code != 0
    assert f"{C} holds no API key (/etc/sparkrig/api-key) and {tmp_path / 'api-key'}" in r.output
    assert r.uploads == {} and not acting(r)
    assert not (tmp_path / "api-key").exists()


def test_rotating_the_key_with_a_pairs_head_out_of_the_run_is_refused(monkeypatch, tmp_path):
    converge_state()
    path = tmp_path / "api-key"
    r = apply(monkeypatch, "--limit", "pair_a", "--data", f"api_key_file={path}",
              "--data", "api_key_rotate=True")  # fmt: skip
    assert r.exit_code != 0
    assert f"api_key_rotate needs every pair's head in the run; {C} not in it" in r.output
    assert r.uploads == {} and not acting(r) and not path.exists()


def test_status_prints_each_pair(monkeypatch):
    converge_state()
    r = run(["-y", INVENTORY, "status.py"], monkeypatch)
    assert r.exit_code == 0, r.output
    for pair, head, worker in (("pair_a", A, B), ("pair_b", C, D)):
        assert f"[{head}] {pair} rank0 sparkrig-head active/running" in r.output
        assert f"[{worker}] {pair} rank1 sparkrig-worker active/running" in r.output
        assert f"[{head}] {pair} gates: health ok" in r.output


def test_limit_to_one_pair_never_reaches_the_other(monkeypatch):
    converge_state()
    fakehosts.inject("spark-b", {fakehosts.owned_of(paths(settings()[B]).env_file): ""})
    r = apply(monkeypatch, "--limit", "pair_a")
    assert r.exit_code == 0, r.output
    assert r.commands.get(C, []) == [] and r.commands.get(D, []) == []
    assert r.commands[A] and r.commands[B]
