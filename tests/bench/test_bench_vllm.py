"""The bench against vLLM 0.33's own code: every request it sends read by vLLM's request models,
and `vllm bench serve` measuring the same stand-in (importing vLLM costs ~30 s per process)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from bench_helpers import MODEL, REPO, standin, vllm_bench_serve, vllm_cpu, word_tokenizer

from sparkrig.bench import Endpoint, Protocol, measure, seed004
from sparkrig.scripts import load_script

engine = load_script("standin_engine", REPO / "lab" / "standin_engine.py")


def field_names(model: Any) -> set[str]:
    """What vLLM's OpenAIBaseModel counts as known (the rest it logs as ignored and drops)."""
    names = set(model.model_fields)
    names |= {f.alias for f in model.model_fields.values() if f.alias}
    return names


def test_every_request_the_bench_sends_is_read_whole_by_vllms_request_models(
    tmp_path: Path,
) -> None:
    vllm_cpu()
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.serve.tokenize.protocol import TokenizeChatRequest

    sent: list[tuple[str, dict[str, Any]]] = []
    proto = Protocol(decode_tokens=16, repeats=1, prompts=2, streams=(2,), contexts=(2048,),
                     fffd_tokens=64)  # fmt: skip
    with standin(tmp_path, "--standin-decode-tok-s", "5000") as url:
        r = measure(Endpoint(url, MODEL, record=lambda p, b: sent.append((p, b))), proto)
    assert not r["errors"], r["errors"]
    seen = set()
    for path, body in sent:
        model = {"/v1/chat/completions": ChatCompletionRequest, "/tokenize": TokenizeChatRequest}
        cls = model[path]
        req = cls.model_validate(body)  # a 400 from vLLM otherwise
        assert not set(body) - field_names(cls), f"vLLM ignores {set(body) - field_names(cls)}"
        if path == "/tokenize":
            seen.add("tokenize")
            continue
        n = body.get("max_completion_tokens", body.get("max_tokens"))
        sp = req.to_sampling_params(n, {})  # what the engine is given
        assert sp.temperature == 0 and sp.max_tokens == n
        assert req.chat_template_kwargs == {"enable_thinking": False}
        if body.get("tools"):
            assert req.tool_choice == "required" and not req.stream
            seen.add("tool")
        else:
            assert req.stream and req.stream_options is not None
            assert req.stream_options.include_usage  # the token counts come from usage
        if "survey ledger" in body["messages"][0]["content"]:  # a long prompt, its answer
            assert sp.min_tokens == sp.max_tokens == proto.context_decode_tokens  # forced
            assert sp.ignore_eos
            seen.add("prefill")
        elif body.get("min_tokens"):
            assert sp.min_tokens == sp.max_tokens == proto.decode_tokens or (
                sp.min_tokens == sp.max_tokens == proto.fffd_tokens
            )
            assert sp.ignore_eos
            seen.add("forced")
    assert seen == {"tokenize", "tool", "forced", "prefill"}


def test_vllm_reads_seed_004s_calls_whole_reasoning_max_included(tmp_path: Path) -> None:
    """Seed 004's calls as vLLM 0.33 takes them: temperature 0.2 and 384 tokens reach the engine,
    and reasoning "low" and "max" are efforts its request model accepts and that turn the chat
    template's thinking on (the prose call leaves the template's default alone)."""
    vllm_cpu()
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    sent: list[tuple[str, dict[str, Any]]] = []
    with standin(tmp_path, "--standin-decode-tok-s", "5000") as url:
        r = seed004.measure(Endpoint(url, MODEL, record=lambda p, b: sent.append((p, b))),
                            seed004.Seed004())  # fmt: skip
    assert not r["errors"], r["errors"]
    thinking = []
    for path, body in sent:
        if path != "/v1/chat/completions":
            continue
        req = ChatCompletionRequest.model_validate(body)  # a 400 from vLLM otherwise
        assert not set(body) - field_names(ChatCompletionRequest)
        sp = req.to_sampling_params(body["max_tokens"], {})
        assert sp.temperature == 0.2 and sp.max_tokens == 384 and sp.min_tokens == 0
        assert req.stream and req.stream_options and req.stream_options.include_usage
        kwargs = req.build_chat_params(None, "auto").chat_template_kwargs
        thinking.append((req.reasoning_effort, kwargs.get("enable_thinking")))
    assert thinking == [(None, None), ("low", True), ("max", True)]


def test_vllm_bench_serve_and_the_bench_both_complete_and_count_the_same_tokens(
    tmp_path: Path,
) -> None:
    """What does not depend on the machine's load: both clients finish every request and count
    256 tokens in each (the bench from the server's usage, vLLM's from its own count). Whether
    their tok/s agree is a benchmark: bench/agreement (docs/bench.md)."""
    vllm_cpu()  # the subprocess is vLLM; a missing vllm is a skip (and fails `make test`)
    tokenizer = word_tokenizer(tmp_path / "tokenizer")
    proto = Protocol(decode_tokens=256, repeats=2, prompts=1, streams=(4,), contexts=(),
                     tool=False, fffd_tokens=0)  # fmt: skip
    sent: list[int] = []
    flags = ("--standin-decode-tok-s", "300", "--standin-tokens-per-chunk", "2",
             "--max-num-seqs", "8")  # fmt: skip
    with standin(tmp_path, *flags) as url:
        ours = measure(
            Endpoint(url, MODEL, record=lambda p, b: sent.append(b["max_tokens"])), proto
        )
        theirs = vllm_bench_serve(url, tokenizer, tmp_path / "vb", 4, 8, 256)
    # no errors: every request's usage said 256 completion tokens (the bench checks each one)
    assert not ours["errors"], ours["errors"]
    assert sent == [256] * (2 + 2 * 4)  # 2 single-stream passes, 2 waves of 4
    assert ours["decode_tok_s"]["4"] and ours["per_stream_tok_s"]["4"]  # a figure, any figure
    assert theirs["completed"] == 8 and theirs["failed"] == 0
    assert theirs["total_output_tokens"] == 8 * 256
    assert theirs["output_throughput"] > 0 and theirs["median_tpot_ms"] > 0


def test_the_standin_refuses_min_over_max_with_vllms_own_message() -> None:
    vllm_cpu()
    from vllm import SamplingParams
    from vllm.exceptions import VLLMValidationError  # the API server answers it with a 400

    with pytest.raises(VLLMValidationError) as theirs:
        SamplingParams(max_tokens=5, min_tokens=10)
    with pytest.raises(engine.BadRequest) as ours:
        engine.output_length({"max_tokens": 5, "min_tokens": 10}, 10, 3, 1000)
    assert str(ours.value) == str(theirs.value)
