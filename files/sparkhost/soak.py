"""``sparkhost soak``: a release held under concurrent load long enough to see a late wedge.

    sparkhost soak --url URL --model NAME --metrics-url URL [--parser vllm-metrics]
                   [--minutes M] [--streams S] [--stall-s S] [--floor F] [--interval S]
                   [--api-key-file FILE] [--ca-file FILE | --tls-unverified]
        S streams send completions through the API front for M minutes, while the engine's own
        counters (--metrics-url, the watchdog's rule: sparkhost/wedge.py) are read every
        --interval seconds. Fails, naming the minute, when the work in flight did not move for
        --stall-s, when a request fails, or when a minute decodes fewer than F times the tokens
        of the first minute. One JSON line at the end: {"ok", "minute", "detail", "requests",
        "failed", "tokens", "tok_s", "p50_s", "p99_s", "stalls", "minutes", "streams"}; exit 0
        when it held, 1 otherwise.

Why: a TP=2 pair of Sparks on pip's NCCL 2.28.9 wedged after 20-26 minutes of 4-way load; a
60-minute soak is what proved the system build (vllm-project/vllm#42354, #41725). The gates and
the short bench last seconds. The soak holds the pair's ordered-restart lock, so the watchdog
does not restart the pair under it: the soak judges the wedge itself, by the same rule."""

from __future__ import annotations

import argparse
import json
import math
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sparkhost import gate, wedge

PROMPT = "Write a short paragraph about the sea."
TOKENS = 64  # per request: long enough to decode, short enough to finish many per minute


def payload(model: str) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": TOKENS,
        "temperature": 0.7,
        "chat_template_kwargs": {"enable_thinking": False},
    }


def completion_tokens(body: str) -> int:
    try:
        return int(json.loads(body)["usage"]["completion_tokens"])
    except (ValueError, KeyError, TypeError):
        return 0


def percentile(values: Sequence[float], q: float) -> float | None:
    """The nearest-rank percentile (q in 0..100) of ``values``; None for none."""
    if not values:
        return None
    ranked = sorted(values)
    return ranked[max(0, math.ceil(q / 100 * len(ranked)) - 1)]


@dataclass
class Tally:
    """What the streams did, per minute since the start."""

    latencies: list[float] = field(default_factory=list)
    tokens_by_minute: dict[int, int] = field(default_factory=dict)
    requests: int = 0
    failed: list[tuple[int, str]] = field(default_factory=list)  # (minute, why)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, minute: int, latency: float, status: int, body: str) -> None:
        with self.lock:
            self.requests += 1
            if status != 200:
                self.failed.append((minute, f"HTTP {status or 'unreachable'}: {body[:200]}"))
                return
            self.latencies.append(latency)
            got = completion_tokens(body)
            self.tokens_by_minute[minute] = self.tokens_by_minute.get(minute, 0) + got


def slow_minute(tokens_by_minute: dict[int, int], minutes: int, floor: float) -> tuple[str, int]:
    """Why a whole minute fell below ``floor`` x the first minute's tokens, and which (0-based);
    ("", 0) when none did. A minute not run whole (the last, partial one) is not judged."""
    first = tokens_by_minute.get(0, 0)
    for m in range(1, minutes):
        got = tokens_by_minute.get(m, 0)
        if first and got < floor * first:
            return f"minute {m + 1} decoded {got} tokens, under {floor:g} x minute 1's {first}", m
    return "", 0


def soak(
    url: str,
    model: str,
    fetch: gate.Fetch,
    sample: Callable[[], wedge.Sample],
    minutes: float,
    streams: int,
    stall_s: float,
    floor: float = 0.5,
    interval: float = 5.0,
    clock: Callable[[], float] = time.monotonic,
    emit: Callable[[str], None] = lambda line: None,
) -> dict[str, Any]:
    """Hold the endpoint under ``streams`` concurrent completions for ``minutes``; the result.
    ``emit`` gets one progress line per minute."""
    tally, stop, start = Tally(), threading.Event(), clock()
    chat = url.rstrip("/") + "/v1/chat/completions"

    def minute() -> int:
        return int((clock() - start) // 60)

    def stream() -> None:
        while not stop.is_set():
            t0 = clock()
            status, body = fetch(chat, payload(model), stall_s + 60)
            if not stop.is_set():
                tally.add(minute(), clock() - t0, status, body)

    workers = [threading.Thread(target=stream, daemon=True) for _ in range(streams)]
    for w in workers:
        w.start()
    stalls = wedge.StallClock(stall_s)
    verdict = ("", 0)
    end = start + minutes * 60
    shown = 0
    while clock() < end and not verdict[0]:
        time.sleep(interval)
        now = clock()
        if minute() > shown:
            shown = minute()
            with tally.lock:
                done, failed = tally.requests, len(tally.failed)
                tokens = tally.tokens_by_minute.get(shown - 1, 0)
            emit(f"soak: minute {shown} of {minutes:g}: {done} requests ({failed} failed), "
                 f"{tokens} tokens in minute {shown}")  # fmt: skip
        try:
            seen = sample()
        except (OSError, ValueError) as err:
            verdict = (f"the engine's counters are unreadable: {err}", minute())
            break
        if seen.in_flight and stalls.still_for(now, seen) >= stall_s:
            verdict = (f"wedged: {seen.text()}; nothing moved for {stall_s:g} s", minute())
        elif not seen.in_flight:
            stalls.idle(now)
        with tally.lock:
            if tally.failed:
                verdict = (f"a request failed: {tally.failed[0][1]}", tally.failed[0][0])
    stop.set()
    with tally.lock:  # one moment's figures: a stream may still be ending its request
        total, requests = sum(tally.tokens_by_minute.values()), tally.requests
        failed, by_minute = len(tally.failed), dict(tally.tokens_by_minute)
        p50, p99 = percentile(tally.latencies, 50), percentile(tally.latencies, 99)
    ran_s = max(clock() - start, 1e-9)
    if not verdict[0]:
        verdict = slow_minute(by_minute, int(minutes), floor)
    said, at = verdict
    return {
        "ok": not said,
        "minute": at + 1 if said else None,
        "detail": said or f"held {minutes:g} min under {streams} streams",
        "requests": requests,
        "failed": failed,
        "tokens": total,
        "tok_s": round(total / ran_s, 2),
        "p50_s": round(p50, 3) if p50 is not None else None,
        "p99_s": round(p99, 3) if p99 is not None else None,
        "stalls": 1 if said.startswith("wedged") else 0,
        "minutes": minutes,
        "streams": streams,
    }


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="sparkhost soak", description=__doc__.split("\n")[0])
    ap.add_argument("--url", default=gate.DEFAULT_URL)
    ap.add_argument("--model", default=gate.DEFAULT_MODEL)
    ap.add_argument("--metrics-url", required=True)
    ap.add_argument("--parser", default="vllm-metrics", choices=sorted(wedge.PARSERS))
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--stall-s", type=float, default=300.0)
    ap.add_argument("--floor", type=float, default=0.5)
    ap.add_argument("--interval", type=float, default=5.0)
    ap.add_argument("--api-key-file")
    ap.add_argument("--ca-file")
    ap.add_argument("--tls-unverified", action="store_true")
    ap.add_argument("--restart-lock", default=gate.RESTART_LOCK)
    ap.add_argument("--restart-wait", type=float, default=900.0)
    a = ap.parse_args(argv)
    context = gate.tls_context(a.ca_file, a.tls_unverified)
    try:
        key = gate.read_api_key(a.api_key_file) if a.api_key_file else ""
    except (OSError, ValueError) as err:
        ap.error(f"cannot read the API key: {err}")
    fetch = gate.authed_http(key, context)

    def held() -> int:
        print(f"soak: {a.streams} streams for {a.minutes:g} min against {a.url}", flush=True)
        result = soak(
            a.url, a.model, fetch,
            lambda: wedge.read_metrics(a.metrics_url, parser=a.parser),
            a.minutes, a.streams, a.stall_s, a.floor, a.interval,
            emit=lambda line: print(line, flush=True),
        )  # fmt: skip
        print(json.dumps(result, sort_keys=True), flush=True)
        if result["ok"]:
            return 0
        print(f"soak failed at minute {result['minute']}: {result['detail']}", file=sys.stderr)
        return 1

    ready = lambda: gate.wait_ready(a.url, None, a.restart_wait, 5.0, fetch, emit=lambda _: None)  # noqa: E731
    return gate.held_against_restarts(held, ready, a.restart_lock, a.restart_wait)


if __name__ == "__main__":
    sys.exit(main())
