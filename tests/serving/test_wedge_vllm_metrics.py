"""The watchdog's /metrics parser (files/sparkhost/wedge.py) on text vLLM 0.33's own
PrometheusStatLogger renders (vllm/v1/metrics/loggers.py), fed as vLLM's API server feeds it
(vllm/v1/engine/async_llm.py output_handler: every engine step records the scheduler's stats; the
iteration stats are None for a step without request outputs, which is every chunk of a prefill but
its last: vllm/v1/core/sched/scheduler.py update_from_output emits no partial prefill output)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from sparkhost import wedge
from vllm_helpers import vllm_cpu


class _Config(SimpleNamespace):
    """A VllmConfig stand-in: the fields the logger reads; every other one unset (None)."""

    def __getattr__(self, name: str) -> Any:
        return None


@pytest.fixture(scope="module")
def vllm_metrics() -> Any:
    vllm_cpu()
    from prometheus_client import REGISTRY, generate_latest
    from vllm.config import ObservabilityConfig
    from vllm.v1.metrics.loggers import PrometheusStatLogger
    from vllm.v1.metrics.stats import IterationStats, PrefillStats, SchedulerStats

    config = _Config(
        observability_config=ObservabilityConfig(),
        model_config=SimpleNamespace(
            served_model_name="glm-5.3-flash", max_model_len=262144, is_diffusion=False
        ),
    )
    logger = PrometheusStatLogger(config)  # type: ignore[arg-type]

    def step(running: int, waiting: int, kv: float, prompt: int = 0, generated: int = 0) -> str:
        iteration = None
        if prompt or generated:  # a step with request outputs
            iteration = IterationStats()
            if prompt:
                stats = PrefillStats()
                stats.set(prompt, num_local_cached_tokens=0, num_external_cached_tokens=0)
                iteration.prompt_token_stats.update_from_output(stats)
            iteration.num_generation_tokens = generated
        logger.record(SchedulerStats(num_running_reqs=running, num_waiting_reqs=waiting,
                                     kv_cache_usage=kv), iteration)  # fmt: skip
        return str(generate_latest(REGISTRY).decode())

    return SimpleNamespace(step=step, render=lambda: generate_latest(REGISTRY).decode())


def test_vllms_own_exposition_parses(vllm_metrics):
    text = vllm_metrics.step(running=1, waiting=2, kv=0.25, prompt=1000, generated=7)
    assert "vllm:prompt_tokens_total{" in text  # the name wedge.py reads, as vLLM renders it
    s = wedge.parse_metrics(text)
    assert (s.running, s.waiting, s.kv_usage) == (1, 2, 0.25)
    assert s.prompt_tokens >= 1000 and s.generation_tokens >= 7


def test_a_chunked_prefill_moves_the_kv_gauge_not_the_prompt_counter_and_is_no_stall(
    vllm_metrics,
):
    """A 1M-token prefill in 2048-token chunks: vLLM records the prompt tokens once, at the end;
    meanwhile each step's KV usage moves, so the stall clock never runs out, however long."""
    before = wedge.parse_metrics(vllm_metrics.render())
    clock = wedge.StallClock(stall_s=300)
    samples = []
    for chunk in range(1, 489):
        text = vllm_metrics.step(running=1, waiting=0, kv=chunk / 489)
        if chunk % 4 == 0:  # the watchdog samples far less often than the engine steps
            samples.append(wedge.parse_metrics(text))
            assert clock.still_for(chunk * 15.0, samples[-1]) <= 60  # probes a minute apart
            assert clock.moved
    assert {s.prompt_tokens for s in samples} == {before.prompt_tokens}  # never moved
    last = wedge.parse_metrics(vllm_metrics.step(running=1, waiting=0, kv=1.0, prompt=1_000_000,
                                                 generated=1))  # fmt: skip
    assert last.prompt_tokens == before.prompt_tokens + 1_000_000


def test_an_engine_that_stopped_stepping_renders_the_same_text_and_stalls(vllm_metrics):
    vllm_metrics.step(running=2, waiting=1, kv=0.5, generated=3)
    clock = wedge.StallClock(stall_s=300)
    frozen = [wedge.parse_metrics(vllm_metrics.render()) for _ in range(3)]
    stalled = [clock.still_for(t, sample) for t, sample in zip((0, 150, 300), frozen, strict=True)]
    assert stalled == [0, 150, 300] and not clock.moved
