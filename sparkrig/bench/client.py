"""The bench's HTTP client: an OpenAI-compatible endpoint, streamed chat completions timed per
chunk, token counts from the server's ``usage`` (never from chunk counts: speculative decoding puts
several tokens in one chunk)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import requests
from sparkhost.gate import LOCAL_HEADER, PINNED

Recorder = Callable[[str, dict[str, Any]], None]


@dataclass
class StreamResult:
    """One streamed chat completion, timed on this machine (time.perf_counter)."""

    t_sent: float
    t_first: float | None = None  # the first chunk carrying content, reasoning or a tool call
    t_last: float | None = None  # the last such chunk
    prompt_tokens: int | None = None  # from the server's usage
    completion_tokens: int | None = None
    content: str = ""
    reasoning: str = ""
    finish_reason: str | None = None
    chunks: int = 0  # token-carrying chunks (for the record: never a token count)
    error: str = ""

    @property
    def ttft_s(self) -> float | None:
        return None if self.t_first is None else self.t_first - self.t_sent

    @property
    def decode_s(self) -> float | None:
        if self.t_first is None or self.t_last is None:
            return None
        return self.t_last - self.t_first

    @property
    def decode_tok_s(self) -> float | None:
        """(completion_tokens - 1) / (t_last - t_first): vllm bench serve's 1000 / TPOT."""
        n, d = self.completion_tokens, self.decode_s
        if n is None or n < 2 or not d or d <= 0:
            return None
        return (n - 1) / d


@dataclass
class Endpoint:
    """An OpenAI-compatible server: ``url`` is its base (``http://host:8000``, ``/v1`` optional)."""

    url: str
    model: str
    api_key: str = ""
    timeout_s: float = 1800.0  # a 200K prompt's prefill took 139 s on the pair (seed 000)
    record: Recorder | None = None  # sees every request body the bench sends (the suite checks
    # them against vLLM's own request models)
    verify: str | bool = True  # an https URL's certificate: checked against this CA file, or
    # the system's trust (True)
    pair_only: bool = False  # behind one endpoint: measure the pair of this head alone
    _sessions: dict[int, requests.Session] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self.url = self.url.rstrip("/").removesuffix("/v1")

    def _headers(self) -> dict[str, str]:
        h = {"Content-Type": "application/json"}
        if self.pair_only:  # never balanced to another pair (sparkrig/endpoint.py)
            h[LOCAL_HEADER] = PINNED
        if self.api_key:
            h["Authorization"] = f"Bearer {self.api_key}"
        return h

    def _post(self, path: str, body: dict[str, Any], stream: bool = False) -> requests.Response:
        if self.record is not None:
            self.record(path, json.loads(json.dumps(body)))
        return requests.post(
            self.url + path, json=body, headers=self._headers(), stream=stream,
            timeout=(10.0, self.timeout_s), verify=self.verify,
        )  # fmt: skip

    def get_json(self, path: str) -> Any:
        r = requests.get(self.url + path, headers=self._headers(), timeout=30.0, verify=self.verify)
        r.raise_for_status()
        return r.json()

    def unanswered(self) -> str:
        """Why the endpoint does not serve the model ('' when /v1/models lists it): the one line
        the bench says before it measures anything or writes any file."""
        try:
            data = self.get_json("/v1/models").get("data") or []
        except requests.HTTPError as err:
            code = err.response.status_code if err.response is not None else "?"
            hint = " (the API key: --api-key-file)" if code == 401 else ""
            return f"{self.url}/v1/models answered HTTP {code}{hint}"
        except requests.RequestException as err:
            return f"{self.url} does not answer ({type(err).__name__}: {err})"
        except (ValueError, AttributeError):
            return f"{self.url}/v1/models answered no model list"
        ids = [m.get("id") for m in data if isinstance(m, dict)]
        if self.model not in ids:
            return f"{self.url} serves {', '.join(map(str, ids)) or 'no model'}, not {self.model}"
        return ""

    def max_model_len(self) -> int | None:
        """What /v1/models reports for the model (vLLM adds max_model_len); None if not."""
        try:
            data = self.get_json("/v1/models").get("data") or []
        except (requests.RequestException, ValueError, AttributeError):
            return None
        for m in data:
            if isinstance(m, dict) and m.get("id") == self.model:
                n = m.get("max_model_len")
                return int(n) if isinstance(n, int) else None
        return None

    def tokenize(self, messages: list[dict[str, Any]]) -> int | None:
        """The prompt's token count from vLLM's /tokenize (the chat template applied); None
        when the server has no such route."""
        try:
            r = self._post("/tokenize", {"model": self.model, "messages": messages})
            if r.status_code != 200:
                return None
            n = r.json().get("count")
        except (requests.RequestException, ValueError, AttributeError):
            return None
        return n if isinstance(n, int) else None

    def chat(self, body: dict[str, Any]) -> tuple[int, str]:
        """A non-streamed chat completion: (status, body text); status 0 when unreachable."""
        try:
            r = self._post("/v1/chat/completions", body)
            return r.status_code, r.text
        except requests.RequestException as exc:
            return 0, str(exc)

    def chat_stream(self, body: dict[str, Any]) -> StreamResult:
        """A streamed chat completion, timed chunk by chunk."""
        res = StreamResult(t_sent=time.perf_counter())
        try:
            with self._post("/v1/chat/completions", body, stream=True) as r:
                if r.status_code != 200:
                    res.error = f"HTTP {r.status_code}: {r.text[:300]}"
                    return res
                # chunked (vLLM, SGLang, llama.cpp): each chunk as it arrives; otherwise byte by
                # byte, so a read never waits for more than the server has sent
                size = None if getattr(r.raw, "chunked", False) else 1
                for line in r.iter_lines(chunk_size=size):  # type: ignore[arg-type]
                    if not line.startswith(b"data:"):
                        continue
                    data = line[5:].strip()
                    if data == b"[DONE]":
                        break
                    _take(res, json.loads(data), time.perf_counter())
        except (requests.RequestException, ValueError) as exc:
            res.error = f"{type(exc).__name__}: {exc}"
        if not res.error and res.completion_tokens is None:
            res.error = "the server sent no usage (stream_options.include_usage): tokens unknown"
        return res


def _take(res: StreamResult, chunk: dict[str, Any], now: float) -> None:
    usage = chunk.get("usage")
    if isinstance(usage, dict):
        res.prompt_tokens = usage.get("prompt_tokens", res.prompt_tokens)
        res.completion_tokens = usage.get("completion_tokens", res.completion_tokens)
    for choice in chunk.get("choices") or []:
        delta = choice.get("delta") or {}
        text = delta.get("content") or ""
        thought = delta.get("reasoning_content") or delta.get("reasoning") or ""
        if text or thought or delta.get("tool_calls"):
            res.content += text
            res.reasoning += thought
            res.chunks += 1
            if res.t_first is None:
                res.t_first = now
            res.t_last = now
        if choice.get("finish_reason"):
            res.finish_reason = choice["finish_reason"]
