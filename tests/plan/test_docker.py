"""Docker as part of the declared state (issue 27): a rank whose docker was stopped
(``systemctl stop docker.socket docker``, an apt upgrade of docker-ce half way, dockerd killed)
is read as "docker not running", not as a node without images, and the run starts docker before
anything that needs it; inside the one state read per host (no command more)."""

from __future__ import annotations

from sparkrig.image import END
from tests.image.fakeimage import MATCH
from tests.plan import fakehosts
from tests.plan.harness import run

INVENTORY = "tests/plan/inventory_state.py"
HEAD, WORKER = "@fake/spark-a", "@fake/spark-b"
START = "Run docker and its socket, enabled"
DAEMON_DOWN = ["ref=", "base=", "patched=", "daemon=unreachable", END]


def docker_stopped_on_the_worker() -> None:
    for name, s in fakehosts.settings_of(INVENTORY).items():
        fakehosts.STATE[name.split("/")[1]] = fakehosts.converged(s)
    fakehosts.inject("spark-b", {**fakehosts.docker_units(running=False), MATCH: DAEMON_DOWN})


def test_docker_stopped_is_read_as_docker_not_running_and_the_plan_starts_it(monkeypatch):
    docker_stopped_on_the_worker()
    r = run(["--dry", INVENTORY, "deploy.py"], monkeypatch)
    assert r.exit_code == 0, r.output
    assert "image on @fake/spark-b: docker not running" in r.output
    assert "@fake/spark-b: base absent" not in r.output
    assert "docker not running (docker.service or docker.socket inactive)" in r.output
    assert [op for op in r.changed_ops[WORKER] if op.endswith(START)] != []
    assert not [op for op in r.changed_ops.get(HEAD, []) if op.endswith(START)]
    reads = [c for c in r.commands[WORKER] if "##SPARKRIG-PART" in c]
    assert len(reads) == 1, "docker's state must come with the one state read"


def test_the_run_starts_docker_and_its_socket_before_any_docker_command(monkeypatch):
    docker_stopped_on_the_worker()
    r = run(["-y", INVENTORY, "deploy.py"], monkeypatch)
    commands = r.commands[WORKER]
    starts = [i for i, c in enumerate(commands) if c.startswith("systemctl start docker.")]
    assert [commands[i] for i in starts] == [
        "systemctl start docker.socket",
        "systemctl start docker.service",
    ], r.output
    first_docker = next(
        i for i, c in enumerate(commands) if "docker " in c and "##SPARKRIG-PART" not in c
    )
    assert starts[-1] < first_docker, commands[first_docker][:120]
    assert not [c for c in r.commands[HEAD] if c.startswith("systemctl start docker")]


def test_a_converged_pair_with_docker_running_plans_no_start(monkeypatch):
    for name, s in fakehosts.settings_of(INVENTORY).items():
        fakehosts.STATE[name.split("/")[1]] = fakehosts.converged(s)
    r = run(["-y", INVENTORY, "deploy.py"], monkeypatch)
    assert r.exit_code == 0, r.output
    assert r.changed_ops == {}, r.changed_ops
