"""A campaign's results: one record per fault, the JSON report and its markdown table.

A fault counts as healed when the check after its run found the pair whole; a refused fault
(catalogue ``refused``) counts when the run refused it as required and the pair was whole after
the fault was undone. The report ends with healed/total and every fault that was not, with its
log."""

from __future__ import annotations

import json
import re
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

HEALED = "healed"
REFUSED = "refused as required"
NOT_HEALED = "NOT healed"
NOT_RUN = "not run"


@dataclass
class FaultResult:
    index: int
    kind: str
    node: str
    params: dict[str, str]
    verdict: str = NOT_RUN
    problems: list[str] = field(default_factory=list)
    runs: list[dict[str, Any]] = field(default_factory=list)  # rc, seconds, killed/cut, changed
    time_to_serving_s: float | None = None  # from the fault's apply to a completion answering
    changed: str = ""  # what the operator's run changed, one line
    log: str = ""

    @property
    def counted(self) -> bool:
        return self.verdict in (HEALED, REFUSED)


@dataclass
class Campaign:
    seed: int
    faults: int
    only: list[str]
    command: str
    started: str
    results: list[FaultResult] = field(default_factory=list)
    stopped: str = ""  # why the campaign stopped early, if it did

    def healed(self) -> int:
        return sum(1 for r in self.results if r.counted)

    def total(self) -> int:
        """Every fault drawn: one not run (the campaign stopped early) counts against it."""
        return self.faults

    def not_healed(self) -> list[FaultResult]:
        return [r for r in self.results if not r.counted]

    def per_kind(self) -> dict[str, dict[str, Any]]:
        """Per fault kind: how many, how many healed, time to serving (median and worst)."""
        out: dict[str, dict[str, Any]] = {}
        for r in self.results:
            k = out.setdefault(r.kind, {"n": 0, "healed": 0, "times": []})
            k["n"] += 1
            k["healed"] += r.counted
            if r.counted and r.time_to_serving_s is not None:
                k["times"].append(r.time_to_serving_s)
        for k in out.values():
            times = k.pop("times")
            k["median_s"] = round(statistics.median(times)) if times else None
            k["worst_s"] = round(max(times)) if times else None
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "faults": self.faults,
            "only": self.only,
            "command": self.command,
            "started": self.started,
            "stopped": self.stopped,
            "healed": self.healed(),
            "total": self.total(),
            "per_kind": self.per_kind(),
            "results": [asdict(r) for r in self.results],
            "not_healed": [{"index": r.index, "kind": r.kind, "verdict": r.verdict,
                            "problems": r.problems, "log": r.log}
                           for r in self.not_healed()],
        }  # fmt: skip

    def markdown(self) -> str:
        lines = [
            f"# Chaos campaign, seed {self.seed}",
            "",
            f"`{self.command}`, started {self.started}.",
            "",
            "| # | fault | node | verdict | to serving | run(s) | what the run changed |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in self.results:
            runs = ", ".join(_run_cell(run) for run in r.runs) or "-"
            serving = f"{r.time_to_serving_s:.0f} s" if r.time_to_serving_s is not None else "-"
            params = " ".join(f"{k}={v}" for k, v in sorted(r.params.items()))
            fault = f"{r.kind} ({params})" if params else r.kind
            changed = r.changed.replace("|", "/") or "-"
            lines.append(
                f"| {r.index} | {fault} | {r.node} | {r.verdict} | {serving} | {runs} | {changed} |"
            )
        lines += [
            "",
            "| fault kind | n | healed | median to serving | worst |",
            "|---|---|---|---|---|",
        ]
        for kind, k in sorted(self.per_kind().items()):
            med = f"{k['median_s']} s" if k["median_s"] is not None else "-"
            worst = f"{k['worst_s']} s" if k["worst_s"] is not None else "-"
            lines.append(f"| {kind} | {k['n']} | {k['healed']} | {med} | {worst} |")
        lines += ["", f"**healed {self.healed()}/{self.total()}**", ""]
        if self.stopped:
            lines += [f"Stopped early: {self.stopped}", ""]
        missing = self.faults - len(self.results)
        if missing:
            lines += [f"{missing} drawn fault(s) not run.", ""]
        for r in self.not_healed():
            lines.append(f"- {r.index}. {r.kind} on the {r.node}: {r.verdict}; "
                         f"{'; '.join(r.problems) or 'no check ran'} (log: {r.log})")  # fmt: skip
        return "\n".join(lines) + "\n"

    def write(self, out: Path) -> tuple[Path, Path]:
        js, md = out / "report.json", out / "report.md"
        js.write_text(json.dumps(self.to_json(), indent=1) + "\n")
        md.write_text(self.markdown())
        return js, md


def load(report_json: Path) -> Campaign:
    """A campaign as its report.json recorded it."""
    js = json.loads(report_json.read_text())
    c = Campaign(js["seed"], js["faults"], js["only"], js["command"], js["started"])
    c.stopped = js["stopped"]
    c.results = [FaultResult(**r) for r in js["results"]]
    return c


def merge(parts: Sequence[Campaign]) -> Campaign:
    """One drawn sequence run in parts (``--pick``) as one campaign: a later part's result for a
    fault replaces an earlier part's (a replay). The parts must have drawn the same sequence."""
    if not parts:
        raise ValueError("nothing to merge")
    first = parts[0]
    sequence = (first.seed, drawn(first), first.only)
    for p in parts[1:]:
        if (p.seed, drawn(p), p.only) != sequence:
            raise ValueError(
                f"{p.command!r} drew another sequence than {first.command!r}: "
                "only parts of one seed, --faults and --only merge"
            )
    by_index: dict[int, FaultResult] = {}
    for p in parts:
        by_index.update((r.index, r) for r in p.results)
    sources = "; ".join(
        f"faults {spans(r.index for r in p.results)} from: {p.command}" for p in parts
    )
    base = first.command.split(" --pick")[0]
    merged = Campaign(first.seed, sequence[1], first.only, f"{base} ({sources})", first.started)
    merged.results = [by_index[i] for i in sorted(by_index)]
    return merged


def drawn(part: Campaign) -> int:
    """How many faults the part's seed drew (its --faults); ``faults`` counts those it ran."""
    m = re.search(r" --faults (\d+)", part.command)
    if not m:
        raise ValueError(f"{part.command!r} names no --faults: not a bench.chaos report")
    return int(m.group(1))


def spans(indexes: Iterable[int]) -> str:
    """1,2,3,5,7,8 -> '1-3,5,7-8'."""
    out: list[list[int]] = []
    for i in sorted(set(indexes)):
        if out and i == out[-1][1] + 1:
            out[-1][1] = i
        else:
            out.append([i, i])
    return ",".join(f"{a}-{b}" if a != b else f"{a}" for a, b in out)


def _run_cell(run: dict[str, Any]) -> str:
    what = f"rc {run['rc']} in {run['seconds']:.0f} s"
    if run.get("interrupted"):
        what += f" ({run['interrupted']})"
    return what
