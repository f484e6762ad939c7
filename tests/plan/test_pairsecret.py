"""The agents' shared secret lives with the pair: a control machine without it takes the pair's,
rotation is asked for and restarts the helpers that read it, ranks that disagree are refused."""

from __future__ import annotations

import re

import pytest

from sparkrig.pairsecret import decide
from sparkrig.secretio import Held
from tests.plan import fakehosts
from tests.plan.test_plan import HEAD, WORKER, acting, apply, assert_no_restart, converge_state

SECRET = "/etc/sparkrig/pair-token"
HELPERS = {
    HEAD: "systemctl restart sparkrig-supervisor.service",
    WORKER: "systemctl restart sparkrig-agent.service",
}


def fresh_clone(tmp_path) -> tuple[str, str]:
    """--data making the control side a fresh clone's: no pair-token file there."""
    return "--data", f"pair_token_file={tmp_path / 'pair-token'}"


def test_a_fresh_control_side_takes_the_pairs_secret_and_restarts_nothing(monkeypatch, tmp_path):
    converge_state()  # both ranks hold tests/plan/pair-token's secret
    r = apply(monkeypatch, *fresh_clone(tmp_path))
    assert r.exit_code == 0, r.output
    assert r.changed_ops == {}, r.changed_ops
    assert r.uploads == {}
    assert not acting(r)
    assert not (tmp_path / "pair-token").exists()  # nothing made on the control side
    assert "agents' secret: the one the pair holds (@fake/spark-a, @fake/spark-b)" in r.output


def test_a_rank_without_the_secret_gets_the_pairs_and_only_its_helper_restarts(
    monkeypatch, tmp_path
):
    converge_state()
    fakehosts.inject("spark-b", {fakehosts.PAIR_SECRET: fakehosts.held("")})
    fakehosts.inject("spark-b", {fakehosts.owned_of(SECRET): ""})
    r = apply(monkeypatch, *fresh_clone(tmp_path))
    assert r.exit_code == 0, r.output
    pair = open("tests/plan/pair-token").read().strip()
    assert r.uploads[WORKER][SECRET].decode() == pair + "\n"
    assert HELPERS[WORKER] in r.commands[WORKER]
    assert HEAD not in r.uploads and HELPERS[HEAD] not in r.commands[HEAD]
    assert_no_restart(r)


def test_rotation_installs_one_new_secret_everywhere_and_restarts_the_helpers(monkeypatch):
    converge_state()
    r = apply(monkeypatch, "--data", "pair_token_rotate=True")
    assert r.exit_code == 0, r.output
    old = open("tests/plan/pair-token").read().strip()
    new = {r.uploads[name][SECRET].decode().strip() for name in (HEAD, WORKER)}
    assert len(new) == 1 and old not in new and re.fullmatch(r"[0-9a-f]{48}", next(iter(new)))
    for name, restart in HELPERS.items():
        cmds = r.commands[name]
        assert cmds.index(write_of(r, name, SECRET)) < cmds.index(restart)
    assert_no_restart(r)  # the ranks keep serving: only the helpers read the secret


def test_ranks_holding_different_secrets_are_refused_before_any_change(monkeypatch):
    converge_state()
    fakehosts.inject("spark-b", {fakehosts.PAIR_SECRET: fakehosts.held("0" * 48)})
    fakehosts.inject("spark-b", {fakehosts.NODE: fakehosts.node_report()})  # and a drifted MTU
    r = apply(monkeypatch)
    assert r.exit_code != 0
    assert "the ranks hold different pair secrets (@fake/spark-a vs @fake/spark-b)" in r.output
    assert "pair_token_rotate = True" in r.output
    assert not acting(r)
    assert r.uploads == {}


def test_a_truncated_secret_on_the_ranks_is_refused_before_any_change(monkeypatch):
    converge_state()
    for name in ("spark-a", "spark-b"):
        fakehosts.inject(name, {fakehosts.PAIR_SECRET: fakehosts.held("0" * 20)})
    r = apply(monkeypatch)
    assert r.exit_code != 0
    assert "is 20 characters, shorter than the 32 its helpers need to start" in r.output
    assert "pair_token_rotate = True" in r.output
    assert "0" * 20 not in r.output
    assert not acting(r)
    assert r.uploads == {}


def test_rotation_with_a_rank_outside_the_run_is_refused(monkeypatch):
    converge_state()
    r = apply(monkeypatch, "--limit", "worker", "--data", "pair_token_rotate=True")
    assert r.exit_code != 0
    assert "pair_token_rotate needs every rank in the run; @fake/spark-a not in it" in r.output
    assert r.uploads == {}


def write_of(r, name: str, dest: str) -> str:
    """The command that wrote ``dest`` on ``name`` through stdin (sparkrig/secretio.py)."""
    return next(c for c, _ in r.stdin[name] if f" {dest} " in c)


def made() -> str:
    return "new"


C, P, Q = "c" * 32, "p" * 32, "q" * 48  # secrets the helpers start with (32 or more)


@pytest.mark.parametrize(
    ("control", "held", "missing", "rotate", "token", "problem"),
    [
        ("", {"a": "", "b": ""}, [], False, "new", ""),  # first deploy, fresh clone
        (C, {"a": "", "b": ""}, [], False, C, ""),  # first deploy, seeded
        ("", {"a": P, "b": ""}, [], False, P, ""),  # a rank lacks it: the pair's
        (C, {"a": P, "b": P}, [], False, P, ""),  # stale control copy: the pair's kept
        ("", {"b": ""}, ["a"], False, "", "no rank in this run holds"),  # never a lone new one
        ("", {"a": P, "b": Q}, [], False, "", "different pair secrets"),
        ("", {"a": P, "b": Q}, [], True, "new", ""),  # rotation settles a disagreement
        ("", {"b": P}, ["a"], True, "", "needs every rank"),
        # a truncated secret: the helpers would not start with it
        ("c" * 31, {"a": "", "b": ""}, [], False, "", "31 characters, shorter than the 32"),
        (C, {"a": "p" * 8, "b": ""}, [], False, "", "(a) is 8 characters"),
        ("", {"a": "p" * 8, "b": "p" * 8}, [], True, "new", ""),  # rotation replaces it
    ],
)
def test_which_secret_the_run_installs(control, held, missing, rotate, token, problem):
    """Ranks are known by digest only: a secret the control side has no copy of is kept by digest
    (no token, a holder to copy it from)."""
    digests = {name: Held.of(text) for name, text in held.items()}
    got = decide(control, digests, missing, rotate, ".sparkrig/pair-token", make=made)
    if token and token in held.values() and token != control:
        assert got.token == "" and got.sha256 == Held.of(token).sha256
        assert got.holder and held[got.holder] == token
    else:
        assert got.token == token
        assert got.sha256 == (Held.of(token).sha256 if token else "")
    assert (problem in got.problem) if problem else not got.problem
