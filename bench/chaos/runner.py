"""One campaign on the lab: boot it, converge, check the converged pair is whole, then per drawn
fault: apply it, run the operator's command once (an interrupted run: once more), check the pair
is whole, undo what the fault left outside the deploy's care, and restore a whole pair before
the next fault (a recovery run, outside the verdict). A pair that one recovery run cannot make
whole again stops the campaign: the faults not run count against healed/total."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from bench.chaos import checks, pyinfra_output
from bench.chaos.catalogue import BY_KIND, KILL_RUN, REBOOT, SELF_HEAL, SSH_CUT, Fault, fill
from bench.chaos.draw import CUT_AFTER_S, KILL_AFTER_S, Draw, moment_within
from bench.chaos.report import HEALED, NOT_HEALED, REFUSED, Campaign, FaultResult
from lab import REPO
from lab.guest import Guest, guests, lab_cli, lab_state, serving

DEPLOY = ["pyinfra", "-y", checks.INVENTORY, "deploy.py"]
RUN_TIMEOUT_S = 2400  # one run, however it ends (a cold first converge takes ~20 min on TCG)
BOOT_TIMEOUT_S = 600  # a rebooted guest back on SSH
SETTLE_S = 600  # after the run: how long the pair may take to answer completions


@dataclass
class Run:
    rc: int
    seconds: float
    output: str
    interrupted: str = ""  # "SIGKILL at 37 s", "SSH to lab-head cut at 12 s for 40 s", "timed out"

    def record(self) -> dict[str, Any]:
        changes = pyinfra_output.parse(self.output)
        return {"rc": self.rc, "seconds": round(self.seconds, 1), "interrupted": self.interrupted,
                "changed": changes.changed, "failed": changes.failed}  # fmt: skip


@dataclass
class Lab:
    guests: list[Guest]
    weights: str  # the model checkout every rank serves from
    values: dict[str, dict[str, str]] = field(default_factory=dict)  # per guest: placeholders

    @property
    def head(self) -> Guest:
        return self.guests[0]

    def node(self, role: str) -> Guest:
        """``head`` or ``worker`` (the first worker)."""
        return self.head if role == "head" else self.guests[1]


def placeholders(
    state: dict[str, Any] | None, stack: str = ""
) -> tuple[str, dict[str, dict[str, str]]]:
    """The weights directory and, per guest role, every ``{placeholder}`` the catalogue uses.
    Without a lab (``--list``, ``--plan``) the lab's fixed layout fills them, with the two
    values only a running lab knows left as ``<...>``. ``stack``: the one the runs deploy
    (``--data stack=``), whose pins the lab keeps in ``stack_pins``."""
    knobs = (state or {}).get("knobs", {})
    knobs = {**knobs, **(state or {}).get("stack_pins", {}).get(stack, {})}
    weights = f"/var/lib/sparkrig/models/model-{knobs.get('model_revision', '<model_revision>')}"
    hosts = (state or {}).get("hosts") or [
        {"role": "head", "index": 1, "fabric_interface": "enp1s0f1np1",
         "fabric_address": "10.200.0.1/24", "roce_device": "rxe0"},
        {"role": "worker", "index": 2, "fabric_interface": "enp1s0f1np1",
         "fabric_address": "10.200.0.2/24", "roce_device": "rxe0"},
    ]  # fmt: skip
    values: dict[str, dict[str, str]] = {}
    for h in hosts[:2]:
        rank = int(h["index"]) - 1
        values[h["role"]] = {
            "iface": h["fabric_interface"],
            "address": h["fabric_address"],
            "idx": str(h["index"]),
            "rdma": h["roce_device"],
            "container": f"sparkrig-rank{rank}",
            "unit": "sparkrig-head" if h["role"] == "head" else "sparkrig-worker",
            "weights": weights,
            "lock": checks.LOCK,
            "base_image": (state or {}).get("image") or "<base image: state.json image>",
            "patched_repo": "sparkrig/vllm-glm53",
        }
    return weights, values


def draw_values(
    lab_values: dict[str, dict[str, str]], draw: Draw, role: str | None = None
) -> dict[str, str]:
    """The placeholders of ``draw`` on its node (or on ``role``'s)."""
    values = {**lab_values[role or draw.node], **draw.params}
    if "frac" in draw.params:
        values["permille"] = str(int(float(draw.params["frac"]) * 1000))
    return values


def command_of(fault: Fault, values: dict[str, str]) -> str:
    return fill(fault.apply, values)


class Runner:
    def __init__(
        self, out: Path, settle_s: float = SETTLE_S, echo: Callable[[str], None] = print,
        data: Sequence[str] = (),
    ) -> None:  # fmt: skip
        self.out = out
        self.settle_s = settle_s
        self.echo = echo
        self.data = list(data)  # the operator's --data (e.g. stack=tensorfold), every run the same
        self.stack = next((kv.split("=", 1)[1] for kv in data if kv.startswith("stack=")), "")

    @property
    def command(self) -> list[str]:
        """The operator's command: ``pyinfra -y lab/inventory.py deploy.py`` and their --data."""
        return [*DEPLOY, *checks.data_args(self.data)]

    # --- the lab ---------------------------------------------------------------------------

    def boot_and_converge(self, up: bool, converge: bool) -> None:
        if up:
            self.echo("lab: python3 -m lab up")
            lab_cli("up")
        if converge:
            self.echo(f"converge: {' '.join(self.command)}")
            with open(self.out / "00-converge.log", "w") as log:
                run = self.deploy(log)
            if run.rc != 0:
                raise SystemExit(f"the converge failed (rc {run.rc}): {self.out}/00-converge.log")

    def lab(self) -> Lab:
        state = lab_state()
        weights, values = placeholders(state, self.stack)
        return Lab(guests(state), weights, values)

    # --- the operator's command ------------------------------------------------------------

    def deploy(
        self,
        log: IO[str],
        at: float | None = None,
        event: Callable[[subprocess.Popen[str]], str] | None = None,
    ) -> Run:
        """``pyinfra -y lab/inventory.py deploy.py``, its output into ``log``; ``event`` is
        called ``at`` seconds into the run if it still runs then, and says what it did."""
        log.write(f"\n$ {' '.join(self.command)}\n")
        log.flush()
        start = time.monotonic()
        proc = subprocess.Popen(
            self.command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, "PYINFRA_PROGRESS": "off"}, start_new_session=True,
        )  # fmt: skip
        lines: list[str] = []
        reader = threading.Thread(target=_pump, args=(proc, lines, log), daemon=True)
        reader.start()
        interrupted = ""
        if at is not None and event is not None:
            try:
                proc.wait(timeout=at)
            except subprocess.TimeoutExpired:
                interrupted = event(proc)
        try:
            proc.wait(timeout=max(1.0, RUN_TIMEOUT_S - (time.monotonic() - start)))
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            proc.wait()
            interrupted = interrupted or f"timed out after {RUN_TIMEOUT_S} s"
        reader.join(timeout=30)
        seconds = time.monotonic() - start
        log.write(f"# rc {proc.returncode} in {seconds:.0f} s {interrupted}\n")
        log.flush()
        self.echo(f"    run: rc {proc.returncode} in {seconds:.0f} s {interrupted}".rstrip())
        return Run(proc.returncode, seconds, "".join(lines), interrupted)

    # --- one fault -------------------------------------------------------------------------

    def one(self, lab: Lab, draw: Draw) -> FaultResult:
        fault = draw.fault
        target = lab.node(draw.node)
        values = draw_values(lab.values, draw)
        path = self.out / f"{draw.index:02d}-{draw.kind}.log"
        result = FaultResult(draw.index, draw.kind, target.name, dict(draw.params), log=str(path))
        self.echo(draw.describe())
        with open(path, "w") as log:
            log.write(f"# {draw.describe()}\n# {fault.summary}\n")
            before = checks.units(lab.guests)
            runs, t0 = self.inflict(lab, draw, log)
            result.runs = [r.record() for r in runs]
            last = runs[-1]
            changes = pyinfra_output.parse(last.output)
            result.changed = changes.summary()
            if fault.refused:
                result.problems = self.refusal(fault, last, changes)
                refused = checks.units(lab.guests)  # the refused run may restart nothing
                result.problems += checks.restarted(before, refused, (), (), target.name)
                self.undo(target, fault, values, log)
                self.settle(lab, log)
                whole = checks.whole(lab.guests, lab.weights, refused, data=self.data)
                if whole.problems and not result.problems:  # the operator's run after the fix
                    log.write("# not whole once the cause is undone: the operator runs again\n")
                    result.runs.append(self.deploy(log).record())
                    self.settle(lab, log)
                    whole = checks.whole(lab.guests, lab.weights, refused, fault.restarts,
                                         fault.restarts_on_target, target.name,
                                         self.data)  # fmt: skip
                result.problems += whole.problems
                result.verdict = REFUSED if not result.problems else NOT_HEALED
            else:
                served = self.settle(lab, log)
                if served is not None:
                    result.time_to_serving_s = round(served - t0, 1)
                whole = checks.whole(lab.guests, lab.weights, before, fault.restarts,
                                     fault.restarts_on_target, target.name,
                                     self.data)  # fmt: skip
                result.problems = [f"the run failed (rc {last.rc})"] if last.rc else []
                result.problems += whole.problems
                result.verdict = HEALED if not result.problems else NOT_HEALED
                self.undo(target, fault, values, log)
            log.write(f"# --dry after the check:\n{whole.dry_output[-3000:]}\n")
            log.write(
                f"# verdict: {result.verdict}\n" + "".join(f"#   {p}\n" for p in result.problems)
            )
        self.echo(
            f"    {result.verdict}" + (f": {'; '.join(result.problems)}" if result.problems else "")
        )
        return result

    def inflict(self, lab: Lab, draw: Draw, log: IO[str]) -> tuple[list[Run], float]:
        """Apply the fault and run the operator's command as its mode says: every run made, and
        when the fault these runs heal was applied (monotonic clock)."""
        fault, target, values = draw.fault, lab.node(draw.node), draw_values(lab.values, draw)
        if fault.mode == KILL_RUN:

            def kill(proc: subprocess.Popen[str], at: float) -> str:
                _kill_group(proc)
                return f"SIGKILL at {at:.0f} s"

            runs, since = self.interrupted(lab, draw, log, "kill", KILL_AFTER_S, kill)
            return runs + [self.deploy(log)], since
        if fault.mode == SSH_CUT:
            cut_for = float(values["cut_for_s"])

            def cut(proc: subprocess.Popen[str], at: float) -> str:
                self.apply(target, command_of(fault, values), log, check=False)
                return f"SSH to {target.name} cut at {at:.0f} s for {cut_for:.0f} s"

            runs, since = self.interrupted(lab, draw, log, "cut", CUT_AFTER_S, cut)
            self.wait_ssh(target, cut_for + BOOT_TIMEOUT_S, log)  # then the operator runs again
            return runs + [self.deploy(log)], since
        since = time.monotonic()
        if fault.mode == REBOOT:
            boot = self.boot_id(target)
            self.apply(target, command_of(fault, values), log, check=False)
            self.wait_ssh(
                target, BOOT_TIMEOUT_S, log, lambda: self.boot_id(target) not in ("", boot)
            )
            return [self.deploy(log)], since
        self.apply(target, command_of(fault, values), log)
        if fault.mode == SELF_HEAL:  # the helpers' business (the watchdog): no run until it serves
            healed = self.settle(lab, log)
            took = "not within the settle time" if healed is None else f"{healed - since:.0f} s"
            log.write(f"# serving again by itself: {took}; then the operator's run\n")
        return [self.deploy(log)], since

    def interrupted(
        self,
        lab: Lab,
        draw: Draw,
        log: IO[str],
        what: str,
        bounds: tuple[int, int],
        event: Callable[[subprocess.Popen[str], float], str],
    ) -> tuple[list[Run], float]:
        """The drawn work applied and the run interrupted by ``event(proc, at)`` at the drawn moment
        (the caller runs again). A run that ended before its moment interrupted nothing: the work
        is applied again and that run interrupted at the same point of the length the first had
        (``moment_within``), so the fault always lands inside a run with work to do."""
        at = float(draw.params[f"{what}_after_s"])
        since = self.apply_work(lab, draw, log)
        first = self.deploy(log, at=at, event=lambda proc: event(proc, at))
        runs = [first]
        if not first.interrupted:
            first.interrupted = f"ended in {first.seconds:.0f} s, before the {what} at {at:.0f} s"
            again = moment_within(at, bounds, first.seconds)
            log.write(f"# the work again, the {what} at {again:.0f} s of the run\n")
            since = self.apply_work(lab, draw, log)
            second = self.deploy(log, at=again, event=lambda proc: event(proc, again))
            second.interrupted = second.interrupted or f"ended before the {what} at {again:.0f} s"
            runs.append(second)
        return runs, since

    def apply_work(self, lab: Lab, draw: Draw, log: IO[str]) -> float:
        """Apply the work a killed or cut run has to do (on its own node when it has one);
        when it was applied."""
        values = draw_values(lab.values, draw)
        work = BY_KIND[values["work"]]
        role = draw.node if work.target == "any" else work.target
        since = time.monotonic()
        self.apply(lab.node(role), command_of(work, draw_values(lab.values, draw, role)), log)
        return since

    def refusal(self, fault: Fault, run: Run, changes: pyinfra_output.RunChanges) -> list[str]:
        """A refused fault: the run stopped, said why, and changed nothing anywhere."""
        problems = []
        if run.rc == 0:
            problems.append("the run did not refuse (rc 0)")
        if fault.refused not in run.output:
            problems.append(f"the run's output does not say {fault.refused!r}")
        if changes.changed:
            problems.append(f"the refused run changed {changes.summary()}")
        return problems

    # --- helpers ---------------------------------------------------------------------------

    def apply(self, guest: Guest, command: str, log: IO[str], check: bool = True) -> None:
        log.write(f"\n$ [{guest.name}] {command}\n")
        out = guest.run(command, timeout=600)
        log.write(out.stdout + out.stderr + f"# rc {out.returncode}\n")
        log.flush()
        if check and out.returncode != 0:
            raise RuntimeError(f"{guest.name}: the fault did not apply (rc {out.returncode})")

    def undo(self, guest: Guest, fault: Fault, values: dict[str, str], log: IO[str]) -> None:
        if fault.undo:
            self.apply(guest, fill(fault.undo, values), log, check=False)

    def boot_id(self, guest: Guest) -> str:
        try:
            return guest.run("cat /proc/sys/kernel/random/boot_id", timeout=40).stdout.strip()
        except subprocess.TimeoutExpired:
            return ""

    def wait_ssh(
        self, guest: Guest, timeout: float, log: IO[str], ready: Callable[[], bool] | None = None
    ) -> None:
        start = time.monotonic()
        ready = ready or (lambda: self.boot_id(guest) != "")
        while not ready():
            if time.monotonic() - start > timeout:
                raise RuntimeError(f"{guest.name}: no SSH within {timeout:.0f} s")
            time.sleep(5)
        log.write(f"# {guest.name} answers SSH again after {time.monotonic() - start:.0f} s\n")

    def settle(self, lab: Lab, log: IO[str]) -> float | None:
        """Wait (up to settle_s) until the head answers a completion; when it first did."""
        deadline = time.monotonic() + self.settle_s
        while time.monotonic() < deadline:
            if serving(lab.head):
                return time.monotonic()
            time.sleep(5)
        log.write(f"# the head did not answer a completion within {self.settle_s:.0f} s\n")
        return None

    def recover(self, lab: Lab, result: FaultResult) -> list[str]:
        """After a fault that was not healed: one more run; what is still not whole."""
        with open(self.out / f"{result.index:02d}-{result.kind}.recovery.log", "w") as log:
            before = checks.units(lab.guests)
            self.deploy(log)
            self.settle(lab, log)
            problems = checks.whole(
                lab.guests, lab.weights, before, ("sparkrig-*",), data=self.data
            ).problems
            log.write("".join(f"# {p}\n" for p in problems) or "# whole again\n")
        return problems


def _kill_group(proc: subprocess.Popen[str]) -> None:
    """SIGKILL the run's own process group (pyinfra and its ssh children; start_new_session)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:  # it ended meanwhile
        pass


def _pump(proc: subprocess.Popen[str], lines: list[str], log: IO[str]) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line)
        log.write(line)
    log.flush()


def campaign(
    draws: list[Draw], seed: int, only: list[str], out: Path, command: str, up: bool = True,
    converge: bool = True, settle_s: float = SETTLE_S, echo: Callable[[str], None] = print,
    data: Sequence[str] = (),
) -> Campaign:  # fmt: skip
    """Run every draw on the lab; write out/report.json and out/report.md after each fault."""
    out.mkdir(parents=True, exist_ok=True)
    result = Campaign(
        seed, len(draws), only, command, datetime.now(UTC).isoformat(timespec="seconds")
    )
    runner = Runner(out, settle_s, echo, data)
    runner.boot_and_converge(up, converge)
    lab = runner.lab()
    base = checks.whole(lab.guests, lab.weights, checks.units(lab.guests), data=runner.data)
    if base.problems:
        result.stopped = "the converged pair is not whole before any fault: " + "; ".join(
            base.problems
        )
        result.write(out)
        return result
    for draw in draws:
        try:
            fr = runner.one(lab, draw)
        except Exception as e:  # a fault that did not apply, a guest that stopped answering
            fr = FaultResult(draw.index, draw.kind, draw.node, dict(draw.params), NOT_HEALED,
                             [f"the campaign could not run it: {type(e).__name__}: {e}"],
                             log=str(out / f"{draw.index:02d}-{draw.kind}.log"))  # fmt: skip
            echo(f"    {fr.problems[0]}")
        result.results.append(fr)
        result.write(out)
        if not fr.counted:
            try:
                left = runner.recover(lab, fr)
            except Exception as e:
                left = [f"the recovery run could not run: {type(e).__name__}: {e}"]
            if left:
                result.stopped = (f"after fault {draw.index} ({draw.kind}) one recovery run left "
                                  f"the pair not whole: {'; '.join(left)}")  # fmt: skip
                break
    result.write(out)
    return result
