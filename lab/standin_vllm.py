"""Stand-in for `vllm serve` in the lab: stdlib only, OpenAI-compatible, multi-node aware.

Command line: ``[vllm] serve MODEL_DIR [--flag value ...]`` as sparkrig.profiles builds it. The
engine it answers as is the image's flavour (lab/standin_flavour.py: stock vLLM 0.33, Entrpi's
fork, sfxnz's v13, or one that never becomes ready), baked in as $SPARKRIG_STANDIN_ENGINE. An
option the flavour's `vllm serve` does not have (for 0.33: lab/vllm-flags.txt, extracted from its
parser) stops the start with argparse's error and exit 2, like the real engine: a renamed flag
fails here. A value the engine refuses only when it builds its config (`--quantization exl3` on
stock 0.33) stops it there, after the model directory was read, with vLLM's exception and exit 1;
a VLLM_* variable the flavour does not know is warned about then, as vLLM does.

Behaviour, modelled on real vLLM multi-node (mp executor) so ordering, gates and stop-together can
be proven on the lab VMs:

- MODEL_DIR must hold config.json (the real engine reads the mounted weights): exit 1 otherwise. A
  dflash --speculative-config must name an existing drafter directory: exit 1 otherwise.
- The never-ready flavour boots (rendezvous, weights, KV cache) and then hangs in CUDA graph
  capture: its API never starts, so /health never answers 200, while its worker stays joined.
- Rank 0 (head) listens on --master-addr:--master-port (torch.distributed's TCP store) and waits
  until every worker (--nnodes - 1) has joined, then "loads weights", "captures CUDA graphs", starts
  the API on --host:--port and logs "Application startup complete.".
- Workers (--headless or --node-rank > 0) connect to the head, retrying like a rendezvous (the
  worker normally starts first), boot in step and serve no API. When the head goes away the worker
  logs "peer lost" and exits 1.
- When a worker goes away the head logs it and keeps serving /health 200 and /v1/models, like real
  vLLM (ideo-plus; docs/sources.md); completions then fail with HTTP 500 (the engine is dead),
  which is what a real-completion watchdog sees. --standin-exit-on-peer-loss makes the head exit 1
  instead.
- During boot the head logs a caught, benign traceback, as real vLLM/FlashInfer boots do.
- /v1/chat/completions answers arithmetic ("17*23" -> "391"); with tools and tool_choice=required
  (or a named function) it returns one tool call of the first (or named) tool with JSON arguments.
- API key as vLLM 0.33 enforces it (entrypoints/serve/middleware/register.py and authenticate.py):
  the keys of --api-key, else $VLLM_API_KEY; with one, every request whose path starts with /v1,
  /v2, /inference or /cohere (any method but OPTIONS, routed or not) needs `Authorization: Bearer
  <key>` (scheme case-insensitive) or gets 401 {"error": "Unauthorized"}; /health, /version etc.
  stay open, and so does POST /invocations (SageMaker's dispatch: a chat request answered as
  /v1/chat/completions, vLLM 0.33 serve/sagemaker/api_router.py), which the API front must close.
- FastAPI's docs routes (/docs, /redoc, /openapi.json) answer 200 unless --disable-fastapi-docs
  (vLLM 0.33 launchers/app.py), which the deploy passes.

- Answers are timed by lab/standin_engine.py: an exact prefill and decode rate, max_tokens,
  min_tokens, ignore_eos and stream_options as vLLM 0.33 honours them, real streaming (SSE over
  chunked transfer), /tokenize, and /metrics with vLLM's own metric names; its knobs (rates, a
  wedged and a long-prefill mode, the slow variant's speed) are described there.
- SIGUSR1 wedges the running head (standin_engine.Engine.wedge): /metrics freezes as it is at that
  moment, /health stays 200, no token comes again; a restarted process starts as configured. In
  the lab, `docker kill -s USR1 sparkrig-rank0` delivers it: this process is the container's PID 1
  (the image's `vllm` wrapper execs python3, the rank unit runs no --init) and installs a handler,
  so PID 1 takes the signal. There is no HTTP mode switch: vLLM has none, and a wedge or a long
  prefill is driven as it happens on a pair (tests/lab: a request decoding when the signal comes; a
  200K-token prompt at the lab images' STANDIN_PREFILL_TOK_S, lab/image.py).

Env STANDIN_FAIL_GATES=math (set in the lab's failing image variant): arithmetic answers are
wrong, so the math gate fails.

Speculative decoding's counters (vLLM 0.33 v1/spec_decode/metrics.py ``SpecDecodingProm``, which
exists only with a --speculative-config): /metrics then also carries
``vllm:spec_decode_num_drafts_total``, ``vllm:spec_decode_num_draft_tokens_total`` and
``vllm:spec_decode_num_accepted_tokens_total``, consistent with the tokens generated: each
verify step proposes num_speculative_tokens (k) draft tokens and emits the accepted ones plus
one, so ``drafts = ceil(generated / (1 + acceptance x k))`` and ``accepted = generated - drafts``.
The acceptance (accepted / draft tokens, what vLLM logs as "Avg Draft acceptance rate") is
--standin-acceptance or $STANDIN_ACCEPTANCE, 0 to 1, default 0.35 (what users measure with
incoai's DFlash2 7d74cdd on prose, tonyd2wild/GLM-5.3-Flash-NVFP4-DFlash2-2x-DGX-Spark#7).
The per-position counter is not served (the bench reads the three totals only).

Stand-in only flags: --standin-delay SECONDS (per boot stage, default $STANDIN_DELAY or 0.5),
--standin-rendezvous-timeout SECONDS (default 600, torch's), --standin-exit-on-peer-loss,
--standin-acceptance SHARE (the draft acceptance above).
"""

from __future__ import annotations

import hashlib
import json
import math
import mmap
import os
import re
import secrets
import signal
import socket
import sys
import threading
import time
import traceback
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # standin_engine, shipped beside it
import standin_engine as engine  # noqa: E402
import standin_flavour as flavours  # noqa: E402

VERSION = "0.0.0+standin"

# The stock flavour's `vllm serve` options (lab/vllm-flags.txt, extracted from the pinned vLLM's own
# parser by scripts/extract-vllm-flags.py; shipped next to this file in the stand-in image).
FLAGS_FILE = os.path.join(flavours.HERE, "vllm-flags.txt")
STANDIN_FLAGS = {
    "--standin-delay": "1", "--standin-rendezvous-timeout": "1", "--standin-exit-on-peer-loss": "0",
    "--standin-acceptance": "1", **engine.FLAGS,
}  # fmt: skip


def load_flags(flavour: flavours.Flavour | None = None) -> dict[str, str]:
    """option -> nargs ("0", "1", "?", "+", "*") of the flavour's vLLM (the image's, by
    default), plus the stand-in's own."""
    flavour = flavours.load() if flavour is None else flavour
    return {**STANDIN_FLAGS, **flavour.flags}


def log(msg: str, level: str = "INFO") -> None:
    stamp = time.strftime("%m-%d %H:%M:%S")
    print(f"{level} {stamp} [standin] {msg}", flush=True)


class Options:
    def __init__(self) -> None:
        self.model = ""
        self.values: dict[str, str] = {}
        self.multi: dict[str, list[str]] = {}
        self.switches: set[str] = set()
        self.unknown: list[str] = []

    def get(self, flag: str, default: str | None = None) -> str | None:
        """The flag's value; for a list flag (--served-model-name is nargs +) its first."""
        if flag in self.multi and self.multi[flag]:
            return self.multi[flag][0]
        return self.values.get(flag, default)

    def num(self, flag: str, default: int) -> int:
        v = self.values.get(flag)
        return default if v is None else int(v)

    @property
    def nnodes(self) -> int:
        return self.num("--nnodes", 1)

    @property
    def rank(self) -> int:
        return self.num("--node-rank", 0)

    @property
    def headless(self) -> bool:
        return "--headless" in self.switches or self.rank > 0

    @property
    def served_name(self) -> str:
        return self.get("--served-model-name") or self.model

    @property
    def delay(self) -> float:
        return float(self.get("--standin-delay") or os.environ.get("STANDIN_DELAY", "0.5"))


def _is_option(token: str) -> bool:
    return token.startswith("-") and len(token) > 1 and not token[1].isdigit()


def _resolve(flag: str, flags: dict[str, str]) -> str:
    """argparse's allow_abbrev (on in vLLM's parser): a unique prefix of a long option is that
    option (`--kv-cache-memory` is `--kv-cache-memory-bytes` in vLLM 0.33); else unchanged."""
    if flag in flags or not flag.startswith("--"):
        return flag
    matches = [f for f in flags if f.startswith(flag)]
    return matches[0] if len(matches) == 1 else flag


def parse_args(argv: list[str], flags: dict[str, str] | None = None) -> Options:
    """`vllm serve` parser: ``[serve] MODEL --flag value --flag=value --switch ...``. Any option
    the pinned vLLM does not know, or a second positional, is collected in ``unknown`` (the caller
    refuses to start, as vLLM's argparse does). Underscores in option names count as dashes
    (vLLM's FlexibleArgumentParser)."""
    flags = load_flags() if flags is None else flags
    args = list(argv)
    if args and args[0] == "serve":
        args = args[1:]
    opts = Options()
    i = 0
    while i < len(args):
        a = args[i]
        i += 1
        if not _is_option(a):
            if not opts.model:
                opts.model = a
            else:
                opts.unknown.append(a)
            continue
        flag, eq, inline = a.partition("=")
        if flag.startswith("--"):
            flag = "--" + flag[2:].replace("_", "-")
        flag = _resolve(flag, flags)
        nargs = flags.get(flag)
        if nargs is None:
            opts.unknown.append(flag)
            continue
        if eq:
            values = [inline]
        elif nargs == "0":
            opts.switches.add(flag)
            continue
        else:
            values = []
            while i < len(args) and not _is_option(args[i]):
                values.append(args[i])
                i += 1
                if nargs in ("1", "?"):
                    break
            if nargs in ("1", "+") and not values:
                raise SystemExit(f"vllm serve: error: argument {flag}: expected a value")
        if nargs in ("+", "*"):
            opts.multi.setdefault(flag, []).extend(values)
        elif values:
            opts.values[flag] = values[0]
    return opts


# --- answers ------------------------------------------------------------------------------------
_ARITH = re.compile(r"(-?\d+(?:\.\d+)?)\s*([*x×+\-/])\s*(-?\d+(?:\.\d+)?)")


def arithmetic_answer(text: str) -> str | None:
    """Deterministic answer to the first "a op b" in the text, or None. In the lab's failing
    image variant (STANDIN_FAIL_GATES=math in its config, lab/image.py) it answers nothing
    useful, so the math gate fails while /health and /v1/models pass (an upgrade to test)."""
    m = _ARITH.search(text)
    if not m:
        return None
    if os.environ.get("STANDIN_FAIL_GATES") == "math":
        return "I cannot compute that."
    a, op, b = float(m.group(1)), m.group(2), float(m.group(3))
    if op in "*x×":
        r = a * b
    elif op == "+":
        r = a + b
    elif op == "-":
        r = a - b
    else:
        if b == 0:
            return None
        r = a / b
    return str(int(r)) if r == int(r) else repr(r)


def _example_value(schema: Any) -> Any:
    if not isinstance(schema, dict):
        return "standin"
    if "enum" in schema and schema["enum"]:
        return schema["enum"][0]
    t = schema.get("type")
    if isinstance(t, list):
        t = next((x for x in t if x != "null"), "string")
    if t == "integer":
        return 1
    if t == "number":
        return 1.0
    if t == "boolean":
        return True
    if t == "array":
        return []
    if t == "object":
        return tool_arguments(schema)
    return "standin"


def tool_arguments(parameters: Any) -> dict[str, Any]:
    """Arguments for a function's JSON schema: every required property (or all if none listed)."""
    if not isinstance(parameters, dict):
        return {}
    props = parameters.get("properties") or {}
    names = parameters.get("required") or list(props)
    return {n: _example_value(props.get(n, {})) for n in names}


def message_text(messages: Any) -> str:
    parts: list[str] = []
    for m in messages if isinstance(messages, list) else []:
        if not isinstance(m, dict) or m.get("role") not in ("user", "system", None):
            continue
        c = m.get("content")
        if isinstance(c, str):
            parts.append(c)
        elif isinstance(c, list):
            parts += [p.get("text", "") for p in c if isinstance(p, dict)]
    return "\n".join(parts)


class Answer:
    """What the stand-in's model answers a chat request: tool calls, or text (natural length,
    before the sampling limits), Japanese or not."""

    def __init__(self, req: dict[str, Any]) -> None:
        messages = req.get("messages") or []
        text = message_text(messages)
        tools = req.get("tools") or []
        choice = req.get("tool_choice")
        self.tool_calls: list[dict[str, Any]] | None = None
        self.japanese = False
        self.text = ""
        chosen = None
        if tools and choice == "required":
            chosen = tools[0]
        elif tools and isinstance(choice, dict):
            want = (choice.get("function") or {}).get("name")
            chosen = next((t for t in tools if (t.get("function") or {}).get("name") == want), None)
        if chosen is not None:
            fn = chosen.get("function") or {}
            self.tool_calls = [
                {
                    "id": "chatcmpl-tool-" + uuid.uuid4().hex[:16],
                    "type": "function",
                    "function": {
                        "name": fn.get("name", "tool"),
                        "arguments": json.dumps(tool_arguments(fn.get("parameters"))),
                    },
                }
            ]
            self.text = self.tool_calls[0]["function"]["arguments"]
            return
        users = [m for m in messages if isinstance(m, dict) and m.get("role") == "user"]
        last = engine.content_text(users[-1].get("content")) if users else ""
        self.japanese = bool(engine._JAPANESE.search(last))
        arith = arithmetic_answer(text)
        recall = engine.recall_answer(messages)
        if arith is not None:
            self.text = arith
        elif recall is not None:
            self.text = recall
        elif self.japanese:
            self.text = engine.JAPANESE
        else:
            self.text = engine.PROSE

    @property
    def natural_tokens(self) -> int:
        return max(1, len(engine.pieces_of(self.text, self.japanese)))


def chat_body(served_name: str, answer: Answer, content: str, finish: str, prompt: int,
              completion: int) -> dict[str, Any]:  # fmt: skip
    message: dict[str, Any] = {"role": "assistant", "content": None}
    if answer.tool_calls is not None:
        message["tool_calls"] = answer.tool_calls
        finish = "tool_calls"
    else:
        message["content"] = content
    return {
        "id": "chatcmpl-" + uuid.uuid4().hex,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": served_name,
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish}],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        },
    }


def chat_completion(req: dict[str, Any], served_name: str) -> dict[str, Any]:
    """Body of a /v1/chat/completions answer (non-streaming, untimed)."""
    answer = Answer(req)
    n = answer.natural_tokens
    prompt = engine.prompt_tokens(req.get("messages"))
    return chat_body(served_name, answer, answer.text, "stop", prompt, n)


def text_completion(req: dict[str, Any], served_name: str) -> dict[str, Any]:
    prompt = req.get("prompt") or ""
    if isinstance(prompt, list):
        prompt = " ".join(str(p) for p in prompt)
    answer = arithmetic_answer(str(prompt))
    return {
        "id": "cmpl-" + uuid.uuid4().hex,
        "object": "text_completion",
        "created": int(time.time()),
        "model": served_name,
        "choices": [
            {"index": 0, "text": answer if answer is not None else " standin", "logprobs": None,
             "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }  # fmt: skip


# --- speculative decoding -----------------------------------------------------------------
DEFAULT_ACCEPTANCE = 0.35  # prose with incoai's DFlash2 7d74cdd, k=7 (the module's docstring)


class SpecDecode:
    """The spec-decode counters of an engine started with a --speculative-config: k draft
    tokens a verify step, ``acceptance`` of them accepted."""

    def __init__(self, k: int, acceptance: float) -> None:
        self.k = max(1, k)
        self.acceptance = acceptance

    def counts(self, generated: int) -> tuple[int, int, int]:
        """(drafts, draft tokens, accepted tokens) after ``generated`` output tokens: each step
        emits its accepted tokens plus one; accepted never exceeds k per step."""
        if generated <= 0:
            return 0, 0, 0
        drafts = math.ceil(generated / (1 + self.acceptance * self.k))
        return drafts, drafts * self.k, generated - drafts

    def metrics(self, model: str, generated: int) -> str:
        drafts, draft_tokens, accepted = self.counts(generated)
        return engine.exposition(model, [
            ("vllm:spec_decode_num_drafts", "counter", "Number of spec decoding drafts.", drafts),
            ("vllm:spec_decode_num_draft_tokens", "counter", "Number of draft tokens.",
             draft_tokens),
            ("vllm:spec_decode_num_accepted_tokens", "counter", "Number of accepted tokens.",
             accepted),
        ])  # fmt: skip


def spec_decode(opts: Options, environ: Any = os.environ) -> SpecDecode | None:
    """The counters' model when the engine speculates (a --speculative-config), else None;
    a bad --standin-acceptance stops the start."""
    spec = opts.get("--speculative-config")
    if not spec:
        return None
    try:
        k = int(json.loads(spec).get("num_speculative_tokens") or 1)
    except (ValueError, TypeError, AttributeError):
        k = 1
    raw = opts.get("--standin-acceptance") or environ.get("STANDIN_ACCEPTANCE")
    try:
        share = DEFAULT_ACCEPTANCE if raw in (None, "") else float(raw)
    except ValueError:
        raise SystemExit(f"stand-in: --standin-acceptance: not a number: {raw!r}") from None
    if not 0 <= share <= 1:
        raise SystemExit(f"stand-in: --standin-acceptance: must be 0 to 1, got {raw!r}")
    return SpecDecode(k, share)


# --- rendezvous ---------------------------------------------------------------------------------
class Peers:
    """The head's view of its workers: joined ranks, and whether one has been lost."""

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.joined: set[int] = set()
        self.lost: list[int] = []
        self.cond = threading.Condition()

    def wait_all(self, timeout: float) -> bool:
        with self.cond:
            return self.cond.wait_for(lambda: len(self.joined) >= self.expected, timeout)

    @property
    def dead(self) -> bool:
        with self.cond:
            return bool(self.lost)


def _heartbeat(sock: socket.socket, stop: threading.Event) -> None:
    while not stop.wait(1.0):
        try:
            sock.sendall(b"ping\n")
        except OSError:
            return


def _watch(sock: socket.socket, timeout: float = 30.0) -> str:
    """Block until the peer goes away; returns why. A dead peer resets the connection at once;
    the timeout only catches a frozen one, so it is generous: a 1-vCPU TCG guest busy with a
    deploy stalled a 5 s heartbeat and both ranks took each other for dead."""
    sock.settimeout(timeout)
    try:
        while True:
            data = sock.recv(4096)
            if not data:
                return "connection closed"
    except TimeoutError:
        return f"no heartbeat for {timeout:.0f} s"
    except OSError as exc:
        return str(exc)


def _readline(sock: socket.socket, timeout: float) -> bytes:
    sock.settimeout(timeout)
    buf = b""
    while not buf.endswith(b"\n"):
        chunk = sock.recv(1)
        if not chunk:
            break
        buf += chunk
    return buf


def head_rendezvous(opts: Options, peers: Peers, on_lost: Any) -> socket.socket:
    addr = opts.get("--master-addr") or "127.0.0.1"
    port = opts.num("--master-port", 29500)
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((addr, port))
    srv.listen(16)
    log(f"TCP store listening on {addr}:{port}, waiting for {peers.expected} worker(s)")

    def serve_one(conn: socket.socket, peer: Any) -> None:
        try:
            hello = json.loads(_readline(conn, 10.0) or b"{}")
        except (OSError, ValueError):
            conn.close()
            return
        rank, nnodes = hello.get("rank"), hello.get("nnodes")
        with peers.cond:
            ok = (
                nnodes == opts.nnodes
                and isinstance(rank, int)
                and 0 < rank < opts.nnodes
                and rank not in peers.joined
            )
            if ok:
                peers.joined.add(rank)
                peers.cond.notify_all()
        if not ok:
            log(f"rejected worker {peer[0]} rank={rank} nnodes={nnodes}", "ERROR")
            conn.sendall(json.dumps({"ok": False, "nnodes": opts.nnodes}).encode() + b"\n")
            conn.close()
            return
        conn.sendall(json.dumps({"ok": True}).encode() + b"\n")
        log(f"worker rank {rank} joined from {peer[0]} ({len(peers.joined)}/{peers.expected})")
        stop = threading.Event()
        threading.Thread(target=_heartbeat, args=(conn, stop), daemon=True).start()
        why = _watch(conn)
        stop.set()
        conn.close()
        with peers.cond:
            peers.lost.append(rank)
        on_lost(rank, why)

    def accept_loop() -> None:
        while True:
            try:
                conn, peer = srv.accept()
            except OSError:
                return
            threading.Thread(target=serve_one, args=(conn, peer), daemon=True).start()

    threading.Thread(target=accept_loop, daemon=True).start()
    return srv


def worker_connect(opts: Options, timeout: float) -> socket.socket:
    addr = opts.get("--master-addr") or "127.0.0.1"
    port = opts.num("--master-port", 29500)
    deadline = time.monotonic() + timeout
    log(f"rank {opts.rank}: connecting to the TCP store at {addr}:{port}")
    last = ""
    while time.monotonic() < deadline:
        try:
            sock = socket.create_connection((addr, port), timeout=5.0)
        except OSError as exc:
            if str(exc) != last:
                log(f"rank {opts.rank}: head not reachable yet ({exc}); retrying")
                last = str(exc)
            time.sleep(0.2)
            continue
        sock.sendall(json.dumps({"rank": opts.rank, "nnodes": opts.nnodes}).encode() + b"\n")
        reply = json.loads(_readline(sock, 10.0) or b"{}")
        if not reply.get("ok"):
            sock.close()
            fail(f"head refused rank {opts.rank} (head nnodes={reply.get('nnodes')})")
        return sock
    fail(f"rendezvous timed out after {timeout:.0f} s waiting for {addr}:{port}")
    raise AssertionError  # unreachable


def fail(msg: str, code: int = 1) -> None:
    log(msg, "ERROR")
    raise SystemExit(code)


# --- HTTP ---------------------------------------------------------------------------------------
# vLLM 0.33 entrypoints/serve/middleware/authenticate.py: the paths its middleware guards.
GUARDED_PREFIX = ("/v1", "/v2", "/inference", "/cohere")
# FastAPI's default docs routes, gone with --disable-fastapi-docs (vLLM 0.33 launchers/app.py)
DOCS_ROUTES = ("/docs", "/redoc", "/openapi.json")


def api_tokens(opts: Options, environ: Any = os.environ) -> list[str]:
    """vLLM's keys: --api-key (any number) take precedence over VLLM_API_KEY; empties dropped."""
    return [key for key in (opts.multi.get("--api-key") or [environ.get("VLLM_API_KEY")]) if key]


def authorized(method: str, path: str, authorization: str | None, tokens: list[str]) -> bool:
    """vLLM's AuthenticationMiddleware decision: OPTIONS and unguarded paths pass; a guarded
    path needs "Bearer <one of the tokens>" (scheme any case, one space, exact token)."""
    if not tokens or method == "OPTIONS" or not path.startswith(GUARDED_PREFIX):
        return True
    if not authorization:
        return False
    scheme, _, param = authorization.partition(" ")
    if scheme.lower() != "bearer":
        return False
    given = hashlib.sha256(param.encode("utf-8")).digest()
    ok = False
    for token in tokens:
        ok |= secrets.compare_digest(given, hashlib.sha256(token.encode("utf-8")).digest())
    return ok


class Api(ThreadingHTTPServer):
    daemon_threads = True
    opts: Options
    peers: Peers
    tokens: list[str]
    engine: engine.Engine
    spec: SpecDecode | None = None


class Handler(BaseHTTPRequestHandler):
    server: Api
    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        super().setup()
        # no Nagle delay between a stream's small writes (uvicorn's asyncio transports set
        # TCP_NODELAY too): without it the first token waits ~40 ms for the client's delayed ACK
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        log(f'{self.client_address[0]} "{self.requestline}" {args[1] if len(args) > 1 else ""}')

    def _send(self, code: int, body: Any = None, ctype: str = "application/json") -> None:
        data = b"" if body is None else (json.dumps(body).encode() if ctype.endswith("json")
                                         else body)  # fmt: skip
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, code: int, message: str, kind: str) -> None:
        self._send(code, {"error": {"message": message, "type": kind, "code": code}})

    def _authorized(self, path: str) -> bool:
        """Answer 401 as vLLM does (before routing) unless the request may pass."""
        auth = self.headers.get("Authorization")
        if authorized(self.command, path, auth, self.server.tokens):
            return True
        self._send(401, {"error": "Unauthorized"})
        return False

    def do_GET(self) -> None:  # noqa: N802 - stdlib name
        opts = self.server.opts
        path = self.path.split("?", 1)[0]
        if not self._authorized(path):
            return
        if path == "/health":
            self._send(200)
        elif path == "/v1/models":
            model = {
                "id": opts.served_name,
                "object": "model",
                "created": int(time.time()),
                "owned_by": "vllm",
                "root": opts.model,
                "max_model_len": opts.num("--max-model-len", 262144),
            }
            self._send(200, {"object": "list", "data": [model]})
        elif path in DOCS_ROUTES and "--disable-fastapi-docs" not in opts.switches:
            self._send(200, {"openapi": "3.1.0", "info": {"title": "vLLM stand-in"}})
        elif path == "/version":
            self._send(200, {"version": VERSION})
        elif path == "/metrics":  # outside /v1: vLLM's key does not guard it
            eng, spec = self.server.engine, self.server.spec
            text = eng.metrics()
            if spec is not None:  # the wedge's frozen counts: no token moves them
                text += spec.metrics(eng.served_name, eng.counts()["generation"])
            self._send(200, text.encode(), "text/plain; version=0.0.4; charset=utf-8")
        else:
            self._error(404, f"no route {path}", "NotFoundError")

    def do_POST(self) -> None:  # noqa: N802 - stdlib name
        arrival = time.monotonic()
        opts = self.server.opts
        path = self.path.split("?", 1)[0]
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)  # read even when refused: the connection is kept alive
        if not self._authorized(path):
            return
        try:
            req = json.loads(raw or b"{}")
            if not isinstance(req, dict):
                raise ValueError("body must be a JSON object")
        except ValueError as exc:
            self._error(400, f"invalid JSON: {exc}", "BadRequestError")
            return
        if path == "/tokenize":  # outside /v1: vLLM's key does not guard it
            self._tokenize(req)
            return
        if path == "/invocations":  # outside /v1: vLLM's key does not guard it
            path = "/v1/chat/completions" if "messages" in req else "/v1/completions"
        if path not in ("/v1/chat/completions", "/v1/completions"):
            self._error(404, f"no route {path}", "NotFoundError")
            return
        if req.get("model") not in (None, opts.served_name):
            self._error(404, f"The model `{req.get('model')}` does not exist.", "NotFoundError")
            return
        if self.server.peers.dead:
            self._error(500, "EngineCore died: a worker rank was lost", "EngineDeadError")
            return
        if path == "/v1/completions":
            self._send(200, text_completion(req, opts.served_name))
            return
        try:
            self._chat(req, arrival)
        except engine.BadRequest as exc:
            self._error(400, str(exc), "BadRequestError")

    def _tokenize(self, req: dict[str, Any]) -> None:
        if "messages" in req:
            n = engine.prompt_tokens(req.get("messages"))
        else:
            n = engine.count_tokens(str(req.get("prompt") or ""))
        limit = self.server.engine.knobs.max_model_len
        self._send(200, {"count": n, "max_model_len": limit, "tokens": list(range(n))})

    def _chat(self, req: dict[str, Any], arrival: float) -> None:
        eng = self.server.engine
        answer = Answer(req)
        prompt = engine.prompt_tokens(req.get("messages"))
        limit = eng.knobs.max_model_len
        n, finish = engine.output_length(req, prompt, answer.natural_tokens, limit)
        if answer.tool_calls is not None:
            n, finish = answer.natural_tokens, "tool_calls"
        pieces = engine.generate(answer.text, n, answer.japanese, eng.knobs.fffd_per_10k)
        if not req.get("stream"):
            with eng.slot() as admitted:
                eng.generate(prompt, pieces, lambda *_: None, admitted or arrival)
            self._send(200, chat_body(eng.served_name, answer, "".join(pieces), finish, prompt, n))
            return
        options = req.get("stream_options") or {}
        usage = bool(options.get("include_usage"))
        continuous = usage and bool(options.get("continuous_usage_stats"))
        rid, created = "chatcmpl-" + uuid.uuid4().hex, int(time.time())
        sent = [0]

        def event(choices: list[dict[str, Any]], done: int | None) -> None:
            chunk: dict[str, Any] = {"id": rid, "object": "chat.completion.chunk",
                                     "created": created, "model": eng.served_name,
                                     "choices": choices}  # fmt: skip
            if done is not None:
                chunk["usage"] = {"prompt_tokens": prompt, "completion_tokens": done,
                                  "total_tokens": prompt + done}  # fmt: skip
            self._write_chunk(f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n".encode())

        def emit(part: list[str], first: bool, last: bool) -> None:
            if first:
                role = {"role": "assistant", "content": ""}
                event([{"index": 0, "delta": role, "logprobs": None, "finish_reason": None}],
                      0 if continuous else None)  # fmt: skip
            sent[0] += len(part)
            if answer.tool_calls is not None:
                delta: dict[str, Any] = {"tool_calls": [{"index": 0, **answer.tool_calls[0]}]}
                if not last:
                    return
            else:
                delta = {"content": "".join(part)}
            choice = {"index": 0, "delta": delta, "logprobs": None,
                      "finish_reason": finish if last else None}  # fmt: skip
            event([choice], sent[0] if continuous else None)

        self.send_response(200)  # the headers go out at once, as vLLM's StreamingResponse does
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.flush()
        with eng.slot() as admitted:
            eng.generate(prompt, pieces, emit, admitted or arrival)
        if usage:
            event([], n)
        self._write_chunk(b"data: [DONE]\n\n")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _write_chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()


# --- main ---------------------------------------------------------------------------------------
HELP = """usage: vllm serve MODEL_DIR [options]   (sparkrig lab stand-in for vLLM)
  --host H --port P --served-model-name NAME --nnodes N --node-rank R --headless
  --master-addr A --master-port P   (any flag of the image's flavour of vLLM; others are refused)
  --standin-delay S --standin-rendezvous-timeout S --standin-exit-on-peer-loss
  --standin-decode-tok-s R --standin-prefill-tok-s R --standin-speed F --standin-tokens-per-chunk K
  --standin-fffd-per-10k N --standin-mode normal|wedged|long-prefill --standin-wedge-after N
  --standin-long-prefill-s S   (or the STANDIN_* environment: lab/standin_engine.py)
  --standin-acceptance SHARE   (spec-decode counters with --speculative-config; $STANDIN_ACCEPTANCE)
"""


def check_model(opts: Options) -> None:
    if not opts.model:
        fail("no model given: vllm serve MODEL_DIR ...", 2)
    if not os.path.isfile(os.path.join(opts.model, "config.json")):
        fail(f"model directory {opts.model} has no config.json (weights not mounted?)")
    spec = opts.get("--speculative-config")
    if spec:
        try:
            cfg = json.loads(spec)
        except ValueError:
            fail(f"--speculative-config is not JSON: {spec}", 2)
        drafter = cfg.get("model")
        if cfg.get("method") == "dflash" and not (drafter and os.path.isdir(drafter)):
            fail(f"speculative drafter directory {drafter} does not exist")


def benign_traceback() -> None:
    """Log a caught traceback, as real vLLM/FlashInfer boots do (an autotuner tactic that does not
    fit, an optional kernel missing): the deploy's boot wait must not take it for a failure."""
    try:
        raise RuntimeError("CUDA error: too many resources requested for launch (tactic 3)")
    except RuntimeError:
        log("autotuner: tactic 3 failed, skipping it (stand-in: benign)", "WARNING")
        traceback.print_exc(file=sys.stdout)
        sys.stdout.flush()


def stage(opts: Options, msg: str) -> None:
    log(msg)
    time.sleep(opts.delay)


def validate_serve_args(opts: Options) -> None:
    """vLLM 0.33's checks before anything loads (entrypoints/common/cli_args.py
    validate_parsed_serve_args): a --chat-template that looks like a path must exist
    (renderers/chat_utils/chat_template.py; the stand-in has no built-in templates to fall back
    on). A rank whose template file was not mounted stops here."""
    template = opts.get("--chat-template")
    if template is not None and not any(c in template for c in "{}\n"):
        if not os.path.exists(template):
            builtin = f"<vllm>/transformers_utils/chat_templates/{template}"
            exception_exit(
                "vllm.exceptions.VLLMValidationError: The supplied chat template string "
                f"({template}) appears path-like, but doesn't exist! Tried: {template} and "
                f"{builtin} (parameter=chat_template)",
                "vllm/entrypoints/common/cli_args.py, in validate_parsed_serve_args",
            )


def build_config(opts: Options, flavour: flavours.Flavour) -> None:
    """The stage where vLLM builds its engine config (create_engine_config, head and headless
    worker alike): unknown VLLM_* variables are warned about (refused with
    --fail-on-environ-validation), then a value the flavour's engine does not have stops it with
    vLLM's exception and exit 1."""
    where = "vllm/engine/arg_utils.py, in create_engine_config"
    for name in flavours.unknown_env(flavour):
        if "--fail-on-environ-validation" in opts.switches:
            exception_exit(f"ValueError: Unknown vLLM environment variable detected: {name}", where)
        log(f"Unknown vLLM environment variable detected: {name}", "WARNING")
    error = flavours.config_error(flavour, opts.get)
    if error is not None:
        exception_exit(error, where)


def exception_exit(error: str, where: str) -> None:
    """End as `vllm serve` does when an exception escapes it: a traceback ending in the
    exception's line on stderr, exit 1."""
    print("Traceback (most recent call last):", file=sys.stderr)
    print(f"  File {where} (stand-in)", file=sys.stderr)
    print(error, file=sys.stderr, flush=True)
    raise SystemExit(1)


def run(argv: list[str]) -> int:
    if not argv or argv[0] in ("--help", "-h") or argv[:2] == ["serve", "--help"]:
        print(HELP, end="")
        return 0
    if argv[0] == "--version":
        print(VERSION)
        return 0
    flavour = flavours.load()
    opts = parse_args(argv, load_flags(flavour))
    if opts.unknown:  # argparse's own wording and exit status
        print(
            f"vllm serve: error: unrecognized arguments: {' '.join(opts.unknown)}", file=sys.stderr
        )
        return 2
    validate_serve_args(opts)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    log(f"vLLM API server version {VERSION} (stand-in flavour {flavour.name})")
    check_model(opts)
    build_config(opts, flavour)
    tp = opts.num("--tensor-parallel-size", opts.nnodes)
    log(
        f"Initializing a V1 LLM engine ({VERSION}) with config: model={opts.model!r}, "
        f"tensor_parallel_size={tp}, nnodes={opts.nnodes}, node_rank={opts.rank}"
    )
    timeout = float(opts.get("--standin-rendezvous-timeout") or 600)
    if opts.headless:
        return run_worker(opts, timeout)
    return run_head(opts, timeout, never_ready=flavour.never_ready)


def run_worker(opts: Options, timeout: float) -> int:
    if opts.nnodes < 2:
        fail("--headless needs --nnodes >= 2")
    sock = worker_connect(opts, timeout)
    log(f"world_size={opts.nnodes} rank={opts.rank} backend=nccl: joined the head")
    stop = threading.Event()
    threading.Thread(target=_heartbeat, args=(sock, stop), daemon=True).start()
    lost: list[str] = []

    def watch() -> None:
        lost.append(_watch(sock))

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    for msg in (
        f"Starting to load model {opts.model}...",
        f"Loading weights took {opts.delay:.2f} seconds",
        "Capturing CUDA graphs (decode, FULL): 100%",
        "Graph capturing finished in 0 secs",
    ):
        if lost:
            break
        stage(opts, msg)
    if not lost:
        log(f"rank {opts.rank}: headless worker ready, serving the head")
    watcher.join()
    fail(f"peer lost: head went away ({lost[0]}); exiting")
    return 1


def hang_in_graph_capture() -> int:
    """Hang where a real boot can hang for good (CUDA graph capture): the API never starts, so
    /health never answers; SIGTERM still stops the process (docker stop)."""
    log("Capturing CUDA graphs (decode, FULL): 0%")
    while True:
        time.sleep(3600)


def run_head(opts: Options, timeout: float, never_ready: bool = False) -> int:
    knobs = engine.knobs_from(
        opts.get,
        max_num_seqs=opts.num("--max-num-seqs", engine.DEFAULT_MAX_NUM_SEQS),
        max_model_len=opts.num("--max-model-len", 262144),
        batched_tokens=opts.num("--max-num-batched-tokens", engine.DEFAULT_BATCHED_TOKENS),
    )
    spec = spec_decode(opts)
    peers = Peers(opts.nnodes - 1)
    exit_on_loss = "--standin-exit-on-peer-loss" in opts.switches

    def on_lost(rank: int, why: str) -> None:
        log(
            f"peer lost: worker rank {rank} ({why}); the engine is dead, /health stays 200", "ERROR"
        )
        if exit_on_loss:
            os._exit(1)

    if peers.expected > 0:
        srv = head_rendezvous(opts, peers, on_lost)
        if not peers.wait_all(timeout):
            srv.close()
            fail(f"rendezvous timed out after {timeout:.0f} s: {len(peers.joined)} of "
                 f"{peers.expected} worker(s) joined")  # fmt: skip
        log(f"world_size={opts.nnodes} rank=0 backend=nccl: all ranks joined")
    boot = [
        f"Starting to load model {opts.model}...",
        f"Loading weights took {opts.delay:.2f} seconds",
        "GPU KV cache size: 1,103,764 tokens",
    ]
    for msg in boot:
        stage(opts, msg)
    benign_traceback()
    if never_ready:
        return hang_in_graph_capture()
    for msg in ("Capturing CUDA graphs (decode, FULL): 100%", "Graph capturing finished in 0 secs"):
        stage(opts, msg)
    host = opts.get("--host") or "0.0.0.0"
    port = opts.num("--port", 8000)
    api = Api((host, port), Handler)
    api.opts, api.peers, api.tokens = opts, peers, api_tokens(opts)
    api.engine = engine.Engine(knobs, opts.served_name)
    api.spec = spec
    signal.signal(signal.SIGUSR1, lambda *_: api.engine.wedge())
    k = api.engine.knobs
    log(
        f"stand-in engine: decode {k.decode_tok_s:g} tok/s per stream, prefill "
        f"{k.prefill_tok_s:g} tok/s, {k.tokens_per_chunk} token(s) per chunk, mode {k.mode}"
    )
    if spec is not None:
        log(f"stand-in spec decode: {spec.k} draft tokens a step, acceptance {spec.acceptance:g}")
    log(f"Starting vLLM API server 0 on http://{host}:{port}")
    log(f"Available routes: /health, /v1/models, /v1/chat/completions (model {opts.served_name})")
    print("INFO:     Application startup complete.", flush=True)
    try:
        api.serve_forever()
    finally:
        api.server_close()
    return 0


NCCL_DIR = "/opt/standin/nccl"  # lab/image.py fake_nccl_files
_MAPPED: list[object] = []  # kept open: a real engine keeps its libnccl mapped while it serves


def map_nccl() -> None:
    """Map a libnccl file as a real engine loads one (STANDIN_NCCL: "system", DGX OS's 2.28.9
    build, the default; "pip": pip's, listed as known bad), so that `sparkhost runtime` finds it
    in this process's /proc/<pid>/maps. An image without the files maps nothing."""
    build = os.environ.get("STANDIN_NCCL", "system")
    folder = os.path.join(NCCL_DIR, build)
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        with open(os.path.join(folder, name), "rb") as f:
            _MAPPED.append(mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ))


def main() -> int:
    map_nccl()
    try:
        return run(sys.argv[1:])
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
