"""The upgrade gate on the bench's figures: a release that changes is promoted only when the short
bench, run ``bench_gate_runs`` times, reaches ``1 - bench_tolerance`` of the previous release's
recorded figures, in its median and in its p10, and its drafter accepts at least
``bench_acceptance_min`` of its draft tokens.

After the four serving gates pass, the head's operation runs ``python3 -m sparkrig.bench --short``
from the control machine against the head's API (``settings.api_url``), once per run:
single-stream decode, 4 parallel streams, the tool-call and the corruption probes
(sparkrig/bench/protocol.py SHORT), and the drafter's acceptance from the engine's /metrics over
the run (sparkrig/bench/specdecode.py). It runs as a child process: pyinfra's CLI gevent-patches
its own process (sockets, threads, the clock's sleeps), and the bench's parallel streams and
timings must run on real threads. Each run's JSON lands under ``.sparkrig/bench/`` on the
control machine, its table and PNG beside it, and the runs together in one more
(``-release.json``: the figures the gate judged, what ``python3 -m sparkrig.bench compare``
shows side by side for several releases).

The figures kept with the release (sparkrig/release.py ``Release.bench``, on every rank) are
those below: each speed's median over the runs under its own name (a release recorded before the
runs were several kept its one run's figure there) and its p10 beside it, the acceptance pooled
over the runs and the drafter lockfile's digest; a figure the previous release has no record of
is not compared. The first release (no record on the head) is measured and its figures become
the baseline; so does a release whose predecessor was recorded before this gate existed. The
acceptance floor is no comparison: it holds the first release too. A shortfall fails the head's
operation, which the rollback watches (sparkrig/rollback.py ``rollback``): the previous release
is put back and the run fails naming, figure by figure, what the new release measured and what
the previous one had.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyinfra import host, logger
from pyinfra.api import FunctionCommand, operation

from sparkrig import REPO
from sparkrig.bench import stats
from sparkrig.failing import fail_host
from sparkrig.runscope import once_per_pair

RESULTS_DIR = Path(".sparkrig") / "bench"  # control side (pyinfra's cwd), beside the API key
# (key in the record, what it is, unit): higher is better
SPEEDS = (
    ("single_stream_tok_s", "single-stream decode", "tok/s"),
    ("decode_tok_s.4", "4-stream aggregate decode", "tok/s"),
)
TOOL = "tool_call_ok"
FFFD = "fffd_per_10k_chars"
FFFD_CHARS = "fffd_chars"
P10 = ".p10"  # a speed's p10 over the runs, kept beside its median: "single_stream_tok_s.p10"
RUNS = "runs"
ACCEPTANCE = "spec_acceptance"
DRAFTER = "drafter_lockfile_sha256"  # which drafter files the acceptance is of


@dataclass(frozen=True)
class Target:
    """The head's API as the control machine reaches it."""

    url: str
    model: str
    key_file: str | None  # the control side's copy of the API key; None: api_auth is off
    profile: str
    ca_file: str | None = None  # the pair's CA an https url is verified with; None: system trust
    # the control side's lockfile of the drafter the release loads (settings.drafter_lock); None:
    # it loads none, and the acceptance floor is not held
    drafter_lock: str | None = None
    stack: str | None = None  # recorded in the results, so compare judges them by its figures
    pair_only: bool = False  # behind one endpoint: the release's own pair, never another's


def figures_of(result: dict[str, Any]) -> dict[str, Any]:
    """The figures the gate keeps, from a bench run's JSON (None where it measured nothing)."""
    decode = result.get("decode_tok_s") or {}
    return {
        "single_stream_tok_s": result.get("single_stream_tok_s"),
        "decode_tok_s.4": decode.get("4") if isinstance(decode, dict) else None,
        TOOL: result.get(TOOL),
        FFFD: result.get(FFFD),
        FFFD_CHARS: result.get(FFFD_CHARS) or 0,
    }


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _sum(results: list[dict[str, Any]], key: str, inner: str | None = None) -> float:
    total = 0.0
    for r in results:
        value = (r.get(key) or {}).get(inner) if inner else r.get(key)
        total += _num(value) or 0.0
    return total


def gate_figures(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The figures the gate keeps from several short-bench runs: each speed's median (under the
    one run's name) and p10; the tool call parsed when it parsed in every run that made it;
    U+FFFD per 10,000 characters over every run's answer (``fffd_chars`` their length); the
    drafter's acceptance over every run's draft tokens, with the drafter lockfile's sha256."""
    each = [figures_of(r) for r in results]
    out: dict[str, Any] = {RUNS: len(results)}
    for key, _, _ in SPEEDS:
        values = [v for f in each if (v := _num(f.get(key))) is not None]
        spread = stats.spread(values) if values else None
        out[key] = spread["median"] if spread else None
        out[key + P10] = spread["p10"] if spread else None
    tools = [f[TOOL] for f in each if f.get(TOOL) is not None]
    out[TOOL] = (all(t is True for t in tools)) if tools else None
    fffds = [(v, _num(f.get(FFFD_CHARS)) or 0.0) for f in each
             if (v := _num(f.get(FFFD))) is not None]  # fmt: skip
    chars = sum(c for _, c in fffds)
    if chars:  # each answer weighed by its length: every U+FFFD over every character
        out[FFFD] = round(sum(v * c for v, c in fffds) / chars, 3)
    else:
        out[FFFD] = fffds[0][0] if fffds else None
    out[FFFD_CHARS] = int(chars)
    draft = _sum(results, "spec_decode", "draft_tokens")
    if draft > 0:
        out[ACCEPTANCE] = round(_sum(results, "spec_decode", "accepted_tokens") / draft, 4)
    drafter = next((r["drafter"] for r in results if isinstance(r.get("drafter"), dict)), None)
    if drafter is not None:
        out[DRAFTER] = drafter.get("lockfile_sha256")
    return out


def acceptance_held(results: list[dict[str, Any]], now: dict[str, Any], floor: float
                    ) -> tuple[str, str]:  # fmt: skip
    """(why the drafter's acceptance holds the release, '' when it does not; the note the run's
    line says): a release that loads a drafter (the bench named its lockfile) must accept at
    least ``floor`` of its draft tokens; one that loads none skips the floor, saying so, and so
    does one whose engine exposes no spec-decode counters."""
    drafter = next((r["drafter"] for r in results if isinstance(r.get("drafter"), dict)), None)
    got = _num(now.get(ACCEPTANCE))
    if drafter is None:
        said = f"drafter acceptance {got:.1%}" if got is not None else "no drafter acceptance"
        return "", f"{said}; no drafter in this release: the acceptance floor is not held"
    name = (
        f"{drafter.get('repo')}@{str(drafter.get('commit'))[:12]}, lockfile sha256 "
        f"{str(drafter.get('lockfile_sha256'))[:12]}"
    )
    if got is None:
        notes = {str((r.get("spec_decode") or {}).get("note")) for r in results
                 if (r.get("spec_decode") or {}).get("note")}  # fmt: skip
        why = "; ".join(sorted(notes)) or "not measured"
        return "", f"drafter {name}: acceptance not measured ({why}): its floor is not held"
    if got < floor:
        return (
            f"drafter acceptance {got:.1%} is below the floor {floor:.0%} (bench_acceptance_min "
            f"{floor:g}; drafter {name}): a drafter that does not fit the model", "",
        )  # fmt: skip
    return "", f"drafter acceptance {got:.1%} (floor {floor:.0%}; {name})"


def shortfalls(previous: dict[str, Any], now: dict[str, Any], tolerance: float) -> list[str]:
    """Each figure of ``now`` that does not reach ``1 - tolerance`` of ``previous``, naming both.

    Speeds, their medians and (where the previous release kept one) their p10s, must reach
    ``previous x (1 - tolerance)``. The tool call must parse if it parsed before. U+FFFD per
    10,000 characters may rise to ``previous / (1 - tolerance)`` plus one U+FFFD in each answer
    (one a run): seed 000 measured about 2 per 10,000 characters without the UTF-8 guard, so a
    2,048-token answer holds 0 or 1 of them by chance; two more than before is corruption, not
    chance."""
    out = []
    share = f"{1 - tolerance:.0%}"
    for key, what, unit in SPEEDS:
        for name, said in ((key, ""), (key + P10, " p10")):
            before, got = _num(previous.get(name)), _num(now.get(name))
            if before is None:  # a release recorded before p10 was kept: its median only
                continue
            floor = before * (1 - tolerance)
            if got is None:
                out.append(f"{what}{said} not measured (previous release {before:.2f} {unit})")
            elif got < floor:
                out.append(
                    f"{what}{said} {got:.2f} {unit} is below {share} of the previous release's"
                    f"{said} {before:.2f} {unit} (floor {floor:.2f})"
                )
    if previous.get(TOOL) is True and now.get(TOOL) is not True:
        said = "not run" if now.get(TOOL) is None else "did not parse"
        out.append(f"tool call {said} (previous release: parsed)")
    before, got = _num(previous.get(FFFD)), _num(now.get(FFFD))
    if before is not None:
        chars = _num(now.get(FFFD_CHARS)) or 0
        answers = int(_num(now.get(RUNS)) or 1)
        ceiling = before / (1 - tolerance) + (10000 * answers / chars if chars else 0)
        if got is None:
            out.append(f"corruption probe not measured (previous release {before:.2f} U+FFFD/10k)")
        elif got > ceiling:
            out.append(
                f"corruption probe {got:.2f} U+FFFD per 10k chars is above the previous "
                f"release's {before:.2f} (ceiling {ceiling:.2f})"
            )
    return out


def summary(figures: dict[str, Any]) -> str:
    """``single-stream decode 30.81 tok/s (p10 30.20 of 3 runs), 4-stream ... , tool call
    parsed, U+FFFD 0.00/10k``."""
    parts = []
    runs = figures.get(RUNS)
    for key, what, unit in SPEEDS:
        got, p10 = _num(figures.get(key)), _num(figures.get(key + P10))
        spread = f" (p10 {p10:.2f} of {runs} runs)" if p10 is not None and runs else ""
        parts.append(f"{what} {got:.2f} {unit}{spread}" if got is not None else f"{what} -")
    tool = figures.get(TOOL)
    parts.append(
        "tool call " + ("parsed" if tool is True else "did not parse" if tool is False else "-")
    )
    fffd = _num(figures.get(FFFD))
    parts.append(f"U+FFFD {fffd:.2f}/10k chars" if fffd is not None else "U+FFFD -")
    return ", ".join(parts)


def bench_argv(target: Target, json_path: Path) -> list[str]:
    """The short bench's command line (the key travels as a file name, never as a value)."""
    argv = [
        sys.executable, "-m", "sparkrig.bench", "--short", "--url", target.url,
        "--model", target.model, "--profile", target.profile, "--json", str(json_path),
    ]  # fmt: skip
    if target.key_file:
        argv += ["--api-key-file", str(Path(target.key_file).resolve())]
    if target.ca_file:
        argv += ["--cacert", str(Path(target.ca_file).resolve())]
    if target.drafter_lock:
        argv += ["--drafter-lock", str(Path(target.drafter_lock).resolve())]
    if target.stack:
        argv += ["--stack", target.stack]
    if target.pair_only:
        argv.append("--pair-only")
    return argv


def _fresh(path: Path) -> Path:
    """``path``, or with -2, -3, ... before its suffix when a run of this second has it; made
    (empty) here, so a bench started beside this one (another pair's head, the same second)
    never gets the same file."""
    n, out = 1, path
    while True:
        try:
            out.open("x").close()
            return out
        except FileExistsError:
            n += 1
            out = path.with_name(f"{path.stem}-{n}{path.suffix}")


def run_short_bench(target: Target, timeout_s: int) -> dict[str, Any]:
    """Run the short bench in a child process; its JSON, or ``{"errors": [why]}`` when it wrote
    none. Its output (progress, the table) goes to pyinfra's log at debug level."""
    results = RESULTS_DIR.resolve()
    results.mkdir(parents=True, exist_ok=True)
    path = _fresh(results / time.strftime("release-gate-%Y%m%dT%H%M%SZ.json", time.gmtime()))
    try:  # from the repository, where `-m sparkrig.bench` is found whatever pyinfra's cwd
        proc = subprocess.run(
            bench_argv(target, path), capture_output=True, text=True, timeout=timeout_s, cwd=REPO
        )
    except subprocess.TimeoutExpired:
        return {"errors": [f"the short bench did not end within {timeout_s} s (bench_timeout_s)"]}
    for line in proc.stdout.splitlines():
        logger.debug(f"bench: {line}")
    try:
        result: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError):
        tail = (proc.stderr.strip() or proc.stdout.strip()).splitlines()[-1:] or ["no output"]
        return {"errors": [f"the short bench wrote no result (exit {proc.returncode}): {tail[0]}"]}
    result["json_path"] = str(path)
    return result


class BenchFigures:
    """The short bench's figures measured in this run (what the head's gate let through)."""

    def __init__(self) -> None:
        self.measured: dict[str, Any] | None = None

    def figure(self) -> dict[str, Any] | None:
        """What ``record_stamped`` calls when it runs: this run's figures, or None."""
        return self.measured


def bench_figures() -> BenchFigures:
    """The bench figures of the current host's pair in this run (one object for every host of
    the pair and every phase): each pair's head benches its own pair, whose ranks record it."""
    return once_per_pair("bench-figures", BenchFigures)


def run_short_benches(target: Target, runs: int, timeout_s: int) -> list[dict[str, Any]]:
    """``runs`` short benches one after the other, all within ``timeout_s``; a run that
    measured no speed at all (the API unreachable) ends them: the next would measure nothing
    either."""
    deadline = time.monotonic() + timeout_s
    results: list[dict[str, Any]] = []
    for _ in range(max(1, runs)):
        left = int(deadline - time.monotonic())
        if left <= 0:
            results.append({"errors": [f"the short bench's {runs} runs did not end within "
                                       f"{timeout_s} s (bench_timeout_s)"]})  # fmt: skip
            break
        result = run_short_bench(target, left)
        results.append(result)
        if all(_num(figures_of(result).get(key)) is None for key, _, _ in SPEEDS):
            break
    return results


def gate_result(results: list[dict[str, Any]], fabric: dict[str, Any] | None
                ) -> dict[str, Any]:  # fmt: skip
    """The runs as one bench result (sparkrig-bench/1, the names of one run's): the medians,
    ``spread`` (median and p10 over the runs), the acceptance and the drafter, and the fabric
    figure this deploy's NCCL smoke test measured (sparkrig/busbw.py) where it ran."""
    first = next((r for r in results if r.get("schema")), results[0] if results else {})
    figures = gate_figures(results)
    keep = ("schema", "started_unix", "started", "url", "model", "profile", "stack",
            "protocol_name", "protocol", "tolerance", "max_model_len", "drafter")  # fmt: skip
    out: dict[str, Any] = {k: first[k] for k in keep if k in first}
    out["release_gate"] = {"runs": len(results),
                           "run_json": [r.get("json_path") for r in results]}  # fmt: skip
    out["single_stream_tok_s"] = figures["single_stream_tok_s"]
    four = figures["decode_tok_s.4"]
    out["decode_tok_s"] = {"1": figures["single_stream_tok_s"], **({"4": four} if four else {})}
    out["spread"] = {}
    for key, _, _ in SPEEDS:
        values = [v for r in results if (v := _num(figures_of(r).get(key))) is not None]
        if values:
            out["spread"][key] = stats.spread(values)
    out.update({k: figures[k] for k in (TOOL, FFFD, FFFD_CHARS)})
    out["fffd_count"] = int(_sum(results, "fffd_count"))
    counts = {k: int(_sum(results, "spec_decode", k))
              for k in ("drafts", "draft_tokens", "accepted_tokens")}  # fmt: skip
    out["spec_acceptance"] = figures.get(ACCEPTANCE)
    out["spec_acceptance_length"] = (
        round(1 + counts["accepted_tokens"] / counts["drafts"], 3) if counts["drafts"] else None
    )
    out["spec_decode"] = {**counts, "source": "/metrics"} if counts["draft_tokens"] else {
        "note": next((str(n) for r in results
                      if (n := (r.get("spec_decode") or {}).get("note"))), "not measured")
    }  # fmt: skip
    if fabric:
        out["fabric"] = fabric
    out["prefill"] = []
    out["errors"] = [
        f"run {i}: {e}" for i, r in enumerate(results, 1) for e in r.get("errors") or []
    ]
    return out


def write_gate_result(results: list[dict[str, Any]], fabric: dict[str, Any] | None) -> str:
    """The runs' result beside the first run's JSON (``<its name>-release.json``); '' when
    no run wrote one."""
    first = next((Path(str(r["json_path"])) for r in results if r.get("json_path")), None)
    if first is None or not first.is_file():
        return ""
    path = first.with_name(f"{first.stem}-release.json")
    path.write_text(json.dumps(gate_result(results, fabric), indent=2, ensure_ascii=False) + "\n")
    return str(path)


def _measure_into(box: dict[str, Any], target: Target, runs: int, timeout_s: int,
                  fabric: Callable[[], dict[str, Any] | None] | None) -> None:  # fmt: skip
    logger.info(f"{host.print_prefix}short bench against {target.url}, {runs} run(s) (a few "
                "minutes each)")  # fmt: skip
    box["results"] = run_short_benches(target, runs, timeout_s)
    box["json_path"] = write_gate_result(box["results"], fabric() if fabric else None)


def verdict(
    result: dict[str, Any] | list[dict[str, Any]],
    previous: dict[str, Any],
    tolerance: float,
    acceptance_min: float = 0.0,
) -> tuple[dict[str, Any] | None, str]:
    """(the figures to record, None when the release fails; the line the run logs: why it
    fails, or what it measured against the previous release's figures) of one bench run or
    several (``gate_figures``): the speeds' medians and p10s against the previous release's,
    the drafter's acceptance against ``acceptance_min`` (``acceptance_held``)."""
    results = [result] if isinstance(result, dict) else list(result)
    now = gate_figures(results)
    said = f"short bench: {summary(now)}"
    paths = [str(r["json_path"]) for r in results if r.get("json_path")]
    if paths:
        said += f" ({', '.join(paths)})"
    errors = [str(e) for r in results for e in r.get("errors") or []]
    missing = [what for key, what, _ in SPEEDS if _num(now.get(key)) is None]
    if not previous and missing:
        why = "; ".join(errors[:3]) or f"{', '.join(missing)} not measured"
        return None, (
            f"the short bench measured no baseline: {why}. The control machine must reach "
            "the head's API (host data api_url on the head); bench_gate = False skips it"
        )
    held, note = acceptance_held(results, now, acceptance_min)
    falls = shortfalls(previous, now, tolerance) if previous else []
    if falls or held:
        extra = f" (bench errors: {'; '.join(errors[:2])})" if errors else ""
        if falls:
            why = (f"short bench below {1 - tolerance:.0%} of the previous release "
                   f"(bench_tolerance {tolerance:g}): {'; '.join(falls)}")  # fmt: skip
            why += f"; {held}" if held else ""
        else:
            why = f"short bench held by the acceptance floor: {held}"
        return None, why + extra
    said += f"; {note}"
    if not previous:
        return now, f"{said}; no figures recorded for the previous release: these are the baseline"
    return now, f"{said}; previous release: {summary(previous)}"


@operation(is_idempotent=False)
def release_bench_passed(
    target: Target,
    previous: dict[str, Any],
    tolerance: float,
    timeout_s: int,
    record: Callable[[dict[str, Any]], None],
    runs: int = 1,
    acceptance_min: float = 0.0,
    fabric: Callable[[], dict[str, Any] | None] | None = None,
) -> Generator[Any, None, None]:
    """
    Run the short bench ``runs`` times from the control machine against the head's API; fail
    this host when a speed's median or p10 falls below ``1 - tolerance`` of the previous
    release's, or the drafter accepts less than ``acceptance_min`` of its draft tokens.

    + target: the head's API as the control machine reaches it
    + previous: the previous release's recorded figures (empty: these become the baseline)
    + tolerance: knob bench_tolerance
    + timeout_s: knob bench_timeout_s (every run together)
    + record: called with the figures of a release that passed (kept with the release)
    + runs: knob bench_gate_runs
    + acceptance_min: knob bench_acceptance_min
    + fabric: this run's NCCL smoke figure on the head (sparkrig/busbw.py), for the runs' JSON
    """
    box: dict[str, Any] = {}
    # A function command runs on the control machine, only while the run executes (not in
    # --dry, not while pyinfra looks for changes); the verdict follows it.
    yield FunctionCommand(_measure_into, (box, target, runs, timeout_s, fabric), {})
    figures, reason = verdict(box.get("results") or [{"errors": ["no result"]}], previous,
                              tolerance, acceptance_min)  # fmt: skip
    if box.get("json_path"):
        reason += f" (the runs together: {box['json_path']})"
    if figures is None:
        logger.error(f"{host.print_prefix}{reason}")
        yield fail_host(reason)
        return
    logger.info(f"{host.print_prefix}{reason}")
    record(figures)
