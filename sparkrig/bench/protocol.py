"""The seeds' measurement protocol (seed 000 and seed 003), one function per figure.

- single-stream decode: 8 short prose prompts, greedy, thinking off, N forced tokens
  (``max_tokens`` = ``min_tokens`` = N, ``ignore_eos``), tok/s = (completion_tokens - 1) /
  (t_last - t_first) with the server's usage counts; one pass is the 8 prompts in turn, the figure
  the median of the passes;
- aggregate decode at 2, 4, 8 parallel streams: total completion tokens / wall time of one wave
  of that many simultaneous requests (what `vllm bench serve` calls output throughput), median
  of the waves;
- prefill and TTFT at 8K, 32K, 128K: a salted haystack (a unique nonce first, so no prefix-cache
  hit flatters it) with a keyword at 50% depth the answer must recall; the answer is forced to
  512 tokens, seed 000's long-form length, and its decode rate is the long-context decode;
- a tool call with tool_choice "required" that must parse (the serving gate's own probe);
- the corruption probe: a long Japanese answer, U+FFFD per 10,000 characters;
- over the whole run, the drafter's acceptance from the engine's /metrics (specdecode.py).
"""

from __future__ import annotations

import statistics
import threading
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from sparkhost import gate as gate_probe

from . import specdecode, stats
from .client import Endpoint, StreamResult

PROSE_PROMPTS = (
    "Write a short story about a lighthouse keeper who finds a letter in a bottle.",
    "Write an essay on why old city maps are worth keeping.",
    "Describe a walk through a market town on the first morning of spring.",
    "Tell the story of a clockmaker who builds a clock that runs backwards.",
    "Write an essay about the quiet pleasures of reading on a long train journey.",
    "Describe a storm arriving over a fishing village, from the harbour wall.",
    "Write a story about two neighbours who share a garden and never speak.",
    "Write an essay on what a kitchen table remembers of the people around it.",
)
JAPANESE_PROMPT = (
    "日本の四季の移ろいと、それぞれの季節の暮らし、行事、食べ物について、できるだけ長く、詳しく、"
    "日本語だけで文章を書いてください。見出しや箇条書きは使わず、段落で書いてください。"
)
THINKING_OFF = {"enable_thinking": False}  # GLM and Qwen chat templates' switch (docs/bench.md)
HAYSTACK = (
    "Ledger entry {i}: the survey team logged the river depth at station {i}, noted the "
    "weather as mild, checked the instruments, and moved on to the next marker along the bank. "
)
TOKENS_PER_HAYSTACK_SENTENCE = 40  # a first guess only; /tokenize corrects it
Builder = Callable[[int], list[dict[str, Any]]]  # units of text -> chat messages


@dataclass
class Protocol:
    decode_tokens: int = 512
    repeats: int = 3
    prompts: int = 8
    streams: tuple[int, ...] = (2, 4, 8)
    contexts: tuple[int, ...] = (8192, 32768, 131072)
    recall_tokens: int = 32
    context_decode_tokens: int = 512  # forced after each long prompt (0: the recall answer only)
    tool: bool = True
    fffd_tokens: int = 4096

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# The release gate's short bench: single-stream decode, 4 streams, the tool and corruption probes.
SHORT = Protocol(repeats=1, prompts=4, streams=(4,), contexts=(), fffd_tokens=2048)


@dataclass
class Calls:
    """The requests of one run against one endpoint: what failed, and progress lines."""

    endpoint: Endpoint
    errors: list[str] = field(default_factory=list)
    log: Any = None  # callable(str) for progress lines

    def say(self, msg: str) -> None:
        if self.log is not None:
            self.log(msg)

    def check(self, what: str, r: StreamResult, forced: int | None = None) -> bool:
        if r.error:
            self.errors.append(f"{what}: {r.error}")
            return False
        if forced is not None and r.completion_tokens != forced:
            self.errors.append(
                f"{what}: {r.completion_tokens} completion tokens, not the {forced} forced "
                f"(min_tokens/ignore_eos not honoured?)"
            )
            return False
        return True


@dataclass
class Run(Calls):
    protocol: Protocol = field(default_factory=Protocol)


def decode_body(model: str, prompt: str, n: int) -> dict[str, Any]:
    """A forced-length, greedy, thinking-off streamed chat request."""
    return {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": n,
        "min_tokens": n,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "chat_template_kwargs": dict(THINKING_OFF),
    }


def single_stream(run: Run) -> tuple[float | None, list[float], float | None]:
    """(median of the passes' tok/s, each pass's tok/s, TTFT p50 over every request)."""
    p, ep = run.protocol, run.endpoint
    passes, ttfts = [], []
    for rep in range(p.repeats):
        tokens, seconds = 0, 0.0
        for i in range(p.prompts):
            prompt = PROSE_PROMPTS[i % len(PROSE_PROMPTS)]
            r = ep.chat_stream(decode_body(ep.model, prompt, p.decode_tokens))
            if not run.check(f"single stream, pass {rep + 1}, prompt {i + 1}", r,
                             p.decode_tokens) or r.decode_s is None:  # fmt: skip
                continue
            tokens += (r.completion_tokens or 0) - 1
            seconds += r.decode_s
            if r.ttft_s is not None:
                ttfts.append(r.ttft_s)
        if seconds > 0:
            passes.append(tokens / seconds)
            run.say(f"single stream pass {rep + 1}: {passes[-1]:.2f} tok/s")
    median = statistics.median(passes) if passes else None
    return median, passes, (statistics.median(ttfts) if ttfts else None)


def wave(run: Run, n: int) -> tuple[float | None, list[StreamResult]]:
    """n simultaneous forced-length requests: (total completion tokens / wall time, results)."""
    p, ep = run.protocol, run.endpoint
    results: list[StreamResult | None] = [None] * n
    start = threading.Barrier(n)

    def one(i: int) -> None:
        start.wait()
        prompt = PROSE_PROMPTS[i % len(PROSE_PROMPTS)]
        results[i] = ep.chat_stream(decode_body(ep.model, prompt, p.decode_tokens))

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    done = [r for r in results if r is not None]
    ok = [r for i, r in enumerate(done) if run.check(f"{n} streams, stream {i + 1}", r,
                                                     p.decode_tokens)]  # fmt: skip
    if len(ok) != n or any(r.t_last is None for r in ok):
        return None, done
    wall = max(r.t_last or 0.0 for r in ok) - min(r.t_sent for r in ok)
    total = sum(r.completion_tokens or 0 for r in ok)
    return (total / wall if wall > 0 else None), done


def parallel(run: Run) -> tuple[dict[str, float], dict[str, float], dict[str, list[float]]]:
    """streams -> aggregate tok/s (median of ``repeats`` waves), -> per-stream tok/s, and ->
    each wave's aggregate."""
    agg: dict[str, float] = {}
    per: dict[str, float] = {}
    waves: dict[str, list[float]] = {}
    for n in run.protocol.streams:
        figures, rates = [], []
        for _ in range(run.protocol.repeats):
            total, results = wave(run, n)
            if total is not None:
                figures.append(total)
                rates += [r.decode_tok_s for r in results if r.decode_tok_s is not None]
        if figures:
            agg[str(n)] = statistics.median(figures)
            per[str(n)] = statistics.median(rates) if rates else 0.0
            waves[str(n)] = figures
            run.say(f"{n} streams: {agg[str(n)]:.2f} tok/s aggregate")
    return agg, per, waves


def haystack(target_tokens: int, sentences: int, keyword: str, salt: str) -> list[dict[str, Any]]:
    half = sentences // 2
    body = [HAYSTACK.format(i=i) for i in range(sentences)]
    body.insert(half, f"Remember this: the secret keyword is {keyword}. ")
    text = (
        f"Session {salt}. Read the survey ledger below; a question about it follows.\n\n"
        + "".join(body)
        + "\n\nWhat is the secret keyword? Answer with the keyword only."
    )
    return [{"role": "user", "content": text}]


def sized_prompt(ep: Endpoint, target: int, build: Builder, per_unit: int) -> list[dict[str, Any]]:
    """The messages ``build(units)`` makes, with ``units`` chosen so the prompt is about
    ``target`` tokens: sized with the server's /tokenize when it has one (two corrections), else
    from ``per_unit``, a tokens-per-unit guess."""
    units = max(2, target // per_unit)
    messages = build(units)
    for _ in range(2):
        n = ep.tokenize(messages)
        if not n:
            break
        units = max(2, round(units * target / n))
        messages = build(units)
    return messages


def sized_haystack(ep: Endpoint, target: int, keyword: str, salt: str) -> list[dict[str, Any]]:
    """A haystack of about ``target`` prompt tokens."""
    return sized_prompt(ep, target, lambda n: haystack(target, n, keyword, salt),
                        TOKENS_PER_HAYSTACK_SENTENCE)  # fmt: skip


def prefill(run: Run, max_model_len: int | None) -> list[dict[str, Any]]:
    p, ep = run.protocol, run.endpoint
    rows = []
    answer = max(p.recall_tokens, p.context_decode_tokens)
    forced = p.context_decode_tokens > 0
    for target in p.contexts:
        if max_model_len is not None and target + answer > max_model_len:
            run.errors.append(f"prefill {target}: longer than the model's context {max_model_len}")
            continue
        keyword = "ORCHID-" + uuid.uuid4().hex[:6].upper()
        salt = uuid.uuid4().hex
        body = {
            "model": ep.model,
            "messages": sized_haystack(ep, target, keyword, salt),
            "max_tokens": answer,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
            "chat_template_kwargs": dict(THINKING_OFF),
        }
        if forced:  # the keyword comes first; the tokens past it time the long-context decode
            body.update(min_tokens=answer, ignore_eos=True)
        r = ep.chat_stream(body)
        if not run.check(f"prefill {target}", r, answer if forced else None) or r.ttft_s is None:
            if not r.error:
                run.errors.append(f"prefill {target}: no token came back")
            continue
        prompt = r.prompt_tokens or 0
        row = {
            "target_tokens": target,
            "prompt_tokens": prompt,
            "ttft_s": round(r.ttft_s, 4),
            "prefill_tok_s": round(prompt / r.ttft_s, 2) if r.ttft_s > 0 else None,
            "recall": recalled(keyword, r.content + r.reasoning),
        }
        if forced and r.decode_tok_s is not None:
            row["decode_tok_s"] = round(r.decode_tok_s, 2)
        rows.append(row)
        run.say(f"prefill {prompt} tokens: TTFT {r.ttft_s:.2f} s, recall {row['recall']}")
    return rows


def recalled(keyword: str, answer: str) -> bool:
    """The answer names the keyword (case and surrounding punctuation aside)."""
    return keyword.lower() in answer.lower()


def tool_call(run: Run) -> tuple[bool, str]:
    ep = run.endpoint
    status, text = ep.chat(gate_probe.tool_payload(ep.model))
    result = gate_probe.parse_tool(status, text)
    return result.ok, result.detail


def fffd_per_10k(text: str) -> float | None:
    """U+FFFD per 10,000 characters of ``text``; None for no text."""
    return text.count("\ufffd") * 10000 / len(text) if text else None


def corruption(run: Run) -> tuple[float | None, int, int]:
    """(U+FFFD per 10,000 characters, U+FFFD count, characters) of a long Japanese answer."""
    p, ep = run.protocol, run.endpoint
    r = ep.chat_stream(decode_body(ep.model, JAPANESE_PROMPT, p.fffd_tokens))
    if not run.check("corruption probe", r):
        return None, 0, 0
    return fffd_per_10k(r.content), r.content.count("\ufffd"), len(r.content)


def measure(ep: Endpoint, protocol: Protocol, log: Any = None) -> dict[str, Any]:
    """Run the protocol against the endpoint; the result under the names other tooling reads:
    single_stream_tok_s, decode_tok_s (streams -> aggregate), prefill, tool_call_ok,
    fffd_per_10k_chars, spec_acceptance; ``spread`` holds the median and p10 of a figure
    measured more than once (passes, waves)."""
    run = Run(ep, log=log, protocol=protocol)
    before = specdecode.read(ep)
    max_len = ep.max_model_len()
    single, passes, ttft = single_stream(run)
    agg, per, waves = parallel(run)
    decode = {"1": round(single, 2)} if single is not None else {}
    decode.update({k: round(v, 2) for k, v in agg.items()})
    rows = prefill(run, max_len)
    tool_ok, tool_detail = tool_call(run) if protocol.tool else (None, "not run")
    fffd, count, chars = corruption(run) if protocol.fffd_tokens else (None, 0, 0)
    drafted = specdecode.over(before, specdecode.read(ep))
    if drafted["spec_acceptance"] is not None:
        run.say(f"drafter acceptance {drafted['spec_acceptance']:.1%} "
                f"(mean acceptance length {drafted['spec_acceptance_length']})")  # fmt: skip
    repeated = {"single_stream_tok_s": passes,
                **{f"decode_tok_s.{k}": v for k, v in waves.items()}}  # fmt: skip
    return {
        "single_stream_tok_s": None if single is None else round(single, 2),
        "single_stream_passes": [round(x, 2) for x in passes],
        "ttft_p50_s": None if ttft is None else round(ttft, 4),
        "decode_tok_s": decode,
        "per_stream_tok_s": {k: round(v, 2) for k, v in per.items()},
        "prefill": rows,
        "tool_call_ok": tool_ok,
        "tool_call_detail": tool_detail,
        "fffd_per_10k_chars": None if fffd is None else round(fffd, 3),
        "fffd_count": count,
        "fffd_chars": chars,
        "max_model_len": max_len,
        "spread": {k: stats.spread(v) for k, v in repeated.items() if len(v) > 1},
        **drafted,
        "errors": run.errors,
    }


def short_bench(ep: Endpoint, protocol: Protocol = SHORT) -> dict[str, Any]:
    """The release gate's bench: single-stream decode, 4 streams, the tool and corruption
    probes; the same JSON names as the full bench."""
    return measure(ep, protocol)
