"""The watchdog's progress rule on TensorFold (issue 34 item 4): the `tensorfold-health` parser of
files/sparkhost/wedge.py reads the /health JSON TensorFold's own code writes, and the rule itself
(StallClock, probe) is the one vLLM's counters feed.

The body below is what ``Health.snapshot`` returns in ashhart/TensorFold
src/tensorfold/cuda/health.py@01ecc8dc204d07484f98ded75a51d20d6515c188: ``{"ok": True, "backend":
"tensorfold", "busy": running > 0, "requests_running": running, **totals}`` where ``totals`` are
requests_total, prompt_tokens_total, completion_tokens_total (plus the running replies' tokens
so far) and the STATS names, then ``streams`` (a concurrent engine's) and ``context_length``. The
server sends it as JSON; both json.dumps spacings are tested, as the route's own serializer was
not read."""

from __future__ import annotations

import json
from typing import Any

import pytest
from sparkhost import wedge

from tests.unit.test_wedge import FakeMetrics, canary_says  # the vLLM tests' loopback endpoint


def snapshot(running: int = 0, prompt: int = 0, completion: int = 0) -> dict[str, Any]:
    """Health.snapshot's dict, keys in its order (health.py@01ecc8dc)."""
    totals = {
        "requests_total": 3,
        "prompt_tokens_total": prompt,
        "completion_tokens_total": completion,
        "prefill_seconds_total": 1.25,
        "decode_seconds_total": 4.5,
        "cached_tokens_total": 0,
        "rounds_total": 90,
        "drafted_total": 400,
        "accepted_total": 210,
    }
    body = {"ok": True, "backend": "tensorfold", "busy": running > 0, "requests_running": running}
    return {**body, **totals, "streams": {"decoding": running, "prefilling": 0, "max": 4},
            "context_length": 1048576}  # fmt: skip


def health(running: int = 0, prompt: int = 0, completion: int = 0, compact: bool = False) -> str:
    seps = (",", ":") if compact else None
    return json.dumps(snapshot(running, prompt, completion), separators=seps)


@pytest.fixture
def endpoint():
    m = FakeMetrics()
    m.url = m.url.replace("/metrics", "/health")
    yield m
    m.close()


@pytest.mark.parametrize("compact", [False, True])
def test_the_parser_reads_tensorfolds_own_counters(compact: bool) -> None:
    body = health(running=2, prompt=5000, completion=77, compact=compact)
    s = wedge.parse_tensorfold_health(body)
    assert s == wedge.Sample(running=2, waiting=0, prompt_tokens=5000, generation_tokens=77)
    assert s.in_flight
    assert not wedge.parse_tensorfold_health(health()).in_flight


def test_ok_alone_is_not_progress_and_a_missing_counter_is_an_error() -> None:
    with pytest.raises(ValueError, match="lacks requests_running, prompt_tokens_total"):
        wedge.parse_tensorfold_health('{"ok": true, "backend": "tensorfold"}')
    body = snapshot(running=1)
    del body["completion_tokens_total"]
    with pytest.raises(ValueError, match="lacks completion_tokens_total"):
        wedge.parse_tensorfold_health(json.dumps(body))
    with pytest.raises(ValueError, match="not JSON"):
        wedge.parse_tensorfold_health("tensorfold:requests_running 1\n")
    with pytest.raises(ValueError, match="requests_running is not a number"):
        wedge.parse_tensorfold_health(json.dumps({**snapshot(), "requests_running": True}))


def test_the_parsers_are_named_as_the_stacks_declare_them() -> None:
    from sparkrig.engines import ENGINES, progress_parser
    from sparkrig.stacks import STACKS

    assert set(wedge.PARSERS) == {"vllm-metrics", "tensorfold-health"}
    assert {progress_parser(s) for s in STACKS.values()} <= set(wedge.PARSERS)
    assert {e.progress_parser for e in ENGINES.values()} <= set(wedge.PARSERS)


def read_tf(url: str) -> wedge.Sample:
    return wedge.read_metrics(url, parser="tensorfold-health")


def test_decoding_moves_the_completion_counter_every_probe(endpoint) -> None:
    clock, calls = wedge.StallClock(stall_s=300), []
    seen = []
    for step in range(10):
        endpoint.body = health(running=1, prompt=100, completion=40 * step)
        seen.append(wedge.probe(endpoint.url, clock, step * 60.0, canary_says(False, calls),
                                read=read_tf))  # fmt: skip
    assert {p.rule for p in seen} == {"progress"} and all(p.ok for p in seen) and calls == []


def test_a_wedged_tensorfold_rank_pair_is_a_stall(endpoint) -> None:
    """requests_running stays 1 and no token moves for stall_s: what a rank lost mid-request
    leaves rank 0 answering (research: a worker restarted alone leaves rank 0 up, requests hang)."""
    clock, calls = wedge.StallClock(stall_s=300), []
    endpoint.body = health(running=1, prompt=5000, completion=123)
    rules = [
        wedge.probe(endpoint.url, clock, t, canary_says(True, calls), read=read_tf)
        for t in (0, 60, 120, 180, 240, 300)
    ]
    assert [p.ok for p in rules] == [True, None, None, None, None, False]
    assert rules[-1].rule == "stall" and calls == []
    assert "running=1 waiting=0 prompt_tokens=5000 generation_tokens=123" in rules[-1].detail


def test_idle_tensorfold_means_the_canary(endpoint) -> None:
    clock, calls = wedge.StallClock(stall_s=300), []
    endpoint.body = health(running=0, prompt=5000, completion=123)
    p = wedge.probe(endpoint.url, clock, 0.0, canary_says(True, calls), read=read_tf)
    assert p.rule == "canary" and p.ok and calls == ["canary"]
    # the vLLM parser on TensorFold's page: unreadable, so the canary decides, never a stall
    p = wedge.probe(endpoint.url, clock, 60.0, canary_says(False, calls))
    assert p.rule == "canary" and not p.ok and "/metrics unreadable" in p.detail
