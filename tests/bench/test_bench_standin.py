"""python3 -m sparkrig.bench against the lab's stand-in vLLM, whose rates are exact and known."""

from __future__ import annotations

import json
from pathlib import Path

from bench_helpers import MODEL, count_colour, read_figure, standin, within

from sparkrig.bench import Endpoint, Protocol, expected, measure, published, short_bench
from sparkrig.bench import __main__ as cli
from sparkrig.bench.protocol import fffd_per_10k, recalled

DECODE, PREFILL = 250.0, 8000.0
RATES = Protocol(decode_tokens=400, repeats=3, prompts=1, streams=(2, 4),
                 contexts=(8192, 16384), tool=False, fffd_tokens=0)  # fmt: skip


def test_the_bench_counts_every_forced_token_and_sizes_each_prompt(tmp_path: Path) -> None:
    """What does not depend on the machine's load: every request ends with exactly its forced
    token count from usage (several tokens per chunk, as speculative decoding sends them), each
    prompt is sized with /tokenize and recalled. Whether the rates come out as configured is a
    benchmark: bench/agreement (docs/bench.md)."""
    flags = ("--standin-decode-tok-s", str(DECODE), "--standin-prefill-tok-s", str(PREFILL),
             "--standin-tokens-per-chunk", "3")  # fmt: skip
    with standin(tmp_path, *flags) as url:
        r = measure(Endpoint(url, MODEL), RATES)
    assert not r["errors"], r["errors"]  # each request's usage said its forced 400 tokens
    assert r["single_stream_tok_s"] and sorted(r["decode_tok_s"]) == ["1", "2", "4"]
    assert [p["target_tokens"] for p in r["prefill"]] == [8192, 16384]
    for p in r["prefill"]:
        assert within(p["prompt_tokens"], p["target_tokens"], 0.02), p  # sized with /tokenize
        assert p["prefill_tok_s"] and p["recall"] is True


def test_the_bench_counts_fffd_per_10k_characters_of_the_japanese_answer(tmp_path: Path) -> None:
    proto = Protocol(decode_tokens=8, repeats=1, prompts=1, streams=(), contexts=(), tool=False,
                     fffd_tokens=4000)  # fmt: skip
    with standin(tmp_path, "--standin-decode-tok-s", "20000", "--standin-fffd-per-10k", "5") as url:
        r = measure(Endpoint(url, MODEL), proto)
    assert r["fffd_chars"] == 4000 and r["fffd_count"] == 2, r  # one per character token
    assert r["fffd_per_10k_chars"] == 5.0


def test_fffd_and_recall_arithmetic() -> None:
    assert fffd_per_10k("") is None
    assert fffd_per_10k("字" * 9999 + "\ufffd") == 1.0
    assert fffd_per_10k("字" * 4998 + "\ufffd\ufffd") == 4.0
    assert recalled("ORCHID-1A2B3C", "The secret keyword is orchid-1a2b3c.")
    assert not recalled("ORCHID-1A2B3C", "The secret keyword is ORCHID-1A2B3D.")
    assert not recalled("ORCHID-1A2B3C", "")


JSON_NAMES = {"single_stream_tok_s", "decode_tok_s", "prefill", "tool_call_ok",
              "fffd_per_10k_chars"}  # fmt: skip


def check_names(r: dict) -> None:
    assert JSON_NAMES <= r.keys()
    assert isinstance(r["single_stream_tok_s"], float)
    assert r["decode_tok_s"] and all(isinstance(k, str) and isinstance(v, float)
                                     for k, v in r["decode_tok_s"].items())  # fmt: skip
    for p in r["prefill"]:
        assert {"prompt_tokens", "ttft_s", "prefill_tok_s", "recall"} <= p.keys()
    assert r["tool_call_ok"] is True
    assert isinstance(r["fffd_per_10k_chars"], float)


def test_the_command_writes_one_json_with_the_names_a_table_and_a_figure(
    tmp_path: Path, capsys: object
) -> None:
    key = tmp_path / "api-key"
    key.write_text("sk-bench-test\n")
    flags = ("--standin-decode-tok-s", "2000", "--standin-prefill-tok-s", "200000",
             "--api-key", "sk-bench-test")  # fmt: skip
    with standin(tmp_path, *flags) as url:
        argv = ["--url", url, "--model", MODEL, "--api-key-file", str(key), "--profile", "shared",
                "--results-dir", str(tmp_path / "results"), "--decode-tokens", "64",
                "--repeats", "1", "--prompts", "2", "--streams", "2,8", "--contexts", "2K,4K",
                "--fffd-tokens", "500"]  # fmt: skip
        rc = cli.main(argv)
    assert rc == 0
    out = capsys.readouterr().out  # type: ignore[attr-defined]
    runs = list((tmp_path / "results").glob("bench-*-shared.json"))
    assert len(runs) == 1
    r = json.loads(runs[0].read_text())
    check_names(r)
    assert sorted(r["decode_tok_s"]) == ["1", "2", "8"]
    assert [p["target_tokens"] for p in r["prefill"]] == [2048, 4096]
    figures = {v["figure"] for v in r["verdicts"]}
    assert figures == {"single_stream_tok_s", "decode_tok_s.2", "decode_tok_s.8",
                       "fffd_per_10k_chars"}  # fmt: skip
    assert "decode_tok_s.8" in out and "76.4" in out and "seed 000" in out
    pixels, _ = read_figure(runs[0].with_suffix(""))
    assert pixels.shape[:2] == (420, 1500)  # three panels, 15 x 4.2 inches at 100 dpi
    assert count_colour(pixels, (31, 119, 180)) > 500  # the measured lines (tab:blue) are drawn


def test_the_short_bench_has_the_same_names(tmp_path: Path) -> None:
    with standin(tmp_path, "--standin-decode-tok-s", "4000") as url:
        r = short_bench(Endpoint(url, MODEL))
    assert not r["errors"], r["errors"]
    check_names(r)
    assert sorted(r["decode_tok_s"]) == ["1", "4"] and r["prefill"] == []


def test_verdicts_set_each_figure_against_its_seed_with_causes_when_short() -> None:
    result = {"single_stream_tok_s": 20.0, "decode_tok_s": {"2": 39.0}, "ttft_p50_s": 0.5,
              "prefill": [{"prefill_tok_s": 1400.0}, {"prefill_tok_s": 1000.0}]}  # fmt: skip
    rows = {(v["figure"], v["source"][:8]): v for v in expected.verdicts(result, "single", 0.1)}
    assert rows[("single_stream_tok_s", "seed 000")]["status"] == "short"
    assert "speculation" in rows[("single_stream_tok_s", "seed 000")]["causes"]
    # seed 003's figures are sfxnz-v13's (its declaration), judged on a run of that stack
    sfxnz = published.figures_for({"stack": "sfxnz-v13", "protocol_name": "seed000"})
    rows3 = {(v["figure"], v["source"][:8]): v for v in expected.verdicts_of(sfxnz, result, 0.1)}
    assert rows3[("decode_tok_s.2", "seed 003")]["status"] == "within"
    assert rows3[("ttft_p50_s", "seed 003")]["status"] == "short"  # 0.5 s against 0.26 s
    assert rows3[("ttft_p50_s", "seed 003")]["causes"] == ""  # the causes are vllm-nvfp4's
    assert not any(source == "seed 003" for _, source in rows)  # not today's recipe's
    assert rows[("prefill_tok_s", "seed 000")]["measured"] == 1000.0  # the worst context
    assert rows[("prefill_tok_s", "seed 000")]["status"] == "short"
    guard = expected.verdicts({"single_stream_tok_s": 14.0, "fffd_per_10k_chars": 0.0}, "guard",
                              0.1)  # fmt: skip
    assert [v["status"] for v in guard] == ["within", "within"]
    leak = expected.verdicts({"fffd_per_10k_chars": 0.4}, "guard", 0.1)
    assert [v["status"] for v in leak] == ["not measured", "short"]
    assert expected.verdicts(result, None, 0.1) == []
