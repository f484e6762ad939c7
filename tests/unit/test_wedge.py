"""The watchdog's probe (files/sparkhost/wedge.py): /metrics parsed, a long prefill told from a
stall, the canary only while idle, and the last-probe file status.py reads. The parser on the text
vLLM 0.33's own PrometheusStatLogger renders: tests/serving/test_wedge_vllm_metrics.py."""

from __future__ import annotations

import http.server
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest
from sparkhost import pair, wedge

from sparkrig.hostpkg import SOURCE

METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",model_name="glm-5.3-flash"}} {running}
vllm:num_requests_waiting{{engine="0",model_name="glm-5.3-flash"}} {waiting}
vllm:num_requests_waiting_by_reason{{engine="0",model_name="glm-5.3-flash",reason="capacity"}} 9.0
vllm:kv_cache_usage_perc{{engine="0",model_name="glm-5.3-flash"}} {kv}
vllm:prompt_tokens_total{{engine="0",model_name="glm-5.3-flash"}} {prompt}
vllm:prompt_tokens_cached_total{{engine="0",model_name="glm-5.3-flash"}} 77.0
vllm:generation_tokens_total{{engine="0",model_name="glm-5.3-flash"}} {gen}
vllm:generation_tokens_created{{engine="0",model_name="glm-5.3-flash"}} 1.7e+09
"""


def text(running=0, waiting=0, kv=0.0, prompt=0, gen=0) -> str:
    return METRICS.format(running=running, waiting=waiting, kv=kv, prompt=prompt, gen=gen)


class FakeMetrics:
    """A /metrics endpoint on loopback whose body a test sets."""

    def __init__(self) -> None:
        fake = self
        self.body = text()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                data = fake.body.encode()
                self.send_response(200 if self.path in ("/metrics", "/health") else 404)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *a) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/metrics"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def metrics() -> Iterator[FakeMetrics]:
    m = FakeMetrics()
    yield m
    m.close()


def test_the_parser_takes_exact_names_and_sums_engines():
    two_engines = text(running=1, waiting=2, kv=0.25, prompt=1000, gen=7) + (
        'vllm:num_requests_running{engine="1",model_name="glm-5.3-flash"} 2.0\n'
        'vllm:prompt_tokens_total{engine="1",model_name="glm-5.3-flash"} 24.0\n'
    )
    s = wedge.parse_metrics(two_engines)
    # waiting_by_reason, prompt_tokens_cached and *_created are other metrics, not these
    assert s == wedge.Sample(running=3, waiting=2, prompt_tokens=1024, generation_tokens=7,
                             kv_usage=0.25)  # fmt: skip
    assert s.in_flight


def test_the_older_kv_gauge_name_is_read_and_a_missing_counter_is_an_error():
    old = text(kv=0.5).replace("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
    assert wedge.parse_metrics(old).kv_usage == 0.5
    with pytest.raises(ValueError, match="lacks vllm:generation_tokens_total"):
        wedge.parse_metrics(text().replace("vllm:generation_tokens_total", "x"))


def canary_says(ok: bool, calls: list[str]):
    def run() -> bool:
        calls.append("canary")
        return ok

    return run


def test_a_long_prefill_moving_only_the_kv_gauge_is_never_a_stall(metrics):
    """vLLM's prompt counter moves only when a prefill ends; each chunk moves the KV gauge."""
    clock, calls = wedge.StallClock(stall_s=300), []
    seen = []
    for step in range(0, 20):  # 20 probes 60 s apart: 1140 s of one prefill
        metrics.body = text(running=1, kv=0.01 * step)
        seen.append(wedge.probe(metrics.url, clock, step * 60.0, canary_says(False, calls)))
    assert {p.rule for p in seen} == {"progress"} and calls == []  # no canary while in flight
    assert all(p.ok for p in seen)


def test_work_in_flight_that_moves_nothing_for_stall_s_is_a_stall(metrics):
    clock, calls = wedge.StallClock(stall_s=300), []
    metrics.body = text(running=1, waiting=1, kv=0.4, prompt=5000, gen=123)
    rules = []
    for t in (0, 60, 120, 180, 240, 299, 300):
        rules.append(wedge.probe(metrics.url, clock, t, canary_says(True, calls)))
    assert [p.ok for p in rules] == [True, None, None, None, None, None, False]
    assert rules[-1].rule == "stall" and calls == []
    assert "running=1 waiting=1 prompt_tokens=5000 generation_tokens=123" in rules[-1].detail
    assert "nothing moved for 300 s (stall_s 300)" in rules[-1].detail


def test_idle_means_the_canary_and_an_unreadable_metrics_endpoint_too(metrics):
    clock, calls = wedge.StallClock(stall_s=300), []
    metrics.body = text()
    p = wedge.probe(metrics.url, clock, 0, canary_says(False, calls))
    assert (p.rule, p.ok, calls) == ("canary", False, ["canary"])
    assert "idle: running=0 waiting=0" in p.detail
    url = metrics.url.replace("/metrics", "/nothing-here")  # 404
    p = wedge.probe(url, clock, 60, canary_says(True, calls))
    assert (p.rule, p.ok) == ("canary", True) and "/metrics unreadable" in p.detail


def test_idle_in_between_restarts_the_stall_clock(metrics):
    clock = wedge.StallClock(stall_s=100)
    metrics.body = text(running=1, prompt=10)
    assert wedge.probe(metrics.url, clock, 0, lambda: True).ok is True
    metrics.body = text(prompt=10)
    assert wedge.probe(metrics.url, clock, 60, lambda: True).rule == "canary"
    metrics.body = text(running=1, prompt=10)  # the same values as 120 s ago: a new request
    assert wedge.probe(metrics.url, clock, 120, lambda: True).ok is True
    # it came after the idle probe at 60 s: nothing moved since then at the latest
    assert wedge.probe(metrics.url, clock, 159, lambda: True).ok is None
    assert wedge.probe(metrics.url, clock, 160, lambda: True).rule == "stall"


def test_a_wedge_is_declared_within_stall_s_plus_one_interval_of_the_last_move():
    """Probes every 60 s; the engine last stepped just after the probe at 120 s: the stall is
    declared at the first probe at least stall_s after 120 s, i.e. by 120 + 300 + 60."""
    clock = wedge.StallClock(stall_s=300)
    moving = [wedge.Sample(1, 0, 0, g, 0.1) for g in range(3)]  # probes at 0, 60, 120
    for t, sample in zip((0, 60, 120), moving, strict=True):
        clock.still_for(t, sample)
    frozen = wedge.Sample(1, 0, 0, 99, 0.1)  # moved once more after 120 s, then never again
    still = {t: clock.still_for(t, frozen) for t in range(180, 600, 60)}
    first_stall = min(t for t, s in still.items() if s >= 300)
    assert first_stall == 420 and first_stall - 120 <= 300 + 60
    assert still[360] == 240  # never declared on less than stall_s of stillness since a probe


def test_the_probe_file_written_is_the_one_status_reads(tmp_path):
    path = wedge.probe_file(str(tmp_path / "run"))
    p = wedge.Probe("stall", False, "running=1 waiting=0; nothing moved for 301 s", at=1000.0)
    wedge.write_probe(path, p)
    with open(path, encoding="utf-8") as f:
        back = wedge.parse_probe(f.read().strip())
    assert back == p
    assert back.text(now=1042) == (
        "stall FAILED (running=1 waiting=0; nothing moved for 301 s, 42 s ago)"
    )
    with pytest.raises(ValueError, match="watchdog probe file"):
        wedge.parse_probe('{"rule": "stall"}')


def test_the_watchdog_restarts_at_once_on_a_stall_and_counts_canary_failures():
    p = pair.WatchdogPolicy(fails=3, grace=60, max_restarts=3, window=3600)
    assert p.observe(0, True, None) == ""
    assert p.observe(30, True, None, health_ok=True, stalled=True) == ""  # within grace
    assert p.observe(61, True, None, stalled=False) == ""  # in flight, watching
    assert p.observe(62, True, None, stalled=True) == "restart"
    p = pair.WatchdogPolicy(fails=3, grace=0, max_restarts=3, window=3600)
    assert p.observe(0, True, None, health_ok=True) == ""
    assert [p.observe(t, True, False) for t in (1, 2, 3)] == ["", "", "restart"]


def test_a_wedged_engine_is_restarted_in_order_and_the_journal_names_rule_and_counters(
    metrics, tmp_path
):
    """The watchdog job itself, against a /health that answers 200 and a /metrics whose request
    in flight never moves: it stops and starts the head (systemctl faked) and says why, with the
    counters' values (how soon is the lab's to measure: tests/lab)."""
    bindir, log, run = tmp_path / "bin", tmp_path / "systemctl.log", tmp_path / "run"
    bindir.mkdir()
    (bindir / "systemctl").write_text(
        "#!/bin/sh\n"
        'if [ "$1" = show ]; then printf "ActiveState=active\\nResult=success\\n"; exit 0; fi\n'
        f'echo "$@" >> {log}\n'
    )
    (bindir / "systemctl").chmod(0o755)
    (tmp_path / "token").write_text("0123456789abcdef" * 3 + "\n")  # 48, as deploys make
    metrics.body = text(running=1, kv=0.3, prompt=4096, gen=17)
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}", "SPARKRIG_RUN_DIR": str(run)}
    health = metrics.url.replace("/metrics", "/health")
    proc = subprocess.Popen(
        [sys.executable, str(SOURCE), "pair", "watchdog", "--head-unit", "sparkrig-head.service",
         "--workers", "", "--port", "1", "--agent-port", "1", "--token-file",
         str(tmp_path / "token"), "--probe", "exit 0", "--health-url", health,
         "--metrics-url", metrics.url, "--stall", "2", "--interval", "0.2", "--grace", "0"],
        env=env, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout or []), daemon=True)
    reader.start()  # a watchdog that says nothing must fail the test, not hang it
    try:
        start = time.monotonic()
        while not any("restarting the pair in order" in x for x in list(lines)):
            assert time.monotonic() - start < 60, lines
            time.sleep(0.1)
        deadline = time.monotonic() + 10
        while "--no-block start" not in (log.read_text() if log.exists() else ""):
            assert time.monotonic() < deadline, "the head was never started again"
            time.sleep(0.1)
    finally:
        proc.terminate()
        proc.wait(10)
    fired = next(x for x in lines if "fired" in x)
    assert "rule stall fired: running=1 waiting=0 prompt_tokens=4096 generation_tokens=17" in fired
    assert re.search(r"kv_cache_usage=0\.3; nothing moved for \d+ s \(stall_s 2\)", fired), fired
    assert log.read_text().splitlines() == [
        "stop sparkrig-head.service",
        "--no-block start sparkrig-head.service",
    ]
    with open(wedge.probe_file(str(run)), encoding="utf-8") as f:
        assert wedge.parse_probe(f.read()).rule == "stall"
