"""What a run changed, read from pyinfra 3.10's plain output (what the operator sees).

Text rather than ``--json``: a run the campaign SIGKILLs or cuts off mid-way never prints its JSON
document, but every operation it got through is in the text. pyinfra logs, per operation,
``--> Starting operation: <file> | <name> (<args>)`` (pyinfra/api/util.py, log_operation_start)
and then one line per host: ``[<host>] Success`` when it executed commands, ``[<host>] No changes``,
``[<host>] Skipped``, or ``[<host>] Error...`` (pyinfra/api/operations.py, run_host_op); a retry
says ``Success on retry N``."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

ANSI = re.compile(r"\x1b\[[0-9;]*m")
START = re.compile(r"^--> Starting (?:[\w ,]+ )?operation: (?P<name>.+?)\s*$")
STATUS = re.compile(r"^\s*\[(?P<host>[^\]]+)\]\s+(?P<status>Success|Error)\b")


@dataclass
class RunChanges:
    """Per host, in run order: the operations that changed something and those that failed."""

    changed: dict[str, list[str]] = field(default_factory=dict)
    failed: dict[str, list[str]] = field(default_factory=dict)

    def count(self) -> int:
        return sum(len(ops) for ops in self.changed.values())

    def summary(self) -> str:
        """One line: ``host: op, op; host: op`` (each op without its file prefix)."""
        parts = []
        for host, ops in sorted(self.changed.items()):
            parts.append(f"{host}: {', '.join(short(op) for op in ops)}")
        return "; ".join(parts) or "nothing"


def short(op: str) -> str:
    """An operation's name without the ``tasks/x.py | `` prefix pyinfra gives included files."""
    return op.rpartition(" | ")[2]


def parse(output: str) -> RunChanges:
    """The operations each host changed or failed, from a run's text output."""
    result = RunChanges()
    op: str | None = None
    for raw in output.splitlines():
        line = ANSI.sub("", raw)
        started = START.match(line)
        if started:
            op = started["name"]
            continue
        if line.startswith("--> "):  # the run's other phases: no operation is running
            op = None
            continue
        status = STATUS.match(line)
        if status and op is not None:
            into = result.changed if status["status"] == "Success" else result.failed
            into.setdefault(status["host"], []).append(op)
    return result


def planned(dry_json: str) -> list[str]:
    """``host: operation`` for every unconditional change in ``pyinfra --dry --json``'s plan.

    Conditional ones are left out: pyinfra lists every ``_if``-gated operation as a conditional
    change under --dry, converged or not (pyinfra_cli/prints.py build_plan_json; a converged
    pair's plan has 33 of them and no unconditional change)."""
    plan = json.loads(dry_json)["plan"]
    return [f"{host}: {short(op['name'])}" for op in plan for host in op["hosts_with_change"]]
