"""The watchdog's probe: a long prefill told from a wedged engine, by the engine's own counters
(vLLM's /metrics; TensorFold's /health JSON: ``PARSERS``, one per engine family).

While requests are in flight (vLLM's running + waiting gauges), the engine is stalled only when
none of the values below moved for ``stall_s``; a real completion then would only queue behind the
work in flight. While idle, a short real completion (the canary) is the probe.

Why these values (docs/vllm.md, "What moves in /metrics during a long prefill"): the prompt-token
counter moves only when a prefill ends (vLLM's scheduler emits no output for a partial prefill
chunk, so the output processor records no prompt tokens until the last chunk), and the generation
counter only with decoded tokens. What moves during a chunked prefill is the scheduler's state,
set from every engine step: the KV cache usage gauge (each chunk allocates blocks) and the
running/waiting gauges. Any of them moving means the engine stepped.

The last probe is written, one JSON line, to ``probe_file`` for status.py, which reads it with
``parse_probe`` (this module holds both ends of that format). Stdlib only.
"""

from __future__ import annotations

import json
import os
import time
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass

# vLLM 0.33's names (vllm/v1/metrics/loggers.py, PrometheusStatLogger.__init__); prometheus_client
# exposes a Counter named X as X_total. The KV gauge was vllm:gpu_cache_usage_perc in older
# builds (the default image's dev build may carry either): the first one present is read.
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
PROMPT_TOKENS = "vllm:prompt_tokens_total"
GENERATION_TOKENS = "vllm:generation_tokens_total"
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
REQUIRED = (RUNNING, WAITING, PROMPT_TOKENS, GENERATION_TOKENS)


@dataclass(frozen=True)
class Sample:
    """What the head's /metrics said, summed over every engine and model label."""

    running: float
    waiting: float
    prompt_tokens: float
    generation_tokens: float
    kv_usage: float | None = None  # None: the build exposes no KV usage gauge

    @property
    def in_flight(self) -> bool:
        return self.running + self.waiting > 0

    def text(self) -> str:
        kv = "-" if self.kv_usage is None else f"{self.kv_usage:.6g}"
        return (
            f"running={self.running:g} waiting={self.waiting:g} "
            f"prompt_tokens={self.prompt_tokens:g} generation_tokens={self.generation_tokens:g} "
            f"kv_cache_usage={kv}"
        )


def parse_metrics(text: str) -> Sample:
    """A Sample from Prometheus text exposition; ValueError when a needed metric is missing."""
    sums: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("vllm:"):
            continue  # comments, other exporters' metrics
        head, _, value = line.rpartition(" ")
        name = head.split("{", 1)[0].strip()
        if name in REQUIRED or name in KV_USAGE:
            try:
                sums[name] = sums.get(name, 0.0) + float(value)
            except ValueError:
                raise ValueError(f"/metrics: {name} has no number: {line!r}") from None
    missing = [n for n in REQUIRED if n not in sums]
    if missing:
        raise ValueError(f"/metrics lacks {', '.join(missing)}")
    kv = next((sums[n] for n in KV_USAGE if n in sums), None)
    return Sample(sums[RUNNING], sums[WAITING], sums[PROMPT_TOKENS], sums[GENERATION_TOKENS], kv)


# TensorFold's /health JSON (src/tensorfold/cuda/health.py@01ecc8dc204d07484f98ded75a51d20d6515c188,
# Health.snapshot): "requests_running" is the live request count; "prompt_tokens_total" sums the
# prompts of finished requests; "completion_tokens_total" is finished replies' tokens plus the
# running replies' tokens so far, so it moves with every decoded token. /health has no waiting
# count and nothing that moves during a prefill: a prompt longer than stall_s x its prefill rate
# (about 1,950 tok/s on the pair) looks still, so the watchdog's stall_s must cover it.
TF_RUNNING = "requests_running"
TF_PROMPT_TOKENS = "prompt_tokens_total"
TF_COMPLETION_TOKENS = "completion_tokens_total"
TF_REQUIRED = (TF_RUNNING, TF_PROMPT_TOKENS, TF_COMPLETION_TOKENS)


def parse_tensorfold_health(text: str) -> Sample:
    """A Sample from TensorFold's /health JSON; ValueError when it is not that JSON or lacks a
    counter (a process that answers ``ok`` alone says nothing about progress)."""
    try:
        body = json.loads(text)
    except ValueError as err:
        raise ValueError(f"/health is not JSON: {err}") from None
    if not isinstance(body, dict):
        raise ValueError("/health is not a JSON object")
    missing = [n for n in TF_REQUIRED if n not in body]
    if missing:
        raise ValueError(f"/health lacks {', '.join(missing)}")
    values: list[float] = []
    for name in TF_REQUIRED:
        v = body[name]
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise ValueError(f"/health: {name} is not a number: {v!r}")
        values.append(float(v))
    running, prompt, completion = values
    return Sample(running, 0.0, prompt, completion)


# How the watchdog reads an engine's progress, by the stack's ``progress_parser``
# (sparkrig/stacks/base.py): the rule (StallClock, probe) is the same for every engine.
PARSERS: dict[str, Callable[[str], Sample]] = {
    "vllm-metrics": parse_metrics,
    "tensorfold-health": parse_tensorfold_health,
}


def read_metrics(url: str, timeout: float = 10.0, parser: str = "vllm-metrics") -> Sample:
    """GET the engine's progress page on the head's loopback engine_port (vLLM's /metrics,
    TensorFold's /health: both without a key; the API front keeps them from the LAN) and parse
    it with ``PARSERS[parser]``; OSError or ValueError."""
    parse = PARSERS[parser]
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return parse(resp.read().decode("utf-8", errors="replace"))


class StallClock:
    """How long the work in flight has not moved (pure: fed samples and the monotonic clock).

    A change seen now happened after the previous probe, so the stillness is counted from that
    probe: a wedge is declared within stall_s plus one interval of the engine's last step, and
    never for less stillness than stall_s minus one interval."""

    def __init__(self, stall_s: float) -> None:
        self.stall_s = stall_s
        self.last: Sample | None = None
        self.seen_at: float | None = None  # when the previous probe looked
        self.since = 0.0  # the earliest the work in flight may have last moved
        self.moved = False  # whether this probe saw it move

    def reset(self) -> None:
        """Nothing to judge (the pair down, starting, or restarted)."""
        self.last = self.seen_at = None

    def idle(self, now: float) -> None:
        """Nothing in flight: the next request in flight starts a fresh count."""
        self.last, self.seen_at = None, now

    def still_for(self, now: float, sample: Sample) -> float:
        """Seconds nothing moved while requests were in flight."""
        self.moved = self.last is None or sample != self.last
        if self.moved:
            self.since = now if self.seen_at is None else self.seen_at
        self.last, self.seen_at = sample, now
        return now - self.since


@dataclass(frozen=True)
class Probe:
    """One probe: which rule ran, its outcome (None: in flight, not moved, within stall_s), what
    it saw, and when (wall clock)."""

    rule: str  # "progress" (in flight), "stall" (in flight, nothing moved for stall_s), "canary"
    ok: bool | None
    detail: str
    at: float = 0.0

    def text(self, now: float) -> str:
        outcome = {True: "ok", False: "FAILED", None: "watching"}[self.ok]
        ago = f", {now - self.at:.0f} s ago" if self.at else ""
        return f"{self.rule} {outcome} ({self.detail}{ago})"


def probe(
    metrics_url: str,
    clock: StallClock,
    now: float,
    canary: Callable[[], bool | None],
    read: Callable[[str], Sample] = read_metrics,
) -> Probe:
    """Read /metrics; in flight: judge progress; idle (or /metrics unreadable): run the canary."""
    try:
        sample: Sample | None = read(metrics_url)
    except (OSError, ValueError) as err:
        sample, why = None, f"/metrics unreadable: {err}"
    if sample is not None and sample.in_flight:
        still = clock.still_for(now, sample)
        if still >= clock.stall_s:
            detail = f"{sample.text()}; nothing moved for {still:.0f} s (stall_s {clock.stall_s:g})"
            return Probe("stall", False, detail, time.time())
        moved = "moved" if clock.moved else f"nothing moved for {still:.0f} s"
        return Probe("progress", True if clock.moved else None, f"{sample.text()}; {moved}",
                     time.time())  # fmt: skip
    clock.idle(now)
    if sample is not None:
        why = f"idle: {sample.text()}"
    ok = canary()
    said = {True: "answered", False: "failed", None: OWN_FAILURE}[ok]
    return Probe("canary", ok, f"a short completion {said}; {why}", time.time())


# the canary's outcome when the watchdog could not run it (its key unreadable, its program
# missing): the watchdog's own failure, never counted against the engine
OWN_FAILURE = "could not be sent (the watchdog's own failure: its key file or its program)"


def probe_file(run_dir: str) -> str:
    return f"{run_dir}/watchdog-probe.json"


def format_probe(p: Probe) -> str:
    return json.dumps({**asdict(p), "at": round(p.at, 1)}, sort_keys=True)


def write_probe(path: str, p: Probe) -> None:
    """The last probe, one JSON line, renamed into place; a failure only loses the report."""
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            f.write(format_probe(p) + "\n")
        os.replace(path + ".tmp", path)
    except OSError:
        pass


def parse_probe(text: str) -> Probe:
    """The Probe ``format_probe`` wrote; ValueError when it is not one."""
    try:
        raw = json.loads(text)
        ok = raw["ok"]
        if ok not in (True, False, None):
            raise TypeError(f"ok={ok!r}")
        return Probe(str(raw["rule"]), ok, str(raw["detail"]), float(raw["at"]))
    except (ValueError, KeyError, TypeError) as err:
        raise ValueError(f"watchdog probe file: {err}") from None
