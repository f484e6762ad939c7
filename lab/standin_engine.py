"""The stand-in's engine: token counts, timed generation, vLLM 0.33's sampling limits and metrics.

Stdlib only (it ships beside lab/standin_vllm.py in the lab's stand-in image). What it mirrors in
vLLM 0.33, with the source read:

- Output length (entrypoints/openai/chat_completion/protocol.py, sampling_params.py,
  v1/core/sched/utils.py check_stop): ``max_completion_tokens`` wins over ``max_tokens``; without
  either the limit is ``max_model_len - prompt tokens``; a prompt longer than ``max_model_len`` and
  ``min_tokens > max_tokens`` are 400s. End of sequence is ignored before ``min_tokens`` tokens
  and always with ``ignore_eos``; ``max_tokens`` ends the answer with finish_reason "length".
- Streaming (chat_completion/serving.py): the first chunk (role, empty content) goes out with the
  first token, after the prefill; every chunk carries ``usage`` only with
  ``stream_options.continuous_usage_stats``; with ``include_usage`` one last chunk has
  ``choices: []`` and the usage; then ``data: [DONE]``.
- Metrics (v1/metrics/loggers.py, stats.py, core/sched/scheduler.py): the gauges
  ``vllm:num_requests_running`` / ``_waiting`` and ``vllm:kv_cache_usage_perc``, the counters
  ``vllm:prompt_tokens_total`` and ``vllm:generation_tokens_total``, labels model_name and engine.
  The prompt counter moves once per request, by the whole prompt, when its first token comes out
  (the scheduler hands PrefillStats over only with the first output), never per prefill chunk;
  the KV usage gauge is what moves during a long prefill (blocks are allocated chunk by chunk).

The "tokenizer" is the stand-in's own: an ASCII word or any other single non-space character is
one token. Rates are exact: the first token leaves ``prompt_tokens / prefill_tok_s`` after the
request arrived, token i ``(i - 1) / decode_tok_s`` after the first, ``tokens_per_chunk`` tokens
per chunk (speculative decoding sends several tokens in one chunk, so counting chunks is wrong).

Knobs, each a flag (``--standin-...``, via extra_serve_args) or an environment variable (how the
lab's image variants select them, lab/image.py); the flag wins:

    STANDIN_DECODE_TOK_S   per-stream decode rate (default 50)
    STANDIN_PREFILL_TOK_S  prefill rate (default 5000)
    STANDIN_SPEED          factor on both rates (default 1; the lab's slow variant has 0.7)
    STANDIN_TOKENS_PER_CHUNK   tokens per streamed chunk (default 1)
    STANDIN_FFFD_PER_10K   U+FFFD per 10,000 characters of Japanese answers (default 0)
    STANDIN_MODE           normal | wedged | long-prefill
    STANDIN_WEDGE_AFTER    wedged: completion requests served before the engine wedges (0)
    STANDIN_LONG_PREFILL_S long-prefill: the least time any prefill takes (default 120); the KV
                           usage grows meanwhile as for a prompt that long (vLLM steps on)

Wedged: /health stays 200, requests are accepted (a stream gets its 200 and headers) but no token
ever comes, and /metrics is frozen at the moment of the wedge. SIGUSR1 wedges a running engine.
"""

from __future__ import annotations

import math
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

DEFAULT_DECODE_TOK_S = 50.0
DEFAULT_PREFILL_TOK_S = 5000.0
DEFAULT_LONG_PREFILL_S = 120.0
DEFAULT_MAX_NUM_SEQS = 256  # vLLM's SchedulerConfig default when --max-num-seqs is not given
DEFAULT_BATCHED_TOKENS = 8192  # the chunk a long prefill advances by per engine step
KV_CAPACITY_TOKENS = 1_103_764  # the pool the stand-in logs at boot (the shared profile's 9 GiB)
MODES = ("normal", "wedged", "long-prefill")

# knob -> (flag, environment variable)
KNOBS = {
    "decode_tok_s": ("--standin-decode-tok-s", "STANDIN_DECODE_TOK_S"),
    "prefill_tok_s": ("--standin-prefill-tok-s", "STANDIN_PREFILL_TOK_S"),
    "speed": ("--standin-speed", "STANDIN_SPEED"),
    "tokens_per_chunk": ("--standin-tokens-per-chunk", "STANDIN_TOKENS_PER_CHUNK"),
    "fffd_per_10k": ("--standin-fffd-per-10k", "STANDIN_FFFD_PER_10K"),
    "mode": ("--standin-mode", "STANDIN_MODE"),
    "wedge_after": ("--standin-wedge-after", "STANDIN_WEDGE_AFTER"),
    "long_prefill_s": ("--standin-long-prefill-s", "STANDIN_LONG_PREFILL_S"),
}
FLAGS = {flag: "1" for flag, _ in KNOBS.values()}


class BadRequest(ValueError):
    """A request vLLM answers with 400."""


@dataclass
class Knobs:
    decode_tok_s: float = DEFAULT_DECODE_TOK_S
    prefill_tok_s: float = DEFAULT_PREFILL_TOK_S
    tokens_per_chunk: int = 1
    fffd_per_10k: float = 0.0
    mode: str = "normal"
    wedge_after: int = 0
    long_prefill_s: float = DEFAULT_LONG_PREFILL_S
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS
    max_model_len: int = 262144
    batched_tokens: int = DEFAULT_BATCHED_TOKENS


def knobs_from(get: Callable[[str], str | None], environ: Any = os.environ, **serve: int) -> Knobs:
    """The knobs from the flags (``get(flag)``), else the environment, else the defaults;
    ``serve`` carries vLLM's own limits (max_num_seqs, max_model_len, batched_tokens)."""

    def raw(name: str) -> str | None:
        flag, env = KNOBS[name]
        value = get(flag)
        return value if value is not None else environ.get(env)

    def num(name: str, default: float) -> float:
        value = raw(name)
        try:
            n = default if value in (None, "") else float(value)
        except ValueError:
            raise SystemExit(f"stand-in: {KNOBS[name][0]}: not a number: {value!r}") from None
        if n < 0 or math.isnan(n):
            raise SystemExit(f"stand-in: {KNOBS[name][0]}: must be >= 0, got {value!r}")
        return n

    speed = num("speed", 1.0)
    mode = raw("mode") or "normal"
    if mode not in MODES:
        raise SystemExit(f"stand-in: --standin-mode {mode!r}: choose one of {', '.join(MODES)}")
    k = Knobs(
        decode_tok_s=num("decode_tok_s", DEFAULT_DECODE_TOK_S) * speed,
        prefill_tok_s=num("prefill_tok_s", DEFAULT_PREFILL_TOK_S) * speed,
        tokens_per_chunk=max(1, int(num("tokens_per_chunk", 1))),
        fffd_per_10k=num("fffd_per_10k", 0.0),
        mode=mode,
        wedge_after=int(num("wedge_after", 0)),
        long_prefill_s=num("long_prefill_s", DEFAULT_LONG_PREFILL_S),
        **serve,
    )
    if k.decode_tok_s <= 0 or k.prefill_tok_s <= 0:
        raise SystemExit("stand-in: decode and prefill rates must be > 0")
    return k


# --- tokens -----------------------------------------------------------------------------------
_TOKEN = re.compile(r"[A-Za-z0-9_]+|[^\sA-Za-z0-9_]")
_JAPANESE = re.compile(r"[\u3040-\u30ff\u4e00-\u9fff]")


def count_tokens(text: str) -> int:
    return len(_TOKEN.findall(text))


def content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def prompt_tokens(messages: Any) -> int:
    """Prompt tokens of a chat request: every message's text (no template overhead)."""
    msgs = messages if isinstance(messages, list) else []
    return max(1, sum(count_tokens(content_text(m.get("content"))) for m in msgs
                      if isinstance(m, dict)))  # fmt: skip


PROSE = (
    "The river kept its own time, slow in the dry months and quick after rain, and the town on "
    "its bank learned to read the water the way other towns read the sky."
)
JAPANESE = (
    "川は自分の時間を守っていた。乾いた季節にはゆっくりと流れ、雨のあとには速くなった。"
    "岸辺の町の人々は、空を読むように水を読むことを覚えた。現実の測定と許容範囲を確かめながら、"
)


def pieces_of(text: str, japanese: bool) -> list[str]:
    """One string per token: characters for Japanese, space-led words otherwise."""
    if japanese:
        return [c for c in text if not c.isspace()]
    return [(" " if i else "") + w for i, w in enumerate(text.split())]


def recall_answer(messages: Any) -> str | None:
    """Reading: the last user message asks "What is the <thing>?" and the prompt says "the
    <thing> is <word>": the answer names the word."""
    msgs = [m for m in (messages if isinstance(messages, list) else []) if isinstance(m, dict)]
    users = [content_text(m.get("content")) for m in msgs if m.get("role") == "user"]
    if not users:
        return None
    ask = re.search(r"what is the ([a-z][\w -]{0,60}?)\s*\?", users[-1], re.IGNORECASE)
    if not ask:
        return None
    thing = ask.group(1).strip()
    everything = "\n".join(content_text(m.get("content")) for m in msgs)
    found = re.search(rf"\bthe {re.escape(thing)} is ([^\s.,;]+)", everything, re.IGNORECASE)
    return f"The {thing} is {found.group(1)}." if found else None


def generate(natural: str, n: int, japanese: bool, fffd_per_10k: float) -> list[str]:
    """n token strings: the natural answer, then (past its end of sequence) prose continuing.
    Japanese answers lose one character to U+FFFD every 10,000 / fffd_per_10k characters."""
    out = pieces_of(natural, japanese)
    filler = pieces_of(JAPANESE if japanese else PROSE, japanese)
    i = 0
    while len(out) < n:
        piece = filler[i % len(filler)]
        out.append(piece if japanese or len(out) == 0 else " " + piece.lstrip())
        i += 1
    out = out[:n]
    if japanese and fffd_per_10k > 0:
        every = 10000.0 / fffd_per_10k
        nxt = every / 2
        pos = 0
        for j, piece in enumerate(out):
            pos += len(piece)
            if pos >= nxt:
                out[j] = "\ufffd"
                nxt += every
    return out


def output_length(req: dict[str, Any], prompt: int, natural: int, max_model_len: int
                  ) -> tuple[int, str]:  # fmt: skip
    """(completion tokens, finish_reason) for a request whose answer would end after
    ``natural`` tokens; BadRequest as vLLM 0.33 refuses."""
    if prompt > max_model_len:
        raise BadRequest(
            f"This model's maximum context length is {max_model_len} tokens. However, your "
            f"request has {prompt} input tokens. Please reduce the length of the input messages."
        )
    mct = req.get("max_completion_tokens")
    max_tokens = mct if mct is not None else req.get("max_tokens")
    min_tokens = req.get("min_tokens") or 0
    for name, v in (("max_tokens", max_tokens), ("min_tokens", min_tokens)):
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
            raise BadRequest(f"{name} must be a non-negative integer, got {v!r}.")
    if max_tokens is not None and min_tokens > max_tokens:
        raise BadRequest(
            f"min_tokens must be less than or equal to max_tokens={max_tokens}, got {min_tokens}."
        )
    limit = max_model_len - prompt
    cap = limit if max_tokens is None else min(max_tokens, limit)
    if req.get("ignore_eos"):
        return cap, "length"
    if natural >= min_tokens:  # the answer's own end of sequence, unless the cap comes first
        return (natural, "stop") if natural <= cap else (cap, "length")
    # end of sequence held back until min_tokens; the stand-in's model then ends at once
    n = min(min_tokens, cap)
    return n, "length" if n == cap else "stop"


# --- engine -----------------------------------------------------------------------------------
@dataclass
class Progress:
    prompt: int
    prefill_s: float
    start: float = field(default_factory=time.monotonic)
    generated: int = 0
    kv_prompt: int = 0  # the tokens the prefill fills the KV cache with

    def __post_init__(self) -> None:
        self.kv_prompt = max(self.kv_prompt, self.prompt)


Emit = Callable[[list[str], bool, bool], None]  # (token strings, first chunk, last chunk)


class Engine:
    """One serving engine: slots (--max-num-seqs), exact rates, counters, the wedge."""

    def __init__(self, knobs: Knobs, served_name: str) -> None:
        self.knobs = knobs
        self.served_name = served_name
        self.lock = threading.Lock()
        self.slots = threading.Semaphore(max(1, knobs.max_num_seqs))
        self.running = 0
        self.waiting = 0
        self.prompt_total = 0
        self.generation_total = 0
        self.served = 0
        self.active: dict[int, Progress] = {}
        self.wedged = threading.Event()
        self.frozen: str | None = None
        self.frozen_counts: dict[str, int] | None = None  # counts() as the wedge froze them

    # the wedge
    def _freeze_locked(self) -> None:
        self.frozen = self._metrics_locked()
        self.frozen_counts = self._counts_locked()

    def wedge(self) -> None:
        with self.lock:
            if self.frozen is None:
                self._freeze_locked()
            self.wedged.set()

    def _hang_if_wedged(self) -> None:
        while self.wedged.is_set():
            time.sleep(3600)

    def _sleep_until(self, deadline: float) -> None:
        while True:
            self._hang_if_wedged()
            left = deadline - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(left, 0.5))

    @contextmanager
    def slot(self) -> Iterator[float | None]:
        """A sequence slot for one request; yields when it was admitted after waiting (its
        prefill starts then), None when a slot was free at once."""
        with self.lock:
            self.waiting += 1
        admitted = None
        if not self.slots.acquire(blocking=False):
            self.slots.acquire()
            admitted = time.monotonic()
        with self.lock:
            self.waiting -= 1
            self.running += 1
            if self.knobs.mode == "wedged" and self.served >= self.knobs.wedge_after:
                if self.frozen is None:  # the engine's last report, this request in it
                    self._freeze_locked()
                self.wedged.set()
            self.served += 1
        try:
            yield admitted
        finally:
            with self.lock:
                self.running -= 1
            self.slots.release()

    def prefill_s(self, prompt: int) -> float:
        s = prompt / self.knobs.prefill_tok_s
        return max(s, self.knobs.long_prefill_s) if self.knobs.mode == "long-prefill" else s

    def generate(self, prompt: int, pieces: list[str], emit: Emit, arrival: float) -> None:
        """Prefill, then emit ``pieces`` at the decode rate, tokens_per_chunk at a time; the
        clock starts at ``arrival`` (time.monotonic() when the request came in), so reading
        and tokenizing the request is part of its prefill time, as in vLLM's TTFT."""
        prefill_s = self.prefill_s(prompt)
        # a long-prefill stands for the prompt that takes that long: its KV fills at the rate
        prog = Progress(prompt, prefill_s, start=arrival,
                        kv_prompt=int(prefill_s * self.knobs.prefill_tok_s))  # fmt: skip
        key = id(prog)
        with self.lock:
            self.active[key] = prog
        try:
            t_first = prog.start + prog.prefill_s
            self._sleep_until(t_first)
            with self.lock:
                self.prompt_total += prompt
            n, k = len(pieces), self.knobs.tokens_per_chunk
            if n == 0:
                emit([], True, True)
            for i in range(0, n, k):
                last = min(i + k, n)
                self._sleep_until(t_first + (last - 1) / self.knobs.decode_tok_s)
                with self.lock:
                    self.generation_total += last - i
                    prog.generated = last
                emit(pieces[i:last], i == 0, last == n)
        finally:
            with self.lock:
                self.active.pop(key, None)

    # metrics
    def _kv_tokens_locked(self, now: float) -> int:
        total = 0
        chunk = max(1, self.knobs.batched_tokens)
        for p in self.active.values():
            done = now - p.start
            if done < p.prefill_s:  # chunked prefill: whole chunks, one per step
                rate = p.kv_prompt / p.prefill_s
                total += min(p.kv_prompt, int(done * rate) // chunk * chunk)
            else:
                total += p.kv_prompt + p.generated
        return total

    def _metrics_locked(self) -> str:
        kv = min(1.0, self._kv_tokens_locked(time.monotonic()) / KV_CAPACITY_TOKENS)
        return exposition(self.served_name, [
            ("vllm:num_requests_running", "gauge", "Number of requests in model execution "
             "batches.", self.running),
            ("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.",
             self.waiting),
            ("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.",
             kv),
            ("vllm:prompt_tokens", "counter", "Number of prefill tokens processed.",
             self.prompt_total),
            ("vllm:generation_tokens", "counter", "Number of generation tokens processed.",
             self.generation_total),
        ])  # fmt: skip

    def metrics(self) -> str:
        with self.lock:
            return self.frozen if self.frozen is not None else self._metrics_locked()

    def _counts_locked(self) -> dict[str, int]:
        return {"running": self.running, "waiting": self.waiting, "served": self.served,
                "prompt": self.prompt_total, "generation": self.generation_total}  # fmt: skip

    def counts(self) -> dict[str, int]:
        """The counters an engine of another family reports (lab/standin_tensorfold.py): the
        request counts live (its HTTP side still takes requests), the token counters frozen by
        the wedge (no token moves again)."""
        with self.lock:
            counts = self._counts_locked()
            if self.frozen_counts is not None:
                counts.update(prompt=self.frozen_counts["prompt"],
                              generation=self.frozen_counts["generation"])  # fmt: skip
            return counts


def go_float(d: float) -> str:
    """prometheus_client.utils.floatToGoString, for finite values."""
    s = repr(float(d))
    dot = s.find(".")
    if d > 0 and dot > 6:
        mantissa = f"{s[0]}.{s[1:dot]}{s[dot + 1 :]}".rstrip("0.")
        return f"{mantissa}e+{dot - 1:02d}"
    return s


def exposition(model: str, metrics: list[tuple[str, str, str, float]]) -> str:
    """The text format prometheus_client's generate_latest writes (vLLM serves /metrics with
    it; 0.26, the version beside vLLM 0.33 here): labels sorted, and a counter named with its
    _total suffix in HELP, TYPE and its sample."""
    label = model.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
    out = []
    for name, kind, doc, value in metrics:
        sample = name + "_total" if kind == "counter" else name
        out.append(f"# HELP {sample} {doc}\n# TYPE {sample} {kind}\n")
        out.append(f'{sample}{{engine="0",model_name="{label}"}} {go_float(value)}\n')
    return "".join(out)
