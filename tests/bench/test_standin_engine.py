"""The stand-in's engine (lab/standin_engine.py): vLLM 0.33's sampling limits, its /metrics
text and counters, the wedged and long-prefill modes, the slow variant's configured speed."""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
import requests
from bench_helpers import MODEL, REPO, standin, standin_process, vllm_package

from sparkrig.scripts import load_script

engine = load_script("standin_engine", REPO / "lab" / "standin_engine.py")


@pytest.mark.parametrize(
    ("req", "natural", "want"),
    [
        ({"max_tokens": 512, "min_tokens": 512, "ignore_eos": True}, 30, (512, "length")),
        ({"max_tokens": 512, "min_tokens": 512}, 30, (512, "length")),
        ({"max_tokens": 512, "min_tokens": 100}, 30, (100, "stop")),  # EOS held back to 100
        ({"max_tokens": 512}, 30, (30, "stop")),
        ({"max_tokens": 20}, 30, (20, "length")),
        ({"max_tokens": 9, "max_completion_tokens": 50, "ignore_eos": True}, 30, (50, "length")),
        ({"ignore_eos": True}, 30, (1000 - 10, "length")),  # max_model_len - prompt
    ],
)
def test_output_length_follows_vllms_limits(
    req: dict[str, Any], natural: int, want: tuple[int, str]
) -> None:
    assert engine.output_length(req, 10, natural, 1000) == want


def test_refusals_as_vllm() -> None:
    with pytest.raises(engine.BadRequest, match="min_tokens must be less than or equal to "
                       "max_tokens=5, got 10."):  # fmt: skip
        engine.output_length({"max_tokens": 5, "min_tokens": 10}, 10, 3, 1000)
    with pytest.raises(engine.BadRequest, match="maximum context length is 1000 tokens"):
        engine.output_length({}, 1001, 3, 1000)


def test_the_metrics_text_is_prometheus_clients() -> None:
    prometheus_client = vllm_package("prometheus_client")
    from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

    names = ["model_name", "engine"]
    reg = CollectorRegistry()
    values = {"running": 3, "waiting": 1, "kv": 0.0123, "prompt": 1234567, "gen": 89}
    Gauge("vllm:num_requests_running", "Number of requests in model execution batches.", names,
          registry=reg).labels(MODEL, "0").set(values["running"])  # fmt: skip
    Gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", names,
          registry=reg).labels(MODEL, "0").set(values["waiting"])  # fmt: skip
    Gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", names,
          registry=reg).labels(MODEL, "0").set(values["kv"])  # fmt: skip
    prometheus_client.disable_created_metrics()  # vLLM's multiprocess registry has no _created
    try:
        Counter("vllm:prompt_tokens", "Number of prefill tokens processed.", names,
                registry=reg).labels(MODEL, "0").inc(values["prompt"])  # fmt: skip
        Counter("vllm:generation_tokens", "Number of generation tokens processed.", names,
                registry=reg).labels(MODEL, "0").inc(values["gen"])  # fmt: skip
        theirs = generate_latest(reg).decode()
    finally:
        prometheus_client.enable_created_metrics()
    ours = engine.exposition(MODEL, [
        ("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.",
         values["running"]),
        ("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.",
         values["waiting"]),
        ("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.",
         values["kv"]),
        ("vllm:prompt_tokens", "counter", "Number of prefill tokens processed.", values["prompt"]),
        ("vllm:generation_tokens", "counter", "Number of generation tokens processed.",
         values["gen"]),
    ])  # fmt: skip
    assert ours == theirs


def metrics(url: str) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    text = requests.get(url + "/metrics", timeout=5).text
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}


def stream(url: str, body: dict[str, Any], out: list[Any]) -> None:
    try:
        with requests.post(url + "/v1/chat/completions", json=body, stream=True, timeout=30) as r:
            out.append(r.status_code)
            for line in r.iter_lines():
                if line.startswith(b"data: {"):
                    out.append(json.loads(line[6:]))
    except requests.RequestException as exc:  # the wedged server is killed under it
        out.append(exc)


T = TypeVar("T")
WAIT_S = 30.0  # how long a test waits for what it expects: a bound on a hang, never a speed


def wait_for(what: str, read: Callable[[], T], done: Callable[[T], object]) -> T:
    """``read()`` again until ``done`` holds for what it returned (that value), failing with the
    last one after WAIT_S: the tests wait for an event, never for a time."""
    deadline = time.monotonic() + WAIT_S
    while True:
        got = read()
        if done(got):
            return got
        assert time.monotonic() < deadline, f"{what}: never within {WAIT_S:g} s; last {got}"
        time.sleep(0.02)


def in_prefill(m: dict[str, float]) -> bool:
    """The request is in the engine and has not reached its first token."""
    return m["vllm:num_requests_running"] == 1 and m["vllm:generation_tokens_total"] == 0


def forced(prompt: str, n: int) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": prompt}], "max_tokens": n,
            "min_tokens": n, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip


def test_counters_move_as_vllms_the_prompt_once_at_the_first_token(tmp_path: Path) -> None:
    vllm_package("prometheus_client")  # metrics() parses with it
    # a 3 s prefill in 256-token chunks (one every 0.5 s): two reports of it, each the first
    # that shows one more chunk, are read inside it however slowly this machine answers
    flags = ("--standin-decode-tok-s", "50", "--standin-prefill-tok-s", "500",
             "--max-num-batched-tokens", "256")  # fmt: skip
    with standin(tmp_path, *flags) as url:
        out: list[Any] = []
        t = threading.Thread(target=stream, args=(url, forced("word " * 1500, 25), out))
        t.start()
        kv = "vllm:kv_cache_usage_perc"
        m1 = wait_for(
            "the first chunk", lambda: metrics(url), lambda m: m[kv] > 0 or not t.is_alive()
        )
        m2 = wait_for("the next chunk", lambda: metrics(url),
                      lambda m: m[kv] != m1[kv] or not t.is_alive())  # fmt: skip
        t.join()
        m3 = metrics(url)
    assert in_prefill(m1) and in_prefill(m2), (m1, m2)  # both read before the first token
    assert m1["vllm:num_requests_running"] == 1 and m1["vllm:num_requests_waiting"] == 0
    assert m1["vllm:prompt_tokens_total"] == m2["vllm:prompt_tokens_total"] == 0
    assert m2["vllm:generation_tokens_total"] == 0
    assert 0 < m1["vllm:kv_cache_usage_perc"] < m2["vllm:kv_cache_usage_perc"]  # chunk by chunk
    usage = out[-1]["usage"]
    assert usage == {"prompt_tokens": 1500, "completion_tokens": 25, "total_tokens": 1525}
    assert m3["vllm:prompt_tokens_total"] == 1500 and m3["vllm:generation_tokens_total"] == 25
    assert m3["vllm:num_requests_running"] == 0 and m3["vllm:kv_cache_usage_perc"] == 0


def test_wedged_health_200_no_token_ever_counters_frozen(tmp_path: Path) -> None:
    vllm_package("prometheus_client")  # metrics() parses with it
    flags = ("--standin-mode", "wedged", "--standin-wedge-after", "1",
             "--standin-decode-tok-s", "1000")  # fmt: skip
    with standin(tmp_path, *flags) as url:
        first: list[Any] = []
        stream(url, forced("hello", 10), first)
        assert first[0] == 200 and first[-1]["usage"]["completion_tokens"] == 10
        before = metrics(url)
        out: list[Any] = []
        t = threading.Thread(target=stream, args=(url, forced("hello", 10), out), daemon=True)
        t.start()
        wait_for("the headers", lambda: list(out), bool)
        time.sleep(1.0)  # where a token would come at 1000 tok/s (a late one is not seen)
        assert requests.get(url + "/health", timeout=5).status_code == 200
        assert out == [200]  # accepted, headers sent, not one chunk
        frozen = metrics(url)
        more: list[Any] = []  # no engine step reports it: the gauges stay at the last report
        threading.Thread(target=stream, args=(url, forced("again", 10), more), daemon=True).start()
        wait_for("the second request's headers", lambda: list(more), bool)
        assert metrics(url) == frozen and more == [200]
    assert frozen["vllm:generation_tokens_total"] == before["vllm:generation_tokens_total"] == 10
    assert frozen["vllm:prompt_tokens_total"] == before["vllm:prompt_tokens_total"]
    assert frozen["vllm:num_requests_running"] == 1  # the engine's last report, with the request


def test_sigusr1_wedges_a_serving_engine(tmp_path: Path) -> None:
    with standin_process(tmp_path, "--standin-decode-tok-s", "1000") as (url, proc):
        ok: list[Any] = []
        stream(url, forced("hello", 5), ok)
        assert ok[-1]["usage"]["completion_tokens"] == 5
        proc.send_signal(signal.SIGUSR1)
        time.sleep(0.3)
        out: list[Any] = []
        threading.Thread(target=stream, args=(url, forced("hello", 5), out), daemon=True).start()
        wait_for("the headers", lambda: list(out), bool)
        time.sleep(0.5)  # where the tokens would come at 1000 tok/s (late ones are not seen)
        assert out == [200] and requests.get(url + "/health", timeout=5).status_code == 200


def test_long_prefill_no_token_and_no_counter_move_until_it_ends(tmp_path: Path) -> None:
    vllm_package("prometheus_client")  # metrics() parses with it
    flags = ("--standin-mode", "long-prefill", "--standin-long-prefill-s", "2",
             "--standin-decode-tok-s", "1000", "--max-num-batched-tokens", "1024")  # fmt: skip
    with standin(tmp_path, *flags) as url:
        out: list[Any] = []
        t0 = time.monotonic()
        t = threading.Thread(target=stream, args=(url, forced("hello there", 5), out))
        t.start()
        kv = "vllm:kv_cache_usage_perc"
        early = wait_for("the first chunk", lambda: metrics(url),
                         lambda m: m[kv] > 0 or not t.is_alive())  # fmt: skip
        during = wait_for("the next chunk", lambda: metrics(url),
                          lambda m: m[kv] != early[kv] or not t.is_alive())  # fmt: skip
        t.join()
        elapsed = time.monotonic() - t0
        after = metrics(url)
    assert elapsed >= 2.0
    assert in_prefill(early) and in_prefill(during), (early, during)
    assert during["vllm:num_requests_running"] == 1 and during["vllm:prompt_tokens_total"] == 0
    # the engine steps on: KV usage grows chunk by chunk (what a watchdog can tell a wedge by)
    assert 0 < early["vllm:kv_cache_usage_perc"] < during["vllm:kv_cache_usage_perc"]
    assert after["vllm:prompt_tokens_total"] == 2 and after["vllm:generation_tokens_total"] == 5


def test_the_slow_variant_is_configured_30_percent_slower() -> None:
    """lab/image.py's lab-slow image sets STANDIN_SPEED=0.7: both rates 30% lower. That the
    bench measures it so is a benchmark (bench/agreement, docs/bench.md)."""
    env = {"STANDIN_SPEED": "0.7", "STANDIN_DECODE_TOK_S": "100", "STANDIN_PREFILL_TOK_S": "1000"}
    k = engine.knobs_from(lambda flag: None, env)
    assert (k.decode_tok_s, k.prefill_tok_s) == pytest.approx((70.0, 700.0))


def test_a_bad_knob_stops_the_start(tmp_path: Path) -> None:
    with pytest.raises(AssertionError, match="choose one of normal, wedged, long-prefill"):
        with standin(tmp_path, "--standin-mode", "stuck"):
            pass


SPEC = ("--speculative-config", json.dumps({"method": "mtp", "num_speculative_tokens": 4}))
SPEC_NAMES = ("vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total",
              "vllm:spec_decode_num_accepted_tokens_total")  # fmt: skip


def test_a_speculating_standin_counts_drafts_as_vllm_at_its_configured_acceptance(
    tmp_path: Path,
) -> None:
    """With a --speculative-config, /metrics carries vLLM's three spec-decode counters (parsed
    here by prometheus_client), consistent with the tokens generated: each step k = 4 draft
    tokens, the accepted ones plus one emitted, accepted / draft tokens the configured share;
    without one, none of them (vLLM registers them only when it speculates)."""
    vllm_package("prometheus_client")  # metrics() parses with it
    with standin(tmp_path, "--standin-decode-tok-s", "5000", *SPEC,
                 env={"STANDIN_ACCEPTANCE": "0.25"}) as url:  # fmt: skip
        zero = metrics(url)
        stream(url, forced("hello", 400), [])
        m = metrics(url)
    assert [zero[n] for n in SPEC_NAMES] == [0, 0, 0]
    drafts, draft, accepted = (m[n] for n in SPEC_NAMES)
    assert m["vllm:generation_tokens_total"] == 400 == drafts + accepted
    assert draft == 4 * drafts and accepted / draft == pytest.approx(0.25, abs=0.01)
    with standin(tmp_path, "--standin-decode-tok-s", "5000") as url:
        stream(url, forced("hello", 10), [])
        assert not set(SPEC_NAMES) & set(metrics(url))


def test_a_bad_acceptance_stops_the_start(tmp_path: Path) -> None:
    with pytest.raises(AssertionError, match="--standin-acceptance: must be 0 to 1, got '1.5'"):
        with standin(tmp_path, *SPEC, "--standin-acceptance", "1.5"):
            pass
