"""Plans through the real CLI against @fake hosts: order, idempotence, --limit, bad input."""

from __future__ import annotations

import pytest

from tests.plan import fakehosts
from tests.plan.harness import Run, run

HEAD, WORKER = "@fake/spark-a", "@fake/spark-b"
MODES = {"/etc/netplan/60-sparkrig-fabric.yaml": "600"}
MODES |= {f"/opt/sparkrig/bin/sparkrig-{p}": "755" for p in ("prep", "pair")}
MODES["/opt/sparkrig/sparkrig_gate.py"] = "755"
MODES["/opt/sparkrig/bin/sparkrig-fetch"] = "755"
MODES["/opt/sparkrig/bin/sparkrig-restart-pair"] = "755"
MODES["/etc/sparkrig/pair-token"] = "600"
UNITS = {
    HEAD: ["sparkrig-head.service", "sparkrig-pair.service"],
    WORKER: ["sparkrig-worker.service", "sparkrig-pair.service", "sparkrig-agent.service"],
}
IPS = {HEAD: "192.168.100.10", WORKER: "192.168.100.11"}


@pytest.fixture(autouse=True)
def _clean_state():
    fakehosts.STATE.clear()
    yield
    fakehosts.STATE.clear()


def apply(monkeypatch, *extra: str, inventory: str = "tests/plan/inventory_state.py") -> Run:
    return run(["-y", *extra, inventory, "deploy.py"], monkeypatch)


def converge_state(monkeypatch, **overrides) -> dict[str, dict[str, bytes]]:
    """Apply to bare hosts, then make the fakes answer as hosts holding what was uploaded."""
    first = apply(monkeypatch)
    assert first.exit_code == 0, first.output
    for name in (HEAD, WORKER):
        short = name.split("/")[1]
        kwargs = {"ip": IPS[name], "modes": MODES, **overrides.get(short, {})}
        fakehosts.STATE[short] = fakehosts.converged(first.uploads[name], UNITS[name], **kwargs)
    return first.uploads


def position(r: Run, name: str) -> int:
    matches = [i for i, op in enumerate(r.op_order) if op.endswith(name)]
    assert matches, f"no operation named {name!r} in {r.op_order}"
    return matches[0]


def test_first_run_starts_worker_then_head_gated_on_state(monkeypatch):
    r = apply(monkeypatch)
    assert r.exit_code == 0, r.output
    start_worker = position(r, "Start the worker rank")
    wait = position(r, "Wait until every worker's container runs")
    start_head = position(r, "Start the head rank")
    assert start_worker < wait < start_head
    assert "systemctl start sparkrig-worker.service" in r.commands[WORKER]
    head = r.commands[HEAD]
    waits = [i for i, c in enumerate(head) if "sparkrig-pair wait" in c]
    assert waits and "192.168.100.11" in head[waits[0]]
    assert waits[0] < head.index("systemctl start sparkrig-head.service")
    assert not any("sparkrig-head" in c for c in r.commands[WORKER])


def test_second_run_with_converged_facts_changes_nothing(monkeypatch):
    converge_state(monkeypatch)
    second = apply(monkeypatch)
    assert second.exit_code == 0, second.output
    assert second.changed_ops == {}, second.changed_ops
    assert second.uploads == {}


def test_limit_worker_plans_nothing_for_the_head(monkeypatch):
    r = apply(monkeypatch, "--limit", "worker")
    assert r.exit_code == 0, r.output
    assert r.commands.get(HEAD, []) == []
    assert HEAD not in r.changed_ops
    assert "systemctl start sparkrig-worker.service" in r.commands[WORKER]


def test_firmware_reset_restores_mtu_and_gid_and_restarts_the_pair_in_order(monkeypatch):
    converge_state(monkeypatch, **{"spark-b": {"gid_index": 5, "mtu": 1500}})
    r = apply(monkeypatch)
    assert r.exit_code == 0, r.output
    worker = r.commands[WORKER]
    assert "netplan apply" in worker and "ip link set dev enp1s0f1np1 mtu 9000 up" in worker
    env = r.uploads[WORKER]["/etc/sparkrig/rank.env"].decode()
    assert "NCCL_IB_GID_INDEX=5\n" in env
    assert "netplan apply" not in r.commands[HEAD]  # the head's fabric was right
    assert position(r, "Stop every rank for an ordered pair restart") < position(
        r, "Start the worker rank"
    )
    assert "systemctl stop sparkrig-head.service" in r.commands[HEAD]
    assert "systemctl stop sparkrig-worker.service" in r.commands[WORKER]
    assert position(r, "Start the worker rank") < position(r, "Start the head rank")


def test_preflight_failure_on_the_worker_stops_everyone_before_any_change(monkeypatch):
    fakehosts.STATE["spark-b"] = {
        'echo "arch=': [
            line if not line.startswith("docker=") else "docker="
            for line in fakehosts.node_report()
        ]
    }
    r = apply(monkeypatch)
    assert r.exit_code != 0
    assert "docker is not installed" in r.output
    for name in (HEAD, WORKER):
        assert r.uploads.get(name, {}) == {}, f"{name} was changed"


@pytest.mark.parametrize(
    ("inventory", "message"),
    [
        ("tests/plan/bad/no_head.py", "group 'head' must hold exactly one host"),
        ("tests/plan/bad/two_heads.py", "group 'head' must hold exactly one host"),
        ("tests/plan/bad/same_ip.py", "fabric_address: 192.168.100.10 is already used"),
        ("tests/plan/bad/no_address.py", "spark-b: fabric_address: missing"),
    ],
)
def test_bad_inventory_sends_no_command_to_any_host(monkeypatch, inventory, message):
    r = run(["-y", inventory, "deploy.py"], monkeypatch)
    assert r.exit_code != 0
    assert message in str(r.exception) + r.output
    assert all(cmds == [] for cmds in r.commands.values()), r.commands


def test_weights_come_over_both_uplinks_to_the_head_then_over_the_fabric(monkeypatch):
    r = apply(monkeypatch)
    assert r.exit_code == 0, r.output
    fetch = [c for c in r.commands[HEAD] if "systemd-run" in c and " fetch " in c]
    assert fetch and "--uplink=enP7s7" in fetch[0] and "--uplink=wlP9s9" in fetch[0]
    assert "--endpoint https://huggingface.co" in fetch[0]
    copy = [c for c in r.commands[WORKER] if "systemd-run" in c and " fetch " in c]
    assert copy and "--base-url http://192.168.100.10:29700/model" in copy[0]
    assert "--uplink=enp1s0f1np1" in copy[0] and "huggingface.co" not in copy[0]
    order = [
        position(r, "Fetch and verify the weights on the head"),
        position(r, "Serve the verified weights to the workers over the fabric"),
        position(r, "Copy and verify the weights from the head over the fabric"),
        position(r, "Stop serving the weights"),
    ]
    assert order == sorted(order)


def test_nccl_smoke_test_runs_workers_first_before_a_pair_start_and_not_when_converged(monkeypatch):
    r = apply(monkeypatch)
    assert r.exit_code == 0, r.output
    steps = [
        "Launch the NCCL smoke test on the workers",
        "Run the NCCL smoke test on the head",
        "Check the NCCL smoke test on the workers",
        "Start the worker rank",
    ]
    assert [position(r, s) for s in steps] == sorted(position(r, s) for s in steps)
    launch = [
        c for c in r.commands[WORKER] if "docker run --detach --name sparkrig-nccl-smoke" in c
    ]
    assert launch and "RANK=1" in launch[0] and "MASTER_ADDR=192.168.100.10" in launch[0]
    assert "--device /dev/infiniband:/dev/infiniband" in launch[0]
    head = [c for c in r.commands[HEAD] if "docker run --rm --name sparkrig-nccl-smoke" in c]
    assert head and "RANK=0" in head[0] and "nccl_smoke.py --timeout 300" in head[0]
    converge_state(monkeypatch)
    again = apply(monkeypatch)
    assert not any("sparkrig-nccl-smoke" in c for cmds in again.commands.values() for c in cmds)


def test_a_host_holding_another_revision_is_not_taken_as_verified(monkeypatch):
    converge_state(monkeypatch)
    for name in ("spark-a", "spark-b"):  # the hosts still hold an older lockfile, all verified
        fakehosts.STATE[name]["sparkrig-fetch state"] = fakehosts.STATE[name][
            "sparkrig-fetch state"
        ].replace("caca4e6a4ebbd66f159d3d2fc256683fd6e27177", "0" * 40)
    r = run(["--dry", "tests/plan/inventory_state.py", "deploy.py"], monkeypatch)
    assert r.exit_code == 0, r.output
    assert "lockfile caca4e6a4ebb not judged on the host yet: up to 2 files" in r.output
    assert "Fetch and verify the weights on the head" in " ".join(r.changed_ops[HEAD])


def test_an_mtu_reset_alone_also_restarts_the_pair(monkeypatch):
    converge_state(monkeypatch, **{"spark-b": {"mtu": 1500}})
    r = apply(monkeypatch)
    assert r.exit_code == 0, r.output
    assert "ip link set dev enp1s0f1np1 mtu 9000 up" in r.commands[WORKER]
    assert "/etc/sparkrig/rank.env" not in r.uploads.get(WORKER, {})  # the GID did not move
    assert "systemctl stop sparkrig-head.service" in r.commands[HEAD]
    assert "systemctl stop sparkrig-worker.service" in r.commands[WORKER]
