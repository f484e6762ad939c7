"""Worker-before-head rests on every host running the same operations in step: the deploy
refuses the CLI options that would break that, before any command reaches a host."""

from __future__ import annotations

import pytest

from tests.plan import fakehosts
from tests.plan.harness import run

INVENTORY = "tests/plan/inventory_state.py"


@pytest.mark.parametrize(
    ("option", "reason"),
    [
        ("--serial", "--serial runs the hosts one after the other"),
        ("--no-wait", "--no-wait drops the barrier between operations"),
    ],
)
def test_serial_and_no_wait_are_refused_before_any_command(monkeypatch, option, reason):
    r = run(["-y", option, INVENTORY, "deploy.py"], monkeypatch)
    assert r.exit_code != 0
    said = str(r.exception) + r.output
    assert reason in said and "worker-before-head" in said
    assert all(cmds == [] for cmds in r.commands.values()), r.commands


INVENTORIES = {2: INVENTORY, 4: "tests/plan/inventory_4state.py"}


@pytest.mark.parametrize("nodes", sorted(INVENTORIES))
@pytest.mark.parametrize("state", ["first-run", "converged"])
def test_every_host_runs_the_same_operation_sequence(monkeypatch, nodes, state):
    """Operations that act on the head (or the workers) alone still exist on every host, so
    pyinfra's barrier orders them the same way everywhere (what keeps worker-before-head).
    With a Hub token, so the head-only token file is among them."""
    monkeypatch.setenv("HF_TOKEN", "hf_" + "t" * 30)
    inventory = INVENTORIES[nodes]
    if state == "converged":
        for name, s in fakehosts.settings_of(inventory).items():
            fakehosts.STATE[name.split("/")[1]] = fakehosts.converged(s)
    r = run(["--dry", inventory, "deploy.py"], monkeypatch)
    assert r.exit_code == 0, r.output
    assert len(r.host_ops) == nodes
    head = r.host_ops["@fake/spark-a"]
    assert head == r.op_order  # the head has every operation of the run
    assert any(op.endswith("Install the Hub token for a gated repo's fetch") for op in head)
    for name, ops in r.host_ops.items():
        assert ops == head, f"{name}: only there {set(ops) - set(head)}, not {set(head) - set(ops)}"


def test_each_helper_has_operations_of_its_own(monkeypatch):
    """keep_helper_running names its two operations after the helper, so the log tells the
    worker agent, the pair supervisor and the watchdog apart."""
    r = run(["--dry", "--data", "watchdog=True", INVENTORY, "deploy.py"], monkeypatch)
    assert r.exit_code == 0, r.output
    kept = [op for op in r.op_order if op.endswith("enabled and running")]
    restarted = [op for op in r.op_order if op.endswith("after its unit or program changed")]
    for ops in (kept, restarted):
        assert len(ops) == len(set(ops)) == 3, ops
        assert [o for o in ops if "agent" in o] and [o for o in ops if "watchdog" in o], ops


# the rollback's operations that act on one role alone, and where they act
ROLLBACK_ROLE_OPS = {
    "Stand the API front aside for a previous release from before it": "head",
    "Pause the head's supervisor and watchdog during the rollback": "head",
    "Start the worker rank of the previous release": "worker",
    "Wait until every worker of the previous release runs": "head",
    "Start the head rank of the previous release": "head",
    "Wait for the previous release's API to finish booting": "head",
    "Pass the four serving gates on the previous release": "head",
    "Resume the head's supervisor after the rollback": "head",
}


def test_a_rollback_keeps_one_sequence_and_acts_on_each_role_alone(monkeypatch):
    """The upgrade that fails its gates and rolls back (sparkrig/rollback.py) runs on the same
    operation sequence on every host, and its head-only and worker-only operations act there
    alone (the one idiom, on_head/on_workers)."""
    from tests.plan.test_plan import HEAD, WORKER, apply, converge_state
    from tests.plan.test_release import UPGRADE, failing_gates

    converge_state()
    failing_gates()
    r = apply(monkeypatch, *UPGRADE)
    assert r.exit_code != 0 and "Rolled back: the previous release" in r.output, r.output[-2000:]
    assert r.host_ops[HEAD] == r.host_ops[WORKER] == r.op_order
    for op, role in ROLLBACK_ROLE_OPS.items():
        acting, other = (HEAD, WORKER) if role == "head" else (WORKER, HEAD)
        ran = {
            name: [o for o in r.changed_ops.get(name, []) if o.endswith(op)] for name in r.host_ops
        }
        assert ran[acting], f"{op}: not run on the {role}"
        assert not ran[other], f"{op}: run beside the {role}"


@pytest.mark.parametrize("option", ["--serial", "--no-wait"])
def test_the_pyinfra_executable_refuses_serial_and_no_wait(option, tmp_path):
    """Issue 49: the real CLI loads deploy.py in a gevent greenlet where click's context is
    None; the refusal must hold there too, not only in the in-process harness above."""
    import shutil
    import subprocess

    from sparkrig import REPO

    exe = shutil.which("pyinfra")
    assert exe is not None, "pyinfra is not installed (scripts/install-deps.sh)"
    done = subprocess.run(
        [exe, "-y", option, INVENTORY, "deploy.py"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    said = done.stdout + done.stderr
    assert done.returncode != 0, said
    assert "sparkrig refuses this run" in said and option in said, said
