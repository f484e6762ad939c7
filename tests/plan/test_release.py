"""Upgrades that roll back (sparkrig/rollback.py), planned through the real CLI on @fake hosts: a
release change keeps the serving release's files before anything rewrites them; a failed gate
puts them back and restarts the pair worker(s) first, then the head, and the run fails naming
both; a run without a release change keeps and rolls back nothing; --limit worker refuses an
upgrade; a success records the new release and prunes what fell out of the record."""

from __future__ import annotations

import json
import re

import pytest

from sparkrig.release import Release, parse_record, record_path, release_files
from tests.plan import fakehosts
from tests.plan.harness import run
from tests.plan.test_plan import (
    ACTION,
    HEAD,
    INVENTORY,
    LEGACY_OP,
    WORKER,
    apply,
    converge_state,
    old_layout_programs,
    position,
    settings,
)

UPGRADE = ("--data", "profile=long")  # a release change the lockfiles in tests/plan allow
KEEP_OP = "Keep the serving release's unit and lockfiles until the new release passes the gates"
FAILING = re.compile(r"/sparkhost gate gates .* \|\| true$")  # the gates as the deploy reads them
OLD = "9" * 40


def failing_gates() -> None:
    """The new release boots but fails the math gate; the previous one (after the rollback,
    the gate script run plainly) passes."""
    lines = [
        json.dumps({"gate": "health", "ok": True, "detail": "ok", "ms": 5}),
        json.dumps({"gate": "math", "ok": False, "detail": "no 391 in the answer", "ms": 5}),
    ]
    fakehosts.inject("spark-a", {FAILING: lines})


def uploaded_record(r, name: str) -> tuple[Release, ...]:
    s = settings()[name]
    data = r.uploads.get(name, {}).get(record_path(s.knobs.config_dir))
    return parse_record(data.decode()) if data else ()


def test_a_release_change_keeps_the_serving_release_before_any_phase_rewrites_it(monkeypatch):
    converge_state()
    r = apply(monkeypatch, *UPGRADE)
    assert r.exit_code == 0, r.output
    keep = position(r, KEEP_OP)
    assert keep < position(r, "Install the weights lockfiles")
    assert keep < position(r, "Install the rank unit")
    for name, s in settings().items():
        kept = [c for c in r.commands[name] if fakehosts.KEEP.search(c)]
        assert len(kept) == 1, name
        for path in release_files(s):  # each file with the digest the record holds
            assert f"cp -p {path} {path}.prev" in kept[0]
        # the gates passed: the record now holds the new release, then the previous one
        record = uploaded_record(r, name)
        assert [x.profile for x in record] == ["long", "shared"]
        assert not any(fakehosts.RESTORE.search(c) for c in r.commands[name])
    assert "release changes (stack vllm-nvfp4, image" in r.output and "profile long)" in r.output


def test_a_run_without_a_release_change_keeps_records_and_rolls_back_nothing(monkeypatch):
    converge_state()
    r = apply(monkeypatch)
    assert r.exit_code == 0, r.output
    for name, cmds in r.commands.items():
        assert not [c for c in cmds if ".prev" in c or fakehosts.KEEP.search(c)], name
        assert uploaded_record(r, name) == ()
        assert not [c for c in cmds if ACTION.search(c)], name


def test_failed_gates_roll_back_worker_then_head_and_fail_naming_both(monkeypatch):
    converge_state()
    failing_gates()
    r = apply(monkeypatch, *UPGRADE)
    assert r.exit_code != 0
    # what failed is named (the fakes answer a failing command with "failed" on stderr; a real
    # shell prints the gate report there: tests/lab)
    said = r"upgrade failed \(stack vllm-nvfp4, image \w+, model \w+, profile shared -> "
    said += r"stack vllm-nvfp4, image \w+, model \w+, "
    assert re.search(said + r"profile long\): gates: failed\. ", r.output), r.output[-3000:]
    assert "Rolled back: the previous release (stack vllm-nvfp4, image" in r.output
    assert "profile shared) passed the four gates and serves again" in r.output
    # the rollback's operations, in the ordered restart's order
    order = [
        "Put the previous release's unit and lockfiles back",
        "Stop every rank to roll back",
        "Start the worker rank of the previous release",
        "Wait until every worker of the previous release runs",
        "Start the head rank of the previous release",
        "Wait for the previous release's API to finish booting",
        "Pass the four serving gates on the previous release",
        "Fail the run: the upgrade failed and the previous release serves again",
    ]
    at = [position(r, op) for op in order]
    assert at == sorted(at)
    head, worker = r.commands[HEAD], r.commands[WORKER]
    for cmds in (head, worker):
        restored = [i for i, c in enumerate(cmds) if fakehosts.RESTORE.search(c)]
        assert len(restored) == 1
    # after the restore: the worker starts its rank, the head waits for it, then starts
    w_start = len(worker) - 1 - worker[::-1].index(fakehosts.start_of("sparkrig-worker"))
    h_start = len(head) - 1 - head[::-1].index(fakehosts.start_of("sparkrig-head"))
    h_restore = next(i for i, c in enumerate(head) if fakehosts.RESTORE.search(c))
    h_wait = [i for i, c in enumerate(head) if fakehosts.PAIR_WAIT.match(c)][-1]
    assert h_restore < h_wait < h_start
    assert w_start > next(i for i, c in enumerate(worker) if fakehosts.RESTORE.search(c))
    assert any(fakehosts.GATES.match(c) and "|| true" not in c for c in head[h_start:])
    # nothing recorded, nothing pruned: the previous release stays whole
    for name, cmds in r.commands.items():
        assert uploaded_record(r, name) == ()
        assert not any(fakehosts.PRUNE.match(c) or fakehosts.PRUNE_WEIGHTS.match(c) for c in cmds)


def test_failed_gates_without_a_release_change_fail_as_before_with_no_rollback(monkeypatch):
    converge_state()
    failing_gates()
    r = apply(monkeypatch)
    assert r.exit_code != 0
    assert r.changed_ops[HEAD][-1].endswith("Pass the five serving gates")  # it stopped there
    assert "Rolled back" not in r.output and "upgrade failed" not in r.output
    for cmds in r.commands.values():
        assert not any(fakehosts.RESTORE.search(c) for c in cmds)
        assert "systemctl stop sparkrig-worker.service" not in cmds


def test_a_record_without_the_previous_files_cannot_roll_back_and_says_what_to_do(monkeypatch):
    converge_state()
    for short in ("spark-a", "spark-b"):
        fakehosts.serving_recorded(short, files=())  # a record that lists no file to put back
    failing_gates()
    r = apply(monkeypatch, *UPGRADE)
    assert r.exit_code != 0
    said = (
        "cannot roll back: the release record of this rank lists no files of the previous "
        "release, so the failed release stays in place; read why it failed above, then fix "
        "the cause and run the deploy again, or set the knobs back to what last served "
        "(status.py shows it) and run it again"
    )
    for cmds in r.commands.values():
        failed = [c for c in cmds if c.endswith(">&2; exit 1")]
        assert [c for c in failed if said in c], failed
        assert not any(fakehosts.RESTORE.search(c) for c in cmds)


def test_limit_worker_refuses_an_upgrade_of_half_a_pair(monkeypatch):
    converge_state()
    r = apply(monkeypatch, "--limit", "worker", *UPGRADE)
    assert r.exit_code != 0
    assert "the release changes (" in r.output
    assert "run `pyinfra inventory.py deploy.py` with the head (no --limit)" in r.output
    assert r.commands.get(HEAD, []) == []
    assert not [c for c in r.commands[WORKER] if ACTION.search(c) or "pair request" in c]


older = Release(
    "sparkrig/vllm-glm53:0123456789abcdef", "sparkrig/vllm-glm53:base-0", OLD, "", "shared"
)  # a release recorded before the serving one (another model revision)


@pytest.mark.parametrize("keep", [1, 2])
def test_a_success_keeps_the_knobs_worth_of_releases_and_prunes_the_rest(monkeypatch, keep):
    for name, s in settings().items():
        state = fakehosts.converged(s)
        owned = fakehosts.owned_files(s)
        state[fakehosts.RELEASE] = fakehosts.converged_release(s, owned, older=(older,))
        state.update(
            fakehosts.converged_image_state(
                fakehosts.IMAGE, pulled=s.me.is_head, extra_tags=(older.image,)
            )
        )
        fakehosts.STATE[name.split("/")[1]] = state
    r = apply(monkeypatch, "--data", f"keep_releases={keep}")
    assert r.exit_code == 0, r.output
    for name, cmds in r.commands.items():
        pruned_weights = [c for c in cmds if fakehosts.PRUNE_WEIGHTS.match(c)]
        pruned_images = [c for c in cmds if fakehosts.PRUNE.match(c)]
        if keep == 1:
            assert pruned_weights == [
                f"rm -rf /var/lib/sparkrig/models/model-{OLD} "
                f"/var/lib/sparkrig/models/model-{OLD}.stamps.json "
                f"/var/lib/sparkrig/models/model-{OLD}.fetch-status.json "
                f"/var/lib/sparkrig/models/model-{OLD}.lock"
            ]
            assert any(older.image in c for c in pruned_images)
            assert [x.model_revision for x in uploaded_record(r, name)] == [fakehosts.COMMIT]
        else:
            assert pruned_weights == [] and pruned_images == []
            assert uploaded_record(r, name) == ()  # the record already says this


def test_a_checkout_of_the_old_layout_is_adopted_before_a_lockfile_replaces_its_own(monkeypatch):
    converge_state()
    s = settings()[WORKER]
    entries = tuple(f"dir {n}" for n in ("model",))
    fakehosts.inject("spark-b", {fakehosts.RELEASE: fakehosts.release_state("", entries)})
    r = apply(monkeypatch)
    assert r.exit_code == 0, r.output
    adopted = [c for c in r.commands[WORKER] if fakehosts.ADOPT.match(c)]
    assert len(adopted) == 1 and f"{s.knobs.config_dir}/model.lock.json" in adopted[0]
    assert position(r, "Adopt a weights checkout of the old layout as its revision's directory") < (
        position(r, "Install the weights lockfiles")
    )
    assert not any(fakehosts.ADOPT.match(c) for c in r.commands[HEAD])


def test_a_failed_smoke_test_during_an_upgrade_starts_nothing_new_and_rolls_back(monkeypatch):
    """A boot failure before the gates: the new release's NCCL smoke test fails on the head.
    Nothing of the new release starts; the previous one is put back and started in order."""
    converge_state()
    fakehosts.inject("spark-a", {fakehosts.SMOKE_HEAD: fakehosts.FAILED})
    r = apply(monkeypatch, *UPGRADE)
    assert r.exit_code != 0
    assert re.search(r"upgrade failed \([^)]*profile long\): NCCL smoke test: failed\. ", r.output)
    head, worker = r.commands[HEAD], r.commands[WORKER]
    # one start per rank: the previous release's, after its files were put back
    assert head.count(fakehosts.start_of("sparkrig-head")) == 1
    assert worker.count(fakehosts.start_of("sparkrig-worker")) == 1
    for cmds, unit in ((head, "sparkrig-head"), (worker, "sparkrig-worker")):
        restored = next(i for i, c in enumerate(cmds) if fakehosts.RESTORE.search(c))
        assert cmds.index(fakehosts.start_of(unit)) > restored
    assert not any(fakehosts.BOOT_WAIT.match(c) for c in head[: head.index(
        fakehosts.start_of("sparkrig-head"))])  # fmt: skip


def test_an_upgrade_keeps_the_old_layout_programs_a_rollback_may_start_again(monkeypatch):
    """The previous release's rank unit, put back by a rollback, may be one from before the host
    package (running bin/sparkrig-prep and bin/sparkrig-pair): while the release changes, the
    old programs stay; the first run without a release change removes them."""
    old = old_layout_programs()
    converge_state(**{n: {"files": old} for n in ("spark-a", "spark-b")})
    r = apply(monkeypatch, *UPGRADE)
    assert r.exit_code == 0, r.output
    for name in (HEAD, WORKER):
        assert any(op.endswith(LEGACY_OP) for op in r.host_ops[name])
        assert not [c for c in r.commands[name] if c.startswith("rm -f") and c[6:] in old], name


# --- a stack change is a release change (docs/stacks.md) ------------------------------------

STACK_ENV = "SPARKRIG_TEST_STACK"


def another_stack(monkeypatch, **fields) -> tuple[str, ...]:
    """A test-only stack beside vllm-nvfp4 (tests/teststacks.py): the same weights pins (the
    lockfiles in tests/plan allow them), its own flag and env; the inventory pins the image. The
    ``--data`` that selects it. ``fields`` override the declaration."""
    from sparkrig.stacks.vllm_nvfp4 import STACK as NVFP4
    from tests import teststacks

    teststacks.register(
        monkeypatch,
        "test-other",
        model=NVFP4.model,
        drafter=NVFP4.drafter,
        env={**NVFP4.env, STACK_ENV: "other"},
        serve_flags=(*NVFP4.serve_flags, "--test-other-flag"),
        **fields,
    )
    return ("--data", "stack=test-other")


def test_a_stack_change_is_a_release_change_kept_gated_and_recorded(monkeypatch):
    converge_state()
    r = apply(monkeypatch, *another_stack(monkeypatch))
    assert r.exit_code == 0, r.output
    assert "release changes (stack vllm-nvfp4, image" in r.output
    assert "-> stack test-other, image" in r.output
    assert position(r, KEEP_OP) < position(r, "Install the rank unit")
    for name, s in settings().items():
        kept = [c for c in r.commands[name] if fakehosts.KEEP.search(c)]
        assert len(kept) == 1, name
        for path in release_files(s):  # the unit, the lockfiles and the env file
            assert f"cp -p {path} {path}.prev" in kept[0]
        assert "cp -p /etc/sparkrig/rank.env /etc/sparkrig/rank.env.prev" in kept[0]
        unit = r.uploads[name][f"/etc/systemd/system/{s.unit_name}.service"].decode()
        assert "--test-other-flag" in unit
        assert f"{STACK_ENV}=other" in r.uploads[name]["/etc/sparkrig/rank.env"].decode()
        # the gates passed: the record holds the new stack's release, then the previous one
        assert [x.stack for x in uploaded_record(r, name)] == ["test-other", "vllm-nvfp4"]


def test_a_stack_change_that_fails_its_gates_restores_the_previous_stack(monkeypatch):
    converge_state()
    failing_gates()
    r = apply(monkeypatch, *another_stack(monkeypatch))
    assert r.exit_code != 0
    assert re.search(r"upgrade failed \(stack vllm-nvfp4, .* -> stack test-other, ", r.output)
    assert "Rolled back: the previous release (stack vllm-nvfp4, image" in r.output
    for name, s in settings().items():
        restored = [c for c in r.commands[name] if fakehosts.RESTORE.search(c)]
        assert len(restored) == 1, name
        for path in release_files(s):
            assert f"cp -p {path}.prev {path}" in restored[0]
        assert uploaded_record(r, name) == ()  # nothing recorded: the previous stack serves


ANSI = re.compile(r"\x1b\[[0-9;]*m")


def test_dry_diff_of_a_stack_change_shows_every_file_that_changes(monkeypatch):
    selected = another_stack(monkeypatch)
    converge_state()
    dry = run(["--dry", "--diff", *selected, INVENTORY, "deploy.py"], monkeypatch)
    assert dry.exit_code == 0, dry.output
    shown = set(re.findall(r"Will (?:modify|create) (/\S+)", ANSI.sub("", dry.output)))
    converge_state()
    applied = apply(monkeypatch, *selected)
    assert applied.exit_code == 0, applied.output
    record = record_path(next(iter(settings().values())).knobs.config_dir)
    written = {path for uploads in applied.uploads.values() for path in uploads if path != record}
    assert written and written <= shown, sorted(written - shown)
    assert {"/etc/sparkrig/rank.env", "/etc/systemd/system/sparkrig-head.service"} <= shown


RESTART_STOP = "Stop every rank for an ordered pair restart"


@pytest.mark.parametrize("order", ["head-first", "workers-first"])
def test_a_stack_switch_stops_the_ranks_in_the_stacks_stop_order(monkeypatch, order):
    """A stack that stops one side first (Entrpi: "always head down first"; sfxnz's stop.sh):
    the ordered restart stops that side's rank, and only after it returned the other side's, in
    two operations every host has. vllm-nvfp4 (together) keeps its one operation."""
    converge_state()
    r = apply(monkeypatch, *another_stack(monkeypatch, stop_order=order))
    assert r.exit_code == 0, r.output
    first, then = ("the head", "the workers")[:: 1 if order == "head-first" else -1]
    one, two = (
        position(r, f"{RESTART_STOP}: {first} first"),
        position(r, f"{RESTART_STOP}: then {then}"),
    )
    assert one < two < position(r, "Start the worker rank")
    assert not [op for op in r.op_order if op.endswith(RESTART_STOP)]
    stops = {name: f"systemctl stop {s.unit_name}.service" for name, s in settings().items()}
    for name, stop in stops.items():
        assert stop in r.commands[name], name
    # the first side's stop is that side's only: the other side's stop comes in the second one
    acted = {n: [op for op in r.changed_ops.get(n, []) if RESTART_STOP in op] for n in stops}
    head_side, worker_side = (one, two) if order == "head-first" else (two, one)
    assert acted[HEAD] and all(op.endswith(r.op_order[head_side]) for op in acted[HEAD])
    assert acted[WORKER] and all(op.endswith(r.op_order[worker_side]) for op in acted[WORKER])


def test_the_default_stack_stops_every_rank_together_in_one_operation(monkeypatch):
    converge_state()
    r = apply(monkeypatch, *UPGRADE)
    assert r.exit_code == 0, r.output
    assert position(r, RESTART_STOP) < position(r, "Start the worker rank")
    assert not [op for op in r.op_order if "first" in op and RESTART_STOP in op]


def test_a_dry_run_of_a_bare_pair_says_no_upgrade_failed(monkeypatch):
    """--dry prepares the rollback's conditional operations too: with nothing failed, the last
    one must not tell a reviewer that an upgrade failed and was rolled back (the ring lab's first
    --dry, and every --dry of a bare pair, printed it)."""
    r = run(["--dry", "tests/plan/inventory_bare.py", "deploy.py"], monkeypatch)
    assert r.exit_code == 0, r.output
    # (the operation's own name is in the table: "Fail the run: the upgrade failed and ...")
    assert "upgrade failed (" not in r.output and "Rolled back:" not in r.output
