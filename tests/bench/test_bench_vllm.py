"""The bench against vLLM 0.33's own code: every request it sends read by vLLM's request models,
and `vllm bench serve` measuring the same stand-in (importing vLLM costs ~30 s per process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from bench_helpers import MODEL, standin, within, word_tokenizer

from sparkrig.bench import Endpoint, Protocol, measure
from sparkrig.scripts import load_script

REPO = Path(__file__).resolve().parents[2]
engine = load_script("standin_engine", REPO / "lab" / "standin_engine.py")
# vLLM imported as tests/serving imports it: its platform set to the CPU one before anything of
# vLLM reads it (vllm.utils.torch_utils decides pinned memory at import; imported first from here,
# it broke tests/serving's runner tests in the same process)
vllm_cpu = load_script("vllm_helpers", REPO / "tests" / "serving" / "vllm_helpers.py").vllm_cpu


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
        if body.get("min_tokens"):
            assert sp.min_tokens == sp.max_tokens == proto.decode_tokens or (
                sp.min_tokens == sp.max_tokens == proto.fffd_tokens
            )
            assert sp.ignore_eos
            seen.add("forced")
        elif not body.get("tools"):
            seen.add("prefill")
    assert seen == {"tokenize", "tool", "forced", "prefill"}


def vllm_bench_serve(url: str, tokenizer: Path, out: Path, concurrency: int, prompts: int,
                     output_len: int) -> dict[str, Any]:  # fmt: skip
    """`vllm bench serve` (vLLM's own CLI, as `vllm bench serve` runs it), openai-chat backend,
    random prompts from the local tokenizer, forced output length; its saved result."""
    argv = [sys.executable, "-m", "vllm.entrypoints.cli.main", "bench", "serve",
            "--backend", "openai-chat", "--base-url", url, "--endpoint", "/v1/chat/completions",
            "--model", MODEL, "--tokenizer", str(tokenizer), "--dataset-name", "random",
            "--random-input-len", "32", "--random-output-len", str(output_len),
            "--num-prompts", str(prompts), "--max-concurrency", str(concurrency),
            "--ignore-eos", "--temperature", "0", "--num-warmups", "0", "--save-result",
            "--result-dir", str(out), "--result-filename", "result.json"]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result: dict[str, Any] = json.loads((out / "result.json").read_text())
    return result


def test_vllm_bench_serve_agrees_with_the_bench_within_5_percent(tmp_path: Path) -> None:
    vllm_cpu()  # the subprocess is vLLM; a missing vllm is a skip (and fails `make test`)
    tokenizer = word_tokenizer(tmp_path / "tokenizer")
    proto = Protocol(decode_tokens=256, repeats=2, prompts=1, streams=(4,), contexts=(),
                     tool=False, fffd_tokens=0)  # fmt: skip
    flags = ("--standin-decode-tok-s", "300", "--standin-tokens-per-chunk", "2",
             "--max-num-seqs", "8")  # fmt: skip
    with standin(tmp_path, *flags) as url:
        ours = measure(Endpoint(url, MODEL), proto)
        theirs = vllm_bench_serve(url, tokenizer, tmp_path / "vb", 4, 8, 256)
    assert not ours["errors"], ours["errors"]
    assert theirs["completed"] == 8 and theirs["total_output_tokens"] == 8 * 256
    print(f"output tok/s at 4 streams: bench {ours['decode_tok_s']['4']}, vllm bench serve "
          f"{theirs['output_throughput']:.2f}; per stream: bench {ours['per_stream_tok_s']['4']}, "
          f"vllm bench 1000/median TPOT {1000 / theirs['median_tpot_ms']:.2f}")  # fmt: skip
    assert within(ours["decode_tok_s"]["4"], theirs["output_throughput"], 0.05)
    assert within(ours["per_stream_tok_s"]["4"], 1000 / theirs["median_tpot_ms"], 0.05)


def test_the_standin_refuses_min_over_max_with_vllms_own_message() -> None:
    vllm_cpu()
    from vllm import SamplingParams
    from vllm.exceptions import VLLMValidationError  # the API server answers it with a 400

    with pytest.raises(VLLMValidationError) as theirs:
        SamplingParams(max_tokens=5, min_tokens=10)
    with pytest.raises(engine.BadRequest) as ours:
        engine.output_length({"max_tokens": 5, "min_tokens": 10}, 10, 3, 1000)
    assert str(ours.value) == str(theirs.value)
