"""The release gate's measurement for real (sparkrig/benchgate.py ``run_short_bench``): the short
bench as the child process the deploy starts, against the lab's stand-in, judged as the gate
judges it."""

from __future__ import annotations

from dataclasses import replace
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


def test_a_standin_drafting_at_a_low_acceptance_is_held_by_the_gate(tmp_path, monkeypatch) -> None:
    """A stand-in whose drafter accepts 3% of its draft tokens, with a drafter lockfile named
    (the release loads one): two runs of the child-process bench read the acceptance from its
    /metrics, and the gate refuses the release naming the figure, the floor and the drafter
    files; the runs' JSON together holds the spread, the acceptance and the drafter. At 35%
    (the field's honest figure) the same gate lets it through."""
    import json

    monkeypatch.setattr(bg, "RESULTS_DIR", tmp_path / "results")
    lock = tmp_path / "incoai--GLM-5.3-Flash-DFlash2.lock.json"
    lock.write_text(json.dumps({"repo": "incoai/GLM-5.3-Flash-DFlash2", "commit": "7d74cdd8" * 5,
                                "files": [{"path": "model.safetensors", "size": 1,
                                           "sha256": "8931dc52" * 8}]}))  # fmt: skip
    drafter = tmp_path / "drafter"
    drafter.mkdir()
    spec = json.dumps({"method": "dflash", "model": str(drafter), "num_speculative_tokens": 7})
    target = bg.Target("", MODEL, None, "single", drafter_lock=str(lock), stack="vllm-nvfp4")
    said = {}
    for share in ("0.03", "0.35"):
        with standin(tmp_path, "--standin-decode-tok-s", "4000", "--speculative-config", spec,
                     env={"STANDIN_ACCEPTANCE": share}) as url:  # fmt: skip
            results = bg.run_short_benches(replace(target, url=url), 2, 300)
        assert [r["errors"] for r in results] == [[], []]
        said[share] = bg.verdict(results, {}, 0.10, 0.10)
    figures, why = said["0.03"]
    assert figures is None
    assert why.startswith("short bench held by the acceptance floor: drafter acceptance 3.0% is "
                          "below the floor 10% (bench_acceptance_min 0.1; drafter "
                          "incoai/GLM-5.3-Flash-DFlash2@7d74cdd87d74")  # fmt: skip
    figures, why = said["0.35"]
    assert figures is not None and figures["spec_acceptance"] == 0.35, why
    assert figures["runs"] == 2 and figures["single_stream_tok_s.p10"] is not None
    path = bg.write_gate_result(results, {"busbw_gbs": 12.1, "transport": "IB"})
    together = json.loads(Path(path).read_text())
    assert together["release_gate"]["runs"] == 2 and together["stack"] == "vllm-nvfp4"
    assert together["spread"]["single_stream_tok_s"]["n"] == 2
    assert together["spec_acceptance"] == 0.35 and together["fabric"]["busbw_gbs"] == 12.1
    assert together["drafter"]["weights_sha256"] == {"model.safetensors": "8931dc52" * 8}
