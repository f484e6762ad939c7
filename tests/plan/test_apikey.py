"""The API key lives with the head, like the agents' secret: a control machine without it (a
fresh clone, a second operator) or with another one keeps the head's and gets a copy for its
clients; rotation is asked for and restarts the head's serving; a run without the head decides
nothing about the key (issue 10 item 6, issue 11 item 1)."""

from __future__ import annotations

import re

import pytest

from sparkrig.pairsecret import API_KEY as KIND
from sparkrig.pairsecret import decide
from sparkrig.secretio import Held
from tests.plan import fakehosts
from tests.plan.harness import run
from tests.plan.test_plan import HEAD, WORKER, acting, apply, assert_no_restart, converge_state

KEY, ENV = "/etc/sparkrig/api-key", "/etc/sparkrig/api-key.env"
HEAD_UNIT = "/etc/systemd/system/sparkrig-head.service"
COPY = "tasks/api_key.py | Keep a copy of the head's API key on the control machine"
HELD = open("tests/plan/api-key").read().strip()  # what converge_state installs on the head
OTHER = open("tests/plan/api-key-2").read().strip()


def control(tmp_path, content: str | None = None) -> tuple[list[str], object]:
    """--data making the control side's api_key_file a file of the test's own (absent: a fresh
    clone); never a fixture of the repository, which the run may overwrite."""
    path = tmp_path / "sparkrig" / "api-key"
    if content is not None:
        path.parent.mkdir()
        path.write_text(content + "\n")
    return ["--data", f"api_key_file={path}"], path


def test_a_fresh_control_side_keeps_the_heads_key_and_gets_a_copy(monkeypatch, tmp_path):
    converge_state()  # the head holds tests/plan/api-key's key
    args, path = control(tmp_path)
    r = apply(monkeypatch, *args)
    assert r.exit_code == 0, r.output
    assert r.changed_ops == {HEAD: [COPY]}, r.changed_ops  # nothing on any host
    assert r.uploads == {}
    assert not acting(r)
    assert path.read_text() == HELD + "\n"
    assert path.stat().st_mode & 0o777 == 0o600
    assert "API key: the one the head holds (@fake/spark-a)" in r.output
    assert f"the head's API key written to {path} (0600)" in r.output
    assert HELD not in r.output


def test_dry_never_writes_the_control_copy(monkeypatch, tmp_path):
    converge_state()
    args, path = control(tmp_path)
    r = run(["--dry", *args, "tests/plan/inventory_state.py", "deploy.py"], monkeypatch)
    assert r.exit_code == 0, r.output
    assert COPY in r.changed_ops[HEAD]  # planned, not done
    assert not path.exists()


def test_a_control_side_with_another_key_keeps_the_heads_with_a_warning(monkeypatch, tmp_path):
    converge_state()
    args, path = control(tmp_path, OTHER)
    r = apply(monkeypatch, *args)
    assert r.exit_code == 0, r.output
    assert f"{path} differs from the API key the head holds (@fake/spark-a)" in r.output
    assert "the head's is kept" in r.output and "api_key_rotate = True" in r.output
    assert r.uploads == {}  # the head's key and env file stay
    assert_no_restart(r)
    assert path.read_text() == HELD + "\n"  # the clients' copy follows the head
    assert OTHER not in r.output and HELD not in r.output


def test_rotation_installs_a_new_key_and_restarts_the_pair_in_order(monkeypatch, tmp_path):
    converge_state()
    args, path = control(tmp_path, HELD)
    r = apply(monkeypatch, *args, "--data", "api_key_rotate=True")
    assert r.exit_code == 0, r.output
    new = r.uploads[HEAD][KEY].decode().strip()
    assert re.fullmatch(r"[0-9a-f]{48}", new) and new != HELD
    assert r.uploads[HEAD][ENV] == f"VLLM_API_KEY={new}\n".encode()
    assert HEAD_UNIT not in r.uploads[HEAD]  # the unit names the file, not the key
    head = r.commands[HEAD]
    stop, start = "systemctl stop sparkrig-head.service", fakehosts.start_of("sparkrig-head")
    wrote = next(c for c, _ in r.stdin[HEAD] if f" {ENV} " in c)
    assert head.index(wrote) < head.index(stop) < head.index(start)
    assert fakehosts.start_of("sparkrig-worker") in r.commands[WORKER]
    assert path.read_text() == new + "\n"  # the operator's clients get the new one
    assert "API key: rotated on request (api_key_rotate)" in r.output
    assert new not in r.output


def test_limit_worker_decides_nothing_about_the_key(monkeypatch, tmp_path):
    converge_state()
    args, path = control(tmp_path)
    r = apply(monkeypatch, "--limit", "worker", *args)
    assert r.exit_code == 0, r.output
    assert not [op for op in r.host_ops[WORKER] if "API key" in op], r.host_ops[WORKER]
    assert "API key:" not in r.output
    assert not path.exists()
    assert r.commands[HEAD] == []  # the head was not even read


def test_rotation_without_the_head_in_the_run_is_refused(monkeypatch, tmp_path):
    converge_state()
    args, path = control(tmp_path)
    r = apply(monkeypatch, "--limit", "worker", *args, "--data", "api_key_rotate=True")
    assert r.exit_code != 0
    assert "api_key_rotate needs the head in the run; @fake/spark-a not in it" in r.output
    assert r.uploads == {} and not path.exists()


def made() -> str:
    return "new"


@pytest.mark.parametrize(
    ("control_key", "held", "rotate", "token", "warned"),
    [
        ("", "", False, "new", False),  # first deploy from a fresh clone
        ("c", "", False, "c", False),  # first deploy, seeded from the control side
        ("", "h", False, "h", False),  # a fresh clone: the head's
        ("c", "h", False, "h", True),  # another key on the control side: the head's, warned
        ("h", "h", False, "h", False),
        ("c", "h", True, "new", False),  # rotation
    ],
)
def test_which_key_the_run_installs(control_key, held, rotate, token, warned):
    got = decide(control_key, {"head": Held.of(held)}, [], rotate, "ctl", make=made, kind=KIND)
    assert not got.problem
    if token == held and token != control_key:  # the head's, known by digest only
        assert got.token == "" and got.sha256 == Held.of(held).sha256 and got.holder == "head"
    else:
        assert got.token == token
    assert bool(got.warning) is warned
