"""Seed 004's protocol (python3 -m sparkrig.bench --protocol seed004) against the lab's stand-in:
the requests are the seed's (line 1: "One streamed call each, temperature 0.2, 384 tokens, prompts
around 3.7k tokens"; line 7: prose, code at reasoning low and max, prefill from the same calls)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from bench_helpers import MODEL, read_figure, standin, within

from sparkrig.bench import Endpoint, seed004
from sparkrig.bench import __main__ as cli

# The prompt is sized with the server's /tokenize (two corrections): within 3% of 3,700 tokens
PROMPT_TOLERANCE = 0.03
FAST = ("--standin-decode-tok-s", "4000", "--standin-prefill-tok-s", "100000")


def run_seed004(tmp_path: Path) -> tuple[dict[str, Any], list[tuple[str, dict[str, Any]]]]:
    sent: list[tuple[str, dict[str, Any]]] = []
    with standin(tmp_path, *FAST) as url:
        ep = Endpoint(url, MODEL, record=lambda path, body: sent.append((path, body)))
        result = seed004.measure(ep, seed004.Seed004())
    return result, sent


def test_one_streamed_call_per_workload_at_temperature_02_and_384_tokens(tmp_path: Path) -> None:
    r, sent = run_seed004(tmp_path)
    assert not r["errors"], r["errors"]
    chats = [body for path, body in sent if path == "/v1/chat/completions"]
    assert len(chats) == 3  # one call each: prose, code at reasoning low, code at reasoning max
    for body in chats:
        assert body["temperature"] == 0.2 and body["max_tokens"] == 384
        assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
        assert not {"min_tokens", "ignore_eos"} & body.keys()  # a cap, not forced
    assert [b.get("reasoning_effort") for b in chats] == [None, "low", "max"]
    prose, code_low, code_max = (b["messages"][0]["content"] for b in chats)
    assert "next chapter" in prose and "def station_" in code_low and "def station_" in code_max
    assert code_low != code_max  # each opens with its own nonce: no prefix-cache hit
    assert any(path == "/tokenize" for path, _ in sent)


def test_each_prompt_is_about_37k_tokens_and_prefill_comes_from_the_same_calls(
    tmp_path: Path,
) -> None:
    r, _ = run_seed004(tmp_path)
    rows = {row["workload"]: row for row in r["workloads"]}
    assert list(rows) == ["prose", "code-low", "code-max"]
    for row in rows.values():
        assert within(row["prompt_tokens"], 3700, PROMPT_TOLERANCE), row  # the server's count
        assert row["prefill_tok_s"] == pytest.approx(row["prompt_tokens"] / row["ttft_s"], rel=0.01)
        assert row["decode_tok_s"] and row["completion_tokens"] <= 384
    assert r["prose_prefill_tok_s"] == rows["prose"]["prefill_tok_s"]
    assert r["code_prefill_tok_s"] == rows["code-low"]["prefill_tok_s"]  # first call on it
    assert r["prose_decode_tok_s"] == rows["prose"]["decode_tok_s"]
    assert r["code_max_decode_tok_s"] == rows["code-max"]["decode_tok_s"]


def test_the_command_records_protocol_and_stack_and_judges_the_stacks_own_figures(
    tmp_path: Path, capsys: object
) -> None:
    out = tmp_path / "run.json"
    with standin(tmp_path, *FAST) as url:
        rc = cli.main(["--url", url, "--model", MODEL, "--protocol", "seed004",
                       "--stack", "tensorfold", "--json", str(out)])  # fmt: skip
    assert rc == 0
    r = json.loads(out.read_text())
    assert (r["protocol_name"], r["stack"]) == ("seed004", "tensorfold")
    assert r["protocol"] == {"temperature": 0.2, "max_tokens": 384, "prompt_tokens": 3700}
    expected = {v["figure"]: v["expected"] for v in r["verdicts"]}
    assert expected == {"prose_decode_tok_s": 35.8, "code_low_decode_tok_s": 36.3,
                        "code_max_decode_tok_s": 44.6, "prose_prefill_tok_s": 1342.0,
                        "code_prefill_tok_s": 1364.0, "max_model_len": 1048576.0}  # fmt: skip
    read_figure(out.with_suffix(""))
    table = capsys.readouterr().out  # type: ignore[attr-defined]
    assert "stack tensorfold protocol seed004" in table and "code-max decode tok/s" in table


def test_seed000_options_are_refused_with_seed004() -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--url", "http://127.0.0.1:9", "--model", MODEL, "--protocol", "seed004",
                  "--streams", "2"])  # fmt: skip
    assert exit_.value.code == 2


def test_each_workload_has_its_own_acceptance_and_the_code_rows_seed_004s_tokens_per_step(
    tmp_path: Path,
) -> None:
    """/metrics read around each call: each row's drafter acceptance is its own call's, the
    code rows' mean acceptance length is what seed 004 line 9 calls tokens per step, and the
    run's acceptance is over all three calls."""
    spec = json.dumps({"method": "dflash", "model": str(tmp_path), "num_speculative_tokens": 7})
    with standin(tmp_path, *FAST, "--speculative-config", spec,
                 env={"STANDIN_ACCEPTANCE": "0.8"}) as url:  # fmt: skip
        r = seed004.measure(Endpoint(url, MODEL), seed004.Seed004())
    assert not r["errors"], r["errors"]
    for row in r["workloads"]:
        assert row["spec_acceptance"] == pytest.approx(0.8, abs=0.02), row
        assert row["spec_acceptance_length"] == pytest.approx(1 + 0.8 * 7, abs=0.15), row
    rows = {row["workload"]: row for row in r["workloads"]}
    assert r["code_low_acceptance_length"] == rows["code-low"]["spec_acceptance_length"]
    assert r["code_max_acceptance_length"] == rows["code-max"]["spec_acceptance_length"]
    total = sum(row["completion_tokens"] for row in r["workloads"])
    assert r["spec_decode"]["drafts"] + r["spec_decode"]["accepted_tokens"] == total
