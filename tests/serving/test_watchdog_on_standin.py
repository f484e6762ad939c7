"""The watchdog's real probe (files/sparkhost/wedge.py, its canary command from sparkrig.gates)
against the lab's stand-in pair running on 127.0.0.1 with the argv the lab's ranks get.

The lab scenarios of issue 24 (tests/lab/test_lab.py), on a shorter clock: a wedge while a request
decodes (SIGUSR1 on the running head, what `docker kill -s USR1 sparkrig-rank0` sends in the lab)
is judged a stall after stall_s; a genuinely long prompt at a slow prefill rate (the lab's images
set STANDIN_PREFILL_TOK_S, lab/image.py) is never judged one; an idle engine gets the canary,
which passes while it serves and fails once it is wedged."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from serving_helpers import REPO, free_port, local_argv
from sparkhost import gate as gate_script
from sparkhost import pair, wedge

from sparkrig import gates
from sparkrig.profiles import serve_args

STANDIN = str(REPO / "lab" / "standin_vllm.py")
MODEL = "glm-5.3-flash"
# the lab's clock scaled down: stall_s 60 s, probes every 5 s, 1,450 tok/s prefill with 4096-token
# chunks (2.8 s a chunk), a 200K-token prompt (138 s, 2.3 stall windows). The probes judge on a
# clock of their own (Watch): INTERVAL_S per probe, however long this machine took between them.
STALL_S, INTERVAL_S = 1.5, 0.25
PREFILL_TOK_S = 20000  # a 4096-token chunk (the shared profile's batch) every 0.2 s
LONG_PROMPT = 160000  # 8 s of prefill: about 30 probes, 5 stall windows on the probes' clock
WAIT_S = 30.0  # how long a test waits for what it expects: a bound on a hang, never a speed


@dataclass
class Pair:
    url: str
    head: subprocess.Popen[str]
    lines: list[str]

    def canary(self, timeout: float) -> str:
        """The watchdog unit's probe command (sparkrig.helperunits renders it), run from here."""
        argv = gates.probe_command("/opt/sparkrig", int(self.url.rsplit(":", 1)[1]), MODEL,
                                   timeout=timeout)  # fmt: skip
        return shlex.join(local_argv(argv))


@pytest.fixture
def standin_pair(tmp_path: Path) -> Iterator[Pair]:
    """Head and worker as the lab's rank units start them (profile shared), the image's prefill
    rate in the environment; stopped afterwards."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    mport, aport = free_port(), free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "STANDIN_PREFILL_TOK_S": str(PREFILL_TOK_S)}
    procs: list[subprocess.Popen[str]] = []
    lines: list[str] = []

    def start(rank: int) -> subprocess.Popen[str]:
        argv = serve_args("shared", rank=rank, nnodes=2, master_addr="127.0.0.1",
                          master_port=mport, model_dir=str(model), engine_port=aport,
                          served_name=MODEL, host="127.0.0.1",
                          extra_args=["--standin-delay", "0.05"])  # fmt: skip
        p = subprocess.Popen([sys.executable, STANDIN, *argv[1:]], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, env=env)  # fmt: skip
        procs.append(p)
        if rank == 0:
            threading.Thread(target=lambda: lines.extend(p.stdout or []), daemon=True).start()
        return p

    try:
        head = start(0)
        start(1)
        deadline = time.monotonic() + 30
        while not any("Application startup complete" in ln for ln in lines):
            assert head.poll() is None and time.monotonic() < deadline, "".join(lines)
            time.sleep(0.05)
        yield Pair(f"http://127.0.0.1:{aport}", head, lines)
    finally:
        for p in procs:
            p.kill()
            p.wait(10)


def chat(url: str, content: str, timeout: float, **extra: Any) -> tuple[int, str]:
    payload = {"model": MODEL, "messages": [{"role": "user", "content": content}], **extra}
    return gate_script.http(url + "/v1/chat/completions", payload, timeout)


def in_background(fn: Any, *args: Any, **kw: Any) -> list[Any]:
    out: list[Any] = []
    threading.Thread(target=lambda: out.append(fn(*args, **kw)), daemon=True).start()
    return out


class Watch:
    """The watchdog's probe loop (pair.watchdog's, less the unit and the restart) on a clock of its
    own: each probe is INTERVAL_S after the one before, as the watchdog's probes are spaced by its
    interval. Read from the monotonic clock, a /metrics answer that this loaded machine took a
    second to give would be a second of stillness, a stall at this scale (stall_s 1.5 s); on the
    watchdog's (stall_s 60 s, a probe every 5 s) it is nothing. The engine's clock stays real: the
    pause between probes (INTERVAL_S) is longer than a prefill chunk takes."""

    def __init__(self, p: Pair, canary_timeout: float = 10.0) -> None:
        self.clock = wedge.StallClock(STALL_S)
        self.metrics_url = p.url + "/metrics"
        self.command = p.canary(canary_timeout)
        self.canaries = 0
        self.at = 0.0

    def canary(self) -> bool:
        self.canaries += 1
        return pair.canary(self.command)

    def probe(self) -> wedge.Probe:
        self.at += INTERVAL_S  # the probe's own clock reading
        seen = wedge.probe(self.metrics_url, self.clock, self.at, self.canary)
        time.sleep(INTERVAL_S)
        return seen

    def sample(self) -> wedge.Sample:
        return wedge.read_metrics(self.metrics_url)

    def wait_in_flight(self) -> wedge.Sample:
        """The first sample with a request in flight, within WAIT_S."""
        deadline = time.monotonic() + WAIT_S
        while not (got := self.sample()).in_flight:
            assert time.monotonic() < deadline, f"no request in flight within {WAIT_S:g} s: {got}"
            time.sleep(0.02)
        return got


def wait_answer(answer: list[Any], timeout: float) -> Any:
    """What the background request returned, once it has (its own timeout bounds the wait)."""
    deadline = time.monotonic() + timeout + WAIT_S
    while not answer:
        assert time.monotonic() < deadline, "the request never returned"
        time.sleep(0.02)
    return answer[0]


def test_an_idle_serving_pair_gets_the_canary_and_it_passes(standin_pair: Pair) -> None:
    watch = Watch(standin_pair)
    seen = watch.probe()
    assert (seen.rule, seen.ok, watch.canaries) == ("canary", True, 1), seen
    assert "idle: running=0 waiting=0" in seen.detail, seen.detail


def test_a_long_prompt_at_the_prefill_rate_is_watched_never_stalled(standin_pair: Pair) -> None:
    watch = Watch(standin_pair)
    prompt = "word " * (LONG_PROMPT - 3) + "17*23"  # the stand-in's tokenizer: 160,000 tokens
    started = time.monotonic()
    answer = in_background(chat, standin_pair.url, prompt, 120.0, max_tokens=16)
    # probed from its arrival to its end: no canary can be sent while it is in flight
    samples = [watch.wait_in_flight()]
    seen: list[wedge.Probe] = []
    while samples[-1].in_flight:
        seen.append(watch.probe())
        samples.append(watch.sample())
        assert time.monotonic() - started < 120.0, "still in flight past its request's timeout"
    status, body = wait_answer(answer, 120.0)
    held = time.monotonic() - started
    assert status == 200 and "391" in json.loads(body)["choices"][0]["message"]["content"]
    assert held >= LONG_PROMPT / PREFILL_TOK_S >= 2 * STALL_S
    rules = [s.rule for s in seen]
    assert "stall" not in rules, [s.detail for s in seen]
    # watched for two stall windows at least on the probes' clock, every probe but the last (which
    # may find it just ended) seeing it in flight; a canary at most then, never during it
    assert rules.count("progress") * INTERVAL_S >= 2 * STALL_S, rules
    assert set(rules[:-1]) == {"progress"} and rules.count("canary") == watch.canaries <= 1, rules
    # what the probe saw move: not the prompt counter (it moves when the prefill ends) but the KV
    # usage, chunk by chunk
    prefill = [
        s for s in samples if s.in_flight and s.generation_tokens == samples[0].generation_tokens
    ]
    counted = {s.prompt_tokens for s in prefill}
    assert len(counted) == 1, prefill
    kv = [s.kv_usage or 0.0 for s in prefill]
    assert kv == sorted(kv) and len(set(kv)) >= 5, kv
    assert watch.sample().prompt_tokens == counted.pop() + LONG_PROMPT


def test_a_wedge_while_a_request_decodes_is_a_stall_after_stall_s(standin_pair: Pair) -> None:
    watch = Watch(standin_pair)
    decoding = in_background(chat, standin_pair.url, "tell a story", 180.0, max_tokens=6000,
                             ignore_eos=True)  # 120 s at the stand-in's 50 tok/s  # fmt: skip
    deadline = time.monotonic() + WAIT_S
    while watch.sample().generation_tokens == 0:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    seen = watch.probe()
    assert (seen.rule, seen.ok) == ("progress", True), seen
    last_moving = watch.at  # the last probe that can have seen a step before the wedge
    standin_pair.head.send_signal(signal.SIGUSR1)  # the lab: docker kill -s USR1 sparkrig-rank0
    wedged_at = time.monotonic()
    before = watch.at  # the probe before the one that fires
    while (seen := watch.probe()).rule != "stall":
        assert seen.rule == "progress" and time.monotonic() - wedged_at < WAIT_S, seen
        before = watch.at
    assert watch.at - last_moving >= STALL_S, "stalled before stall_s of stillness"
    # the first probe past stall_s of stillness fires, on the probes' own clock readings (how
    # many seconds after the wedge that is depends on this machine's load: not asserted)
    still = watch.clock.since
    assert before - still < STALL_S <= watch.at - still, (before, watch.at, still)
    assert seen.ok is False and seen.detail.startswith("running=1 waiting=0 "), seen.detail
    assert watch.canaries == 0 and not decoding
    assert gate_script.http(standin_pair.url + "/health", None, 5.0)[0] == 200  # /health lies
    assert chat(standin_pair.url, "17*23", 1.0)[0] != 200  # and no completion answers


def test_a_wedge_while_idle_fails_the_canary(standin_pair: Pair) -> None:
    watch = Watch(standin_pair, canary_timeout=1.0)
    assert watch.probe().ok is True
    standin_pair.head.send_signal(signal.SIGUSR1)
    time.sleep(0.2)
    seen = watch.probe()
    assert (seen.rule, seen.ok) == ("canary", False), seen
    assert "idle: running=0 waiting=0" in seen.detail, seen.detail  # frozen at the idle report
