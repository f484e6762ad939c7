"""Worker-before-head rests on every host running the same operations in step: the deploy
refuses the CLI options that would break that, before any command reaches a host."""

from __future__ import annotations

import pytest

from tests.plan import fakehosts
from tests.plan.harness import run

INVENTORY = "tests/plan/inventory_state.py"


@pytest.fixture(autouse=True)
def _clean_state():
    fakehosts.STATE.clear()
    yield
    fakehosts.STATE.clear()


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
    pyinfra's barrier orders them the same way everywhere (what keeps worker-before-head)."""
    inventory = INVENTORIES[nodes]
    if state == "converged":
        for name, s in fakehosts.settings_of(inventory).items():
            fakehosts.STATE[name.split("/")[1]] = fakehosts.converged(s)
    r = run(["--dry", inventory, "deploy.py"], monkeypatch)
    assert r.exit_code == 0, r.output
    assert len(r.host_ops) == nodes
    head = r.host_ops["@fake/spark-a"]
    assert head == r.op_order  # the head has every operation of the run
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
