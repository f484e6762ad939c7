"""The README's quick start for two Sparks, run as written: its numbered `pyinfra inventory.py`
commands against fake Sparks that keep the shipped inventory.py's hosts and keys
(tests/plan/inventory_example.py): the review and the deploy on bare nodes, the status on the
nodes the deploy converged."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from tests.plan import fakehosts
from tests.plan.harness import run
from tests.plan.test_plan import ACTION

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = "tests/plan/inventory_example.py"


def commands(text: str) -> list[list[str]]:
    """Each command line in ``text`` that runs pyinfra, as argv (less pyinfra and comments)."""
    lines = re.findall(r"^\s*(pyinfra inventory\.py .+?)\s*$", text, re.M)
    return [shlex.split(line, comments=True)[1:] for line in lines]


def quick_start() -> list[list[str]]:
    text = (ROOT / "README.md").read_text()
    return commands(text.split("## Quick start: two Sparks", 1)[1].split("\n## ", 1)[0])


def as_example(argv: list[str]) -> list[str]:
    return [EXAMPLE if arg == "inventory.py" else arg for arg in argv]


def converge() -> None:
    """The fakes answer as the ranks the deploy converged."""
    fakehosts.STATE.clear()
    for name, s in fakehosts.settings_of(EXAMPLE).items():
        fakehosts.STATE[name.split("/")[1]] = fakehosts.converged(s)


def test_the_quick_start_reviews_deploys_and_reads_the_status():
    assert quick_start() == [
        ["inventory.py", "deploy.py", "--dry", "--diff"],
        ["inventory.py", "deploy.py"],
        ["inventory.py", "status.py"],
    ]


def test_the_shipped_inventory_validates_as_filled():
    settings = fakehosts.settings_of(EXAMPLE)
    head, worker = (settings[f"@fake/{n}"] for n in ("spark-a", "spark-b"))
    assert (head.me.rank, worker.me.rank) == (0, 1)
    assert head.me.fabric_interface == worker.me.fabric_interface == "enp1s0f1np1"
    assert head.me.uplink_interfaces == []  # commented out: one lane over the default route
    assert head.me.address == "spark-a.local"


def test_review_then_deploy_run_as_written_on_bare_sparks(monkeypatch):
    review, deploy, _ = quick_start()
    dry = run(as_example(review), monkeypatch)
    assert dry.exit_code == 0, dry.output
    assert dry.uploads == {}  # a review writes nothing
    assert not [c for cmds in dry.commands.values() for c in cmds if ACTION.search(c)]
    assert set(dry.changed_ops) == {"@fake/spark-a", "@fake/spark-b"}  # and lists what would change
    applied = run(as_example(deploy), monkeypatch, stdin="\n")  # the operator presses enter
    assert applied.exit_code == 0, applied.output
    assert fakehosts.start_of("sparkrig-head") in applied.commands["@fake/spark-a"]
    assert fakehosts.start_of("sparkrig-worker") in applied.commands["@fake/spark-b"]


def test_status_runs_as_written_on_the_converged_pair(monkeypatch):
    *_, status = quick_start()
    converge()
    r = run(as_example(status), monkeypatch, stdin="\n")
    assert r.exit_code == 0, r.output
    assert "rank0 sparkrig-head active/running" in r.output
    assert "rank1 sparkrig-worker active/running" in r.output


def test_the_upgrade_rollback_and_uninstall_commands_run_as_written_on_a_converged_pair(
    monkeypatch,
):
    text = (ROOT / "README.md").read_text()
    later = commands(text.split("## Upgrade and rollback", 1)[1].split("\n## Glossary", 1)[0])
    assert [argv[1] for argv in later] == ["deploy.py"] * 3 + ["uninstall.py"] * 2, later
    for argv in later:
        converge()
        r = run(as_example(argv), monkeypatch, stdin="\n")
        assert r.exit_code == 0, f"{shlex.join(argv)}:\n{r.output}"
