"""python3 -m sparkrig.bench against the lab's stand-in vLLM, whose rates are exact and known."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bench_helpers import MODEL, count_colour, read_figure, standin, within

from sparkrig.bench import (
    Endpoint,
    Protocol,
    expected,
    measure,
    published,
    short_bench,
    specdecode,
    stats,
)
from sparkrig.bench import __main__ as cli
from sparkrig.bench.protocol import decode_body, fffd_per_10k, recalled

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
        assert p["decode_tok_s"] > 0  # its forced 512 tokens timed: the long-context decode
    # three passes and three waves: their median and p10, the figure the median of
    assert r["spread"]["single_stream_tok_s"]["median"] == r["single_stream_tok_s"]
    assert r["spread"]["single_stream_tok_s"]["n"] == 3
    assert r["spread"]["decode_tok_s.4"]["p10"] <= r["decode_tok_s"]["4"]


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


SPEC = ("--speculative-config", json.dumps({"method": "mtp", "num_speculative_tokens": 4}))
SMALL = Protocol(decode_tokens=64, repeats=1, prompts=2, streams=(2,), contexts=(), tool=False,
                 fffd_tokens=0)  # fmt: skip


def counts(url: str, key: str) -> dict[str, float]:
    import requests

    text = requests.get(url + "/metrics", headers={"Authorization": f"Bearer {key}"}).text
    names = ("vllm:generation_tokens_total", *specdecode.COUNTERS)
    return {n: float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines() for n in names
            if ln.startswith(n + "{")}  # fmt: skip


def test_the_drafters_acceptance_is_read_from_metrics_over_the_run_only(tmp_path: Path) -> None:
    """A stand-in drafting at 20% acceptance, 4 tokens a step, that served 300 tokens before:
    the bench reads vLLM's spec-decode counters before and after its own run (with the key, as
    through the front) and reports the run's share, 20%, and its counts, the run's only: the
    drafts and accepted tokens add up to the tokens the run generated."""
    flags = ("--standin-decode-tok-s", "4000", "--api-key", "sk-spec", *SPEC)
    with standin(tmp_path, *flags, env={"STANDIN_ACCEPTANCE": "0.2"}) as url:
        ep = Endpoint(url, MODEL, "sk-spec")
        assert ep.chat_stream(decode_body(MODEL, "hi", 300)).completion_tokens == 300
        before = counts(url, "sk-spec")
        r = measure(ep, SMALL)
        after = counts(url, "sk-spec")
    assert not r["errors"], r["errors"]
    assert r["spec_acceptance"] == pytest.approx(0.2, abs=0.01)
    spec = r["spec_decode"]
    generated = after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"]
    assert generated == 4 * 64  # the run's two prompts and its wave of two
    assert spec["drafts"] + spec["accepted_tokens"] == generated
    assert spec["draft_tokens"] == 4 * spec["drafts"]
    assert r["spec_acceptance_length"] == pytest.approx(1 + spec["accepted_tokens"]
                                                        / spec["drafts"], abs=0.001)  # fmt: skip


def test_an_engine_that_does_not_speculate_has_no_acceptance_and_says_why(tmp_path: Path) -> None:
    with standin(tmp_path, "--standin-decode-tok-s", "4000") as url:
        r = measure(Endpoint(url, MODEL), SMALL)
    assert r["spec_acceptance"] is None and r["spec_acceptance_length"] is None
    assert "no spec-decode counters on /metrics" in r["spec_decode"]["note"]


def test_metrics_is_read_with_the_key_and_the_pairs_ca(monkeypatch) -> None:
    """/metrics goes through the API front, which asks for the key and speaks HTTPS with the
    pair's CA: the read sends the bench's key and verifies with its Endpoint's CA file."""
    seen: dict = {}

    class Answer:
        status_code, text = 200, ""

    def get(url, **kw):  # noqa: ANN001, ANN003, ANN202 - requests.get's shape
        seen.update(kw, url=url)
        return Answer()

    monkeypatch.setattr(specdecode.requests, "get", get)
    reading = specdecode.read(Endpoint("https://h:8000/v1", MODEL, "sk-x", verify="/ca.crt"))
    assert seen["url"] == "https://h:8000/metrics" and seen["verify"] == "/ca.crt"
    assert seen["headers"]["Authorization"] == "Bearer sk-x"
    assert "no spec-decode counters" in reading.why
    Answer.status_code = 401
    assert specdecode.read(Endpoint("https://h:8000", MODEL)).why == "/metrics answered HTTP 401"


def test_the_counters_are_summed_over_engines_and_a_restart_is_named() -> None:
    text = "\n".join([
        "# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.",
        'vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 10.0',
        'vllm:spec_decode_num_drafts_total{engine="1",model_name="m"} 5.0',
        'vllm:spec_decode_num_drafts_created{engine="0",model_name="m"} 1.7e9',
        'vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 60.0',
        'vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 21.0',
    ])  # fmt: skip
    assert specdecode.counters(text) == {specdecode.DRAFTS: 15.0, specdecode.DRAFT_TOKENS: 60.0,
                                         specdecode.ACCEPTED: 21.0}  # fmt: skip
    before = specdecode.Reading(specdecode.counters(text))
    after = specdecode.Reading({k: v / 3 for k, v in before.counts.items()})
    assert "went back" in specdecode.over(before, after)["spec_decode"]["note"]
    same = specdecode.over(before, before)
    assert same["spec_decode"]["note"] == "no draft tokens during the run"


def test_p10_lies_between_the_lowest_and_the_median() -> None:
    assert stats.percentile([30.0, 20.0, 40.0], 10) == pytest.approx(22.0)
    assert stats.spread([30.0]) == {"median": 30.0, "p10": 30.0, "n": 1}
    assert stats.spread([10.0, 20.0, 30.0, 40.0, 50.0]) == {"median": 30.0, "p10": 14.0, "n": 5}


def test_the_result_names_the_drafter_files_by_their_lockfile(tmp_path: Path) -> None:
    """--drafter-lock: the drafter's repo, commit, the lockfile's sha256 and each safetensors
    file's (the digest users compare: two revisions of one drafter accept differently), beside
    the acceptance, in the JSON and the table; a missing lockfile stops before measuring."""
    import hashlib

    lock = tmp_path / "incoai--GLM-5.3-Flash-DFlash2.lock.json"
    lock.write_text(json.dumps({"repo": "incoai/GLM-5.3-Flash-DFlash2", "commit": "7d74cdd8" * 5,
                                "files": [{"path": "config.json", "size": 9, "git_sha1": "ab"},
                                          {"path": "model.safetensors", "size": 9,
                                           "sha256": "8931dc52" * 8}]}))  # fmt: skip
    out = tmp_path / "r.json"
    with standin(tmp_path, "--standin-decode-tok-s", "4000", *SPEC) as url:
        argv = ["--url", url, "--model", MODEL, "--short", "--json", str(out), "--drafter-lock",
                str(lock)]  # fmt: skip
        assert cli.main(argv) == 0
        assert cli.main([*argv[:-1], str(tmp_path / "none.json")]) == 2
    r = json.loads(out.read_text())
    assert r["drafter"] == {
        "repo": "incoai/GLM-5.3-Flash-DFlash2", "commit": "7d74cdd8" * 5, "lockfile": str(lock),
        "lockfile_sha256": hashlib.sha256(lock.read_bytes()).hexdigest(),
        "weights_sha256": {"model.safetensors": "8931dc52" * 8},
    }  # fmt: skip
    assert r["spec_acceptance"] == pytest.approx(0.35, abs=0.01)  # the stand-in's default
    from sparkrig.bench import report

    table = report.table(r)
    assert "drafter acceptance" in table and "incoai/GLM-5.3-Flash-DFlash2@7d74cdd87d74" in table
    assert "model.safetensors 8931dc528931" in table
