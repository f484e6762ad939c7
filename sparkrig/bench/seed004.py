"""Seed 004's protocol (``python3 -m sparkrig.bench --protocol seed004``): one operator comparing
two stacks on the same pair of Sparks. Every parameter is quoted from the seed
(seeds/004_d4f0c35b177c450a.txt) where it says it; what the seed leaves open is sparkrig's choice
and says so.

- Line 1: "One streamed call each, temperature 0.2, 384 tokens, prompts around 3.7k tokens."
  -> one streamed call per workload, ``temperature`` 0.2, ``max_tokens`` 384, a prompt sized to
  about 3,700 tokens (with the server's /tokenize when it has one).
- Line 7: "Prose decode was ... Code at reasoning low was ... Code at reasoning max was ..."
  -> three workloads: prose, code at ``reasoning_effort`` "low", code at "max" (vLLM 0.33's
  ChatCompletionRequest takes ``reasoning_effort`` up to "max" and turns thinking on for it).
- Line 7: "Prefill on the prose prompt was ... On the code prompt, ..." -> prefill from the same
  calls: prompt_tokens / TTFT of the prose call and of the first code call (reasoning low).

Not in the seed, chosen here:
- the prose call sends no reasoning switch (the seed names none for prose): the stack's default;
- the 384 tokens are a cap (``max_tokens``), not forced: the seed does not say it forced them, and
  a stack's engine need not know vLLM's ``min_tokens``/``ignore_eos``. A call that ends sooner is
  listed in the result (``completion_tokens``, ``finish_reason``);
- every prompt opens with a unique nonce, so neither call is a prefix-cache hit (the two code
  calls share a prompt otherwise);
- decode tok/s is (completion_tokens - 1) / (t_last - t_first), as the seed-000 protocol and
  ``vllm bench serve`` count it: the seed does not say how its figure was computed.
"""

from __future__ import annotations

import uuid
from dataclasses import asdict, dataclass
from typing import Any

from . import specdecode
from .client import Endpoint
from .protocol import Calls, sized_prompt

NAME = "seed004"


@dataclass(frozen=True)
class Workload:
    name: str
    prompt: str  # "prose" or "code"
    reasoning_effort: str | None  # None: the request sends no switch


WORKLOADS = (
    Workload("prose", "prose", None),  # seed 004 line 7: "Prose decode was 27.4 ... 35.8"
    Workload("code-low", "code", "low"),  # "Code at reasoning low was 53.6 and 36.3"
    Workload("code-max", "code", "max"),  # "Code at reasoning max was 62.7 and 44.6"
)


@dataclass
class Seed004:
    temperature: float = 0.2  # seed 004 line 1: "temperature 0.2"
    max_tokens: int = 384  # seed 004 line 1: "384 tokens"
    prompt_tokens: int = 3700  # seed 004 line 1: "prompts around 3.7k tokens"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# --- the two prompts --------------------------------------------------------------------------
PROSE_PARAGRAPH = (
    "Chapter {i}. In year {year} of the ferry, the river town of {place} woke before the "
    "bells, and the {trade} opened their shutters to a fog that lay on the water like wool. "
    "Nobody who lived there would have called it a remarkable morning, yet the old ferryman "
    "counted the boats twice, because one of them had come back without its lantern. "
)
PROSE_ASK = (
    "Read the chronicle above. Then write its next chapter: several long paragraphs of plain "
    "prose in the same voice, no headings and no lists."
)
CODE_UNIT = '''
def station_{i}_mean(samples: list[float | None], floor: float = {floor}) -> float:
    """Mean depth at station {i}, ignoring gaps and readings below the floor."""
    kept = [s for s in samples if s is not None and s >= floor]
    if not kept:
        raise ValueError("station {i}: no reading above the floor")
    return round(sum(kept) / len(kept), 3)

'''
CODE_ASK = (
    "Read the Python module above. Then write a new module that extends it: one function that "
    "dispatches to the station functions by number, a command-line interface with argparse, "
    "input validation and pytest unit tests. Answer with code only."
)
PLACES = ("Alder Ford", "Kestrel Bend", "Millbrook", "Saltmarsh", "Wrenhaven", "Oxbow")
TRADES = ("bakers", "coopers", "net menders", "chandlers", "tanners", "printers")
TOKENS_PER_UNIT = {"prose": 70, "code": 75}  # first guesses only; /tokenize corrects them


def prose_messages(units: int, salt: str) -> list[dict[str, Any]]:
    body = "".join(
        PROSE_PARAGRAPH.format(
            i=i + 1, year=i + 2, place=PLACES[i % len(PLACES)], trade=TRADES[i % len(TRADES)]
        )
        for i in range(units)
    )
    return [{"role": "user", "content": f"Session {salt}.\n\n{body}\n\n{PROSE_ASK}"}]


def code_messages(units: int, salt: str) -> list[dict[str, Any]]:
    body = "".join(CODE_UNIT.format(i=i + 1, floor=f"{(i % 7) / 10:.1f}") for i in range(units))
    text = f"# session {salt}\n```python\n{body}```\n\n{CODE_ASK}"
    return [{"role": "user", "content": text}]


PROMPTS = {"prose": prose_messages, "code": code_messages}


def body(model: str, messages: list[dict[str, Any]], proto: Seed004,
         workload: Workload) -> dict[str, Any]:  # fmt: skip
    """One streamed call of the workload, as seed 004 line 1 says."""
    out: dict[str, Any] = {
        "model": model,
        "messages": messages,
        "max_tokens": proto.max_tokens,
        "temperature": proto.temperature,
        "stream": True,
        "stream_options": {"include_usage": True},  # the token counts come from usage
    }
    if workload.reasoning_effort is not None:
        out["reasoning_effort"] = workload.reasoning_effort
    return out


def call(run: Calls, proto: Seed004, workload: Workload) -> dict[str, Any]:
    ep = run.endpoint
    salt = uuid.uuid4().hex
    build = PROMPTS[workload.prompt]
    messages = sized_prompt(ep, proto.prompt_tokens, lambda n: build(n, salt),
                            TOKENS_PER_UNIT[workload.prompt])  # fmt: skip
    r = ep.chat_stream(body(ep.model, messages, proto, workload))
    row: dict[str, Any] = {
        "workload": workload.name, "prompt": workload.prompt,
        "reasoning_effort": workload.reasoning_effort, "target_tokens": proto.prompt_tokens,
        "prompt_tokens": r.prompt_tokens, "completion_tokens": r.completion_tokens,
        "finish_reason": r.finish_reason, "ttft_s": None, "prefill_tok_s": None,
        "decode_tok_s": None,
    }  # fmt: skip
    if not run.check(workload.name, r) or r.ttft_s is None:
        if not r.error:
            run.errors.append(f"{workload.name}: no token came back")
        return row
    row["ttft_s"] = round(r.ttft_s, 4)
    if r.prompt_tokens and r.ttft_s > 0:
        row["prefill_tok_s"] = round(r.prompt_tokens / r.ttft_s, 2)
    if r.decode_tok_s is not None:
        row["decode_tok_s"] = round(r.decode_tok_s, 2)
    run.say(f"{workload.name}: {r.prompt_tokens} prompt tokens, TTFT {r.ttft_s:.2f} s, "
            f"{r.completion_tokens} tokens at {row['decode_tok_s']} tok/s")  # fmt: skip
    return row


# The seed's five figures (line 7) under the names the verdicts and the compare read: name ->
# (workload, the row's key). Prefill on the code prompt is the first call on it (reasoning low).
FIGURES = {
    "prose_decode_tok_s": ("prose", "decode_tok_s"),
    "code_low_decode_tok_s": ("code-low", "decode_tok_s"),
    "code_max_decode_tok_s": ("code-max", "decode_tok_s"),
    "prose_prefill_tok_s": ("prose", "prefill_tok_s"),
    "code_prefill_tok_s": ("code-low", "prefill_tok_s"),
}


def figures(rows: list[dict[str, Any]]) -> dict[str, float | None]:
    by = {r["workload"]: r for r in rows}
    return {name: (by.get(w) or {}).get(key) for name, (w, key) in FIGURES.items()}


# Seed 004's drafter figure (line 9: "that drafter kept more tokens per step, about 6.5, and
# about 7.4 once reasoning was maxed"): tokens a verify step emits, vLLM's mean acceptance
# length, per code workload.
ACCEPTANCE_FIGURES = {
    "code_low_acceptance_length": "code-low",
    "code_max_acceptance_length": "code-max",
}


def measure(ep: Endpoint, proto: Seed004, log: Any = None) -> dict[str, Any]:
    """One call per workload; the rows (``workloads``) and the seed's figures; each row's drafter
    acceptance from /metrics read around its call, and the run's (specdecode.py)."""
    run = Calls(ep, log=log)
    first = last = specdecode.read(ep)
    rows = []
    for w in WORKLOADS:
        row = call(run, proto, w)
        now = specdecode.read(ep)
        drafted = specdecode.over(last, now)
        row["spec_acceptance"] = drafted["spec_acceptance"]
        row["spec_acceptance_length"] = drafted["spec_acceptance_length"]
        rows.append(row)
        last = now
    by = {r["workload"]: r for r in rows}
    lengths = {name: (by.get(w) or {}).get("spec_acceptance_length")
               for name, w in ACCEPTANCE_FIGURES.items()}  # fmt: skip
    return {"workloads": rows, **figures(rows), "max_model_len": ep.max_model_len(),
            **specdecode.over(first, last), **lengths, "errors": run.errors}  # fmt: skip
