"""The upgrade gate on the bench's figures: a release that changes is promoted only when the short
bench reaches ``1 - bench_tolerance`` of the previous release's recorded figures.

After the four serving gates pass, the head's operation runs ``python3 -m sparkrig.bench --short``
from the control machine against the head's API (``settings.api_url``): single-stream decode,
4 parallel streams, the tool-call and the corruption probes (sparkrig/bench/protocol.py SHORT).
It runs as a child process: pyinfra's CLI gevent-patches its own process (sockets, threads, the
clock's sleeps), and the bench's parallel streams and timings must run on real threads. Its JSON
lands under ``.sparkrig/bench/`` on the control machine, its table and PNG beside it.

The figures kept with the release (sparkrig/release.py ``Release.bench``, on every rank) are
those below; a figure the previous release has no record of is not compared. The first release
(no record on the head) is measured and its figures become the baseline; so does a release whose
predecessor was recorded before this gate existed. A shortfall fails the head's operation, which
the rollback watches (sparkrig/release.py ``rollback``): the previous release is put back and the
run fails naming, figure by figure, what the new release measured and what the previous one had.
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
from pyinfra.context import ctx_state

from sparkrig import REPO
from sparkrig.failing import fail_host
from sparkrig.runscope import once_per_run

RESULTS_DIR = Path(".sparkrig") / "bench"  # control side (pyinfra's cwd), beside the API key
# (key in the record, what it is, unit): higher is better
SPEEDS = (
    ("single_stream_tok_s", "single-stream decode", "tok/s"),
    ("decode_tok_s.4", "4-stream aggregate decode", "tok/s"),
)
TOOL = "tool_call_ok"
FFFD = "fffd_per_10k_chars"
FFFD_CHARS = "fffd_chars"


@dataclass(frozen=True)
class Target:
    """The head's API as the control machine reaches it."""

    url: str
    model: str
    key_file: str | None  # the control side's copy of the API key; None: api_auth is off
    profile: str
    ca_file: str | None = None  # the pair's CA an https url is verified with; None: system trust


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


def shortfalls(previous: dict[str, Any], now: dict[str, Any], tolerance: float) -> list[str]:
    """Each figure of ``now`` that does not reach ``1 - tolerance`` of ``previous``, naming both.

    Speeds must reach ``previous x (1 - tolerance)``. The tool call must parse if it parsed
    before. U+FFFD per 10,000 characters may rise to ``previous / (1 - tolerance)`` plus one
    U+FFFD in this answer: seed 000 measured about 2 per 10,000 characters without the UTF-8
    guard, so a 2,048-token answer holds 0 or 1 of them by chance; two more than before is
    corruption, not chance."""
    out = []
    share = f"{1 - tolerance:.0%}"
    for key, what, unit in SPEEDS:
        before, got = _num(previous.get(key)), _num(now.get(key))
        if before is None:
            continue
        floor = before * (1 - tolerance)
        if got is None:
            out.append(f"{what} not measured (previous release {before:.2f} {unit})")
        elif got < floor:
            out.append(
                f"{what} {got:.2f} {unit} is below {share} of the previous release's "
                f"{before:.2f} {unit} (floor {floor:.2f})"
            )
    if previous.get(TOOL) is True and now.get(TOOL) is not True:
        said = "not run" if now.get(TOOL) is None else "did not parse"
        out.append(f"tool call {said} (previous release: parsed)")
    before, got = _num(previous.get(FFFD)), _num(now.get(FFFD))
    if before is not None:
        chars = _num(now.get(FFFD_CHARS)) or 0
        ceiling = before / (1 - tolerance) + (10000 / chars if chars else 0)
        if got is None:
            out.append(f"corruption probe not measured (previous release {before:.2f} U+FFFD/10k)")
        elif got > ceiling:
            out.append(
                f"corruption probe {got:.2f} U+FFFD per 10k chars is above the previous "
                f"release's {before:.2f} (ceiling {ceiling:.2f})"
            )
    return out


def summary(figures: dict[str, Any]) -> str:
    """``single-stream decode 30.81 tok/s, 4-stream ... , tool call parsed, U+FFFD 0.00/10k``."""
    parts = []
    for key, what, unit in SPEEDS:
        got = _num(figures.get(key))
        parts.append(f"{what} {got:.2f} {unit}" if got is not None else f"{what} -")
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
    return argv


def run_short_bench(target: Target, timeout_s: int) -> dict[str, Any]:
    """Run the short bench in a child process; its JSON, or ``{"errors": [why]}`` when it wrote
    none. Its output (progress, the table) goes to pyinfra's log at debug level."""
    results = RESULTS_DIR.resolve()
    results.mkdir(parents=True, exist_ok=True)
    path = results / time.strftime("release-gate-%Y%m%dT%H%M%SZ.json", time.gmtime())
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
    """The current run's bench figures (one object for every host and phase)."""
    return once_per_run("bench-figures", ctx_state.get(), BenchFigures)


def _measure_into(box: dict[str, Any], target: Target, timeout_s: int) -> None:
    logger.info(f"{host.print_prefix}short bench against {target.url} (a few minutes)")
    box["result"] = run_short_bench(target, timeout_s)


def verdict(
    result: dict[str, Any], previous: dict[str, Any], tolerance: float
) -> tuple[dict[str, Any] | None, str]:
    """(the figures to record, None when the release fails; the line the run logs: why it
    fails, or what it measured against the previous release's figures) of a bench run."""
    now = figures_of(result)
    said = f"short bench: {summary(now)}"
    if result.get("json_path"):
        said += f" ({result['json_path']})"
    errors = [str(e) for e in result.get("errors") or []]
    missing = [what for key, what, _ in SPEEDS if _num(now.get(key)) is None]
    if not previous:
        if missing:
            why = "; ".join(errors[:3]) or f"{', '.join(missing)} not measured"
            return None, (
                f"the short bench measured no baseline: {why}. The control machine must reach "
                "the head's API (host data api_url on the head); bench_gate = False skips it"
            )
        return now, f"{said}; no figures recorded for the previous release: these are the baseline"
    falls = shortfalls(previous, now, tolerance)
    if falls:
        extra = f" (bench errors: {'; '.join(errors[:2])})" if errors else ""
        return None, (
            f"short bench below {1 - tolerance:.0%} of the previous release (bench_tolerance "
            f"{tolerance:g}): {'; '.join(falls)}{extra}"
        )
    return now, f"{said}; previous release: {summary(previous)}"


@operation(is_idempotent=False)
def release_bench_passed(
    target: Target,
    previous: dict[str, Any],
    tolerance: float,
    timeout_s: int,
    record: Callable[[dict[str, Any]], None],
) -> Generator[Any, None, None]:
    """
    Run the short bench from the control machine against the head's API; fail this host when a
    figure falls below ``1 - tolerance`` of the previous release's.

    + target: the head's API as the control machine reaches it
    + previous: the previous release's recorded figures (empty: these become the baseline)
    + tolerance: knob bench_tolerance
    + timeout_s: knob bench_timeout_s
    + record: called with the figures of a release that passed (kept with the release)
    """
    box: dict[str, Any] = {}
    # A function command runs on the control machine, only while the run executes (not in
    # --dry, not while pyinfra looks for changes); the verdict follows it.
    yield FunctionCommand(_measure_into, (box, target, timeout_s), {})
    figures, reason = verdict(box.get("result") or {"errors": ["no result"]}, previous, tolerance)
    if figures is None:
        logger.error(f"{host.print_prefix}{reason}")
        yield fail_host(reason)
        return
    logger.info(f"{host.print_prefix}{reason}")
    record(figures)
