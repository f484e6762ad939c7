"""bench/chaos's runner without the lab: fake guests that record commands, a stand-in for the
operator's command (a real process printing pyinfra's lines), the checks answered by the test.
What each mode does, in which order, and how a verdict follows from what the run and the checks
said."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from bench.chaos import checks, runner
from bench.chaos.draw import CUT_AFTER_S, Draw
from bench.chaos.report import HEALED, NOT_HEALED, REFUSED


@dataclass
class FakeGuest:
    name: str
    role: str
    commands: list[str] = field(default_factory=list)
    boots: int = 0

    @property
    def container(self) -> str:
        return "sparkrig-rank0" if self.role == "head" else "sparkrig-rank1"

    @property
    def rank_unit(self) -> str:
        return f"sparkrig-{self.role}"

    def run(self, command: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        self.commands.append(command)
        if command == "cat /proc/sys/kernel/random/boot_id":
            return subprocess.CompletedProcess(command, 0, f"boot-{self.boots}\n", "")
        if "systemctl reboot" in command:
            self.boots += 1
        return subprocess.CompletedProcess(command, 0, "", "")


def stand_in(
    lines: list[str], rc: int = 0, sleeps: tuple[float, ...] = (), count: Path | None = None
) -> list[str]:
    """An operator's command that prints ``lines`` (flushed), sleeps, and exits ``rc``: its
    n-th run (counted in the file ``count``) sleeps ``sleeps[n]``, any later run not at all."""
    text = "\n".join(lines)
    if count is None:
        return [sys.executable, "-c", f"import sys; print({text!r}, flush=True); sys.exit({rc})"]
    code = (
        f"import os, sys, time; print({text!r}, flush=True); c = {str(count)!r}; n = 0\n"
        f"if os.path.exists(c):\n    n = int(open(c).read())\n"
        f"open(c, 'w').write(str(n + 1)); s = {list(sleeps)!r}\n"
        f"time.sleep(s[n] if n < len(s) else 0); sys.exit({rc})"
    )
    return [sys.executable, "-c", code]


@pytest.fixture
def lab(monkeypatch, tmp_path):
    guests = [FakeGuest("lab-head", "head"), FakeGuest("lab-worker1", "worker")]
    verdicts: list[list[str]] = []  # what each whole-pair check finds, in order; then whole

    monkeypatch.setattr(checks, "units", lambda gs: {("lab-head", "sparkrig-head"): ("active",
                                                     "a", "1")})  # fmt: skip
    monkeypatch.setattr(
        checks, "whole",
        lambda *a, **k: checks.Whole(verdicts.pop(0) if verdicts else [], "dry output"),
    )  # fmt: skip
    monkeypatch.setattr(runner, "serving", lambda head: True)
    _, values = runner.placeholders(None)
    lab = runner.Lab(guests, "/var/lib/sparkrig/models/model-x", values)  # type: ignore[arg-type]
    return lab, verdicts, runner.Runner(tmp_path, settle_s=5, echo=lambda line: None)


CHANGED = ["--> Starting operation: tasks/fabric.py | Apply the fabric netplan",
           "    [lab-worker1] Success", "    [lab-head] No changes"]  # fmt: skip


def test_a_plain_fault_is_applied_on_its_node_run_once_and_healed_when_whole(lab, monkeypatch):
    fake, verdicts, run = lab
    monkeypatch.setattr(runner, "DEPLOY", stand_in(CHANGED))
    r = run.one(fake, Draw(1, "fabric-mtu-reset", "worker"))
    assert fake.guests[1].commands == ["ip link set dev enp1s0f1np1 mtu 1500"]
    assert fake.guests[0].commands == []
    assert (r.verdict, len(r.runs), r.runs[0]["rc"]) == (HEALED, 1, 0)
    assert r.changed == "lab-worker1: Apply the fabric netplan"
    assert r.time_to_serving_s is not None
    assert "$ [lab-worker1] ip link set dev enp1s0f1np1 mtu 1500" in Path(r.log).read_text()

    verdicts.append(["lab-worker1: fabric MTU 1500, want 9000"])
    r = run.one(fake, Draw(2, "container-paused", "head"))
    assert (r.verdict, r.problems) == (NOT_HEALED, ["lab-worker1: fabric MTU 1500, want 9000"])
    assert fake.guests[0].commands == [  # the undo runs after the verdict
        "docker pause sparkrig-rank0",
        "docker unpause sparkrig-rank0 2>/dev/null || true",
    ]


def test_a_killed_run_is_sigkilled_at_its_moment_and_run_again(lab, monkeypatch, tmp_path):
    fake, _, run = lab
    # the first run would take 120 s, the run again none
    monkeypatch.setattr(runner, "DEPLOY", stand_in(CHANGED, sleeps=(120,), count=tmp_path / "n"))
    draw = Draw(3, "control-killed", "worker", {"work": "owned-env-edited", "frac": "0.5",
                                                 "kill_after_s": "1"})  # fmt: skip
    r = run.one(fake, draw)
    assert fake.guests[1].commands == [
        "sed -i 's/^NCCL_DEBUG=.*/NCCL_DEBUG=INFO/' /etc/sparkrig/rank.env"
    ]
    assert [(x["rc"], x["interrupted"]) for x in r.runs] == [(-9, "SIGKILL at 1 s"), (0, "")]
    assert r.runs[0]["seconds"] < 60  # killed, not ended


def test_a_run_that_ends_before_its_moment_is_given_the_work_again_and_killed_within_it(
    lab, monkeypatch, tmp_path
):
    fake, _, run = lab
    # the first run ends at once, before the drawn kill at 200 s; the one given the work again
    # would take 120 s and is killed at 200/241 of the first 80% of the first run's length
    monkeypatch.setattr(runner, "DEPLOY", stand_in(CHANGED, sleeps=(2, 120), count=tmp_path / "n"))
    # work that belongs to one node (the head's weights) goes there, whatever node was drawn
    draw = Draw(4, "control-killed", "worker", {"work": "weights-byte-flipped-head",
                                                 "frac": "0.5", "kill_after_s": "200"})  # fmt: skip
    r = run.one(fake, draw)
    head = fake.guests[0].commands
    assert len(head) == 2 and all("python3 -c" in c and "0.5" in c for c in head)
    assert fake.guests[1].commands == []
    first, killed, again = r.runs
    # how long the first run took is this machine's business (2 s of sleep and a Python start);
    # the record keeps it to 0.1 s, so each text the runner made of it is one of two
    took = (first["seconds"] - 0.05, first["seconds"] + 0.05)
    assert 2 <= took[1] and first["interrupted"] in {
        f"ended in {s:.0f} s, before the kill at 200 s" for s in took
    }, first
    assert first["changed"] == {"lab-worker1": ["tasks/fabric.py | Apply the fabric netplan"]}
    moments = {f"SIGKILL at {runner.moment_within(200, (5, 240), s):.0f} s" for s in took}
    assert killed["rc"] == -9 and killed["interrupted"] in moments, (killed, moments)
    assert killed["seconds"] < 60
    assert (again["rc"], again["interrupted"]) == (0, "")
    assert runner.moment_within(200, (5, 240), 2.4) == pytest.approx(2.4 * 0.8 * 200 / 241)


def test_a_moment_moved_into_a_run_again_lands_in_a_somewhat_quicker_one():
    # seed 6031's fault 33: a cut drawn at 167 s, the first run ended in 160 s, the one given the
    # work again in 143 s: the cut must fall inside it
    assert runner.moment_within(167, CUT_AFTER_S, 160.3) < 143.3
    assert runner.moment_within(5, CUT_AFTER_S, 160.3) > 0


def test_a_cut_run_cuts_the_nodes_ssh_mid_run_waits_for_it_and_runs_again(
    lab, monkeypatch, tmp_path
):
    fake, _, run = lab
    monkeypatch.setattr(runner, "DEPLOY", stand_in(CHANGED, sleeps=(3,), count=tmp_path / "n"))
    draw = Draw(4, "ssh-cut", "worker", {"work": "fabric-mtu-reset", "frac": "0.5",
                                         "cut_after_s": "1", "cut_for_s": "20"})  # fmt: skip
    r = run.one(fake, draw)
    worker = fake.guests[1].commands
    assert worker[0] == "ip link set dev enp1s0f1np1 mtu 1500"
    assert "systemd-run --unit=chaos-ssh-cut" in worker[1] and "sleep 20;" in worker[1]
    assert worker[2] == "cat /proc/sys/kernel/random/boot_id"  # answers SSH again
    assert r.runs[0]["interrupted"] == "SSH to lab-worker1 cut at 1 s for 20 s"
    assert len(r.runs) == 2 and r.verdict == HEALED
    # the operator runs again once the node answers SSH, not while it is cut
    log = Path(r.log).read_text()
    assert log.index("# lab-worker1 answers SSH again") < log.rindex(f"$ {runner.DEPLOY[0]}")


def test_a_run_that_fails_heals_nothing_whatever_the_pair_looks_like_after_it(lab, monkeypatch):
    fake, _, run = lab
    monkeypatch.setattr(runner, "DEPLOY", stand_in(CHANGED, rc=1))
    r = run.one(fake, Draw(1, "fabric-mtu-reset", "worker"))  # the checks find the pair whole
    assert (r.verdict, r.problems) == (NOT_HEALED, ["the run failed (rc 1)"])


def test_a_reboot_waits_for_a_new_boot_before_the_run(lab, monkeypatch):
    fake, _, run = lab
    monkeypatch.setattr(runner, "DEPLOY", stand_in(CHANGED))
    r = run.one(fake, Draw(5, "node-rebooted", "head"))
    head = fake.guests[0].commands
    assert head[0] == "cat /proc/sys/kernel/random/boot_id"
    assert "systemctl reboot" in head[1]
    assert head[2] == "cat /proc/sys/kernel/random/boot_id" and fake.guests[0].boots == 1
    assert r.verdict == HEALED


REFUSAL = ["--> Starting operation: tasks/preflight.py | Refuse a host that fails preflight",
           "    [lab-head] No changes",
           "    [lab-worker1] 0.0 GiB free under /var/lib/sparkrig/models, need 1 GiB",
           "    [lab-worker1] Error: executed 0 commands"]  # fmt: skip


def test_a_refused_fault_counts_only_when_the_run_refused_said_why_and_changed_nothing(
    lab, monkeypatch
):
    fake, verdicts, run = lab
    monkeypatch.setattr(runner, "DEPLOY", stand_in(REFUSAL, rc=1))
    r = run.one(fake, Draw(6, "disk-full", "worker", {"frac": "0.5"}))
    assert (r.verdict, r.problems, len(r.runs)) == (REFUSED, [], 1)
    assert fake.guests[1].commands[-1] == "rm -f /var/lib/sparkrig/chaos-fill " \
        "/var/lib/sparkrig/chaos-fill.tail"  # fmt: skip

    # not whole once the cause is undone: the operator's one more run, then whole
    verdicts.append(["--dry plans lab-worker1: Fetch the weights"])
    r = run.one(fake, Draw(7, "disk-full", "worker", {"frac": "0.5"}))
    assert (r.verdict, len(r.runs)) == (REFUSED, 2)

    monkeypatch.setattr(runner, "DEPLOY", stand_in(CHANGED, rc=1))  # refused, but changed
    r = run.one(fake, Draw(8, "fabric-claimed-nm", "head"))
    assert r.verdict == NOT_HEALED
    assert r.problems == [
        "the run's output does not say \"is also claimed by the NetworkManager profile "
        "'cx7-port1'\"",
        "the refused run changed lab-worker1: Apply the fabric netplan",
    ]

    monkeypatch.setattr(runner, "DEPLOY", stand_in(REFUSAL, rc=0))
    r = run.one(fake, Draw(9, "disk-full", "head", {"frac": "0.5"}))
    assert r.problems == ["the run did not refuse (rc 0)"]


def test_the_campaign_stops_when_a_recovery_run_leaves_the_pair_broken(lab, monkeypatch):
    fake, verdicts, _ = lab
    monkeypatch.setattr(runner, "DEPLOY", stand_in(CHANGED))
    monkeypatch.setattr(runner, "lab_state", lambda: {})
    monkeypatch.setattr(runner.Runner, "lab", lambda self: fake)
    draws = [Draw(1, "swappiness-drift", "head"), Draw(2, "docker-stopped", "worker"),
             Draw(3, "docker-restarted", "worker")]  # fmt: skip
    # baseline whole; fault 1 whole; fault 2 not, nor after its recovery run
    verdicts += [[], [], ["lab-worker1: sparkrig-worker is inactive"], ["still inactive"]]
    result = runner.campaign(draws, 5, [], lab[2].out, "cmd", up=False, converge=False,
                             settle_s=5, echo=lambda line: None)  # fmt: skip
    assert [r.verdict for r in result.results] == [HEALED, NOT_HEALED]
    assert (result.healed(), result.total()) == (1, 3)
    assert "after fault 2 (docker-stopped)" in result.stopped
    assert "**healed 1/3**" in (lab[2].out / "report.md").read_text()


def test_a_campaign_on_another_stack_passes_its_data_and_reads_that_stacks_weights(tmp_path):
    state = {
        "knobs": {"model_revision": "default0"},
        "stack_pins": {"tensorfold": {"model_revision": "tf1234"}},
    }
    weights, _ = runner.placeholders(state, "tensorfold")
    assert weights == "/var/lib/sparkrig/models/model-tf1234"
    assert runner.placeholders(state)[0] == "/var/lib/sparkrig/models/model-default0"
    run = runner.Runner(tmp_path, data=["stack=tensorfold"], echo=lambda line: None)
    assert run.command[-2:] == ["--data", "stack=tensorfold"] and run.stack == "tensorfold"
