"""The soak (files/sparkhost/soak.py): streams held under load, judged by the watchdog's rule on
the engine's own counters; a wedge, a failed request or a slow minute fails it naming the minute."""

from __future__ import annotations

import itertools
import json
import threading
from typing import Any

from sparkhost import soak, wedge

ANSWER = json.dumps({"usage": {"completion_tokens": 64}})


def moving() -> Any:
    count = itertools.count()
    return lambda: wedge.Sample(running=2, waiting=0, prompt_tokens=0,
                                generation_tokens=float(next(count)))  # fmt: skip


def test_a_healthy_endpoint_holds_and_the_figure_counts_what_it_did() -> None:
    def fetch(url: str, body: Any, timeout: float) -> tuple[int, str]:
        assert url.endswith("/v1/chat/completions") and body["max_tokens"] == soak.TOKENS
        return 200, ANSWER

    got = soak.soak("https://127.0.0.1:8000", "m", fetch, moving(), minutes=0.01, streams=3,
                    stall_s=5, interval=0.05)  # fmt: skip
    assert got["ok"] and got["minute"] is None and got["stalls"] == 0 and got["failed"] == 0
    assert got["requests"] > 0 and got["tokens"] == 64 * got["requests"]
    assert got["p50_s"] is not None and got["p99_s"] is not None and got["streams"] == 3


def test_an_engine_that_wedges_fails_the_soak_by_the_watchdogs_rule() -> None:
    hang = threading.Event()
    frozen = wedge.Sample(running=3, waiting=1, prompt_tokens=10, generation_tokens=500)

    def fetch(url: str, body: Any, timeout: float) -> tuple[int, str]:
        hang.wait(timeout)  # every request in flight, none answered: a wedge
        return 0, "timed out"

    got = soak.soak("u", "m", fetch, lambda: frozen, minutes=1, streams=2, stall_s=0.3,
                    interval=0.05)  # fmt: skip
    hang.set()
    assert not got["ok"] and got["stalls"] == 1 and got["minute"] == 1
    assert got["detail"].startswith("wedged: running=3 waiting=1") and "0.3 s" in got["detail"]


def test_a_failed_request_fails_the_soak_naming_it() -> None:
    def fetch(url: str, body: Any, timeout: float) -> tuple[int, str]:
        return 500, '{"error": "EngineCore died"}'

    got = soak.soak("u", "m", fetch, moving(), minutes=1, streams=1, stall_s=5, interval=0.05)
    assert not got["ok"] and got["minute"] == 1
    assert got["detail"] == 'a request failed: HTTP 500: {"error": "EngineCore died"}'


def test_a_minute_under_the_floor_of_the_first_is_named() -> None:
    assert soak.slow_minute({0: 1000, 1: 900, 2: 400}, 3, 0.5) == (
        "minute 3 decoded 400 tokens, under 0.5 x minute 1's 1000",
        2,
    )
    assert soak.slow_minute({0: 1000, 1: 900, 2: 400}, 2, 0.5) == ("", 0)  # minute 3 not whole
    assert soak.percentile([3.0, 1.0, 2.0, 10.0], 50) == 2.0
    assert soak.percentile([3.0, 1.0, 2.0, 10.0], 99) == 10.0
