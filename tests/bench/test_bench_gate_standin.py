"""The release gate's measurement for real (sparkrig/benchgate.py ``run_short_bench``): the short
bench as the child process the deploy starts, against the lab's stand-in, judged as the gate
judges it."""

from __future__ import annotations

from pathlib import Path

from bench_helpers import MODEL, standin

from sparkrig import benchgate as bg

FAST = ("--standin-decode-tok-s", "400")


def test_the_gate_measures_the_standin_and_a_faster_previous_release_fails_it(
    tmp_path, monkeypatch
) -> None:
    """The gate's child-process bench measures a baseline; the same figures against a previous
    release twice as fast fail, naming both. Nothing here depends on the machine's load: whether
    the same release measured twice stays within 10% and the slow variant (STANDIN_SPEED=0.7)
    falls below 90% is a benchmark (bench/agreement, docs/bench.md)."""
    monkeypatch.setattr(bg, "RESULTS_DIR", tmp_path / "results")
    with standin(tmp_path, *FAST) as url:
        base = bg.run_short_bench(bg.Target(url, MODEL, None, "shared"), timeout_s=300)
    assert base["errors"] == [], base["errors"]
    assert Path(str(base["json_path"])).parent == tmp_path / "results"
    baseline, said = bg.verdict(base, {}, 0.10)
    assert baseline is not None, said
    assert "these are the baseline" in said
    speeds = ("single_stream_tok_s", "decode_tok_s.4")
    faster = {**baseline, **{k: 2 * baseline[k] for k in speeds}}
    slow, said = bg.verdict(base, faster, 0.10)
    assert slow is None
    assert "single-stream decode " in said and "is below 90% of the previous release's" in said
    assert f"{faster['single_stream_tok_s']:.2f} tok/s" in said
    again, said = bg.verdict(base, baseline, 0.10)
    assert again is not None, said  # the same figures pass


def test_a_bench_that_reaches_nothing_says_so(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(bg, "RESULTS_DIR", tmp_path)
    result = bg.run_short_bench(bg.Target("http://127.0.0.1:9", MODEL, None, "shared"), 120)
    figures, said = bg.verdict(result, {}, 0.10)
    assert figures is None and "the short bench measured no baseline" in said
