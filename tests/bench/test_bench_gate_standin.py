"""The release gate's measurement for real (sparkrig/benchgate.py ``run_short_bench``): the short
bench as the child process the deploy starts, against the lab's stand-in and its slow variant
(STANDIN_SPEED=0.7, lab/image.py), judged as the gate judges it."""

from __future__ import annotations

from pathlib import Path

import pytest
from bench_helpers import MODEL, standin

from sparkrig import benchgate as bg

# Fast enough for the suite (about 15 s a bench), slow enough that neither the stand-in nor the
# client is CPU-bound on a loaded 2-core machine: at 1500 tok/s the same stand-in measured 5748
# then 5042 tok/s at 4 streams, 12% apart, in one run of the suite there.
FAST = ("--standin-decode-tok-s", "400")


def measured(tmp_path: Path, speed: str) -> dict[str, object]:
    with standin(tmp_path / speed, *FAST, env={"STANDIN_SPEED": speed}) as url:
        return bg.run_short_bench(bg.Target(url, MODEL, None, "shared"), timeout_s=300)


def test_the_slow_variant_fails_the_gate_naming_both_figures(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(bg, "RESULTS_DIR", tmp_path / "results")
    (tmp_path / "1").mkdir()
    (tmp_path / "0.7").mkdir()
    base = measured(tmp_path, "1")
    assert base["errors"] == [], base["errors"]
    baseline, said = bg.verdict(base, {}, 0.10)
    assert baseline is not None, said
    assert baseline["single_stream_tok_s"] == pytest.approx(400, rel=0.05)
    assert Path(str(base["json_path"])).parent == tmp_path / "results"
    again, said = bg.verdict(measured(tmp_path, "1"), baseline, 0.10)
    assert again is not None, said  # the same release measured again is within 10%
    slow, said = bg.verdict(measured(tmp_path, "0.7"), baseline, 0.10)
    assert slow is None
    assert "single-stream decode " in said and "is below 90% of the previous release's" in said
    assert f"{baseline['single_stream_tok_s']:.2f} tok/s" in said


def test_a_bench_that_reaches_nothing_says_so(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(bg, "RESULTS_DIR", tmp_path)
    result = bg.run_short_bench(bg.Target("http://127.0.0.1:9", MODEL, None, "shared"), 120)
    figures, said = bg.verdict(result, {}, 0.10)
    assert figures is None and "the short bench measured no baseline" in said
