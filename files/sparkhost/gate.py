"""``sparkhost gate``: serving gates and boot-stage reader, run on the head.

    sparkhost gate gates [--url URL] [--model NAME] [--only health,models,math,tool,locked]
                           [--api-key-file FILE]
        One JSON line per gate: {"gate": "math", "ok": true, "detail": "...", "ms": 123}.
        Exit 0 when every gate passed, 1 otherwise. Gates (docs/sources.md): /health 200;
        /v1/models lists NAME; "17*23" answers 391; a tool call with tool_choice=required whose
        tool_calls[0].function.arguments is a JSON object; locked: /invocations and /tokenize
        (routes vLLM's own key does not guard) answer 401 to a request without the key, i.e.
        the API front checks it (docs/front.md), and every LOCKED_SPELLINGS is refused.
        Without --api-key-file (api_auth off) the locked gate passes, saying the API is open.
    sparkhost gate wait [--url URL] [--container NAME] [--timeout S] [--interval S]
        Poll /health until 200, printing a JSON progress line whenever the boot stage read from
        `docker logs --tail` of the container changes. Exit 0 ready, 1 container gone or an
        engine-fatal line seen (ERROR_RE; a traceback alone is not fatal), 2 timeout.
    sparkhost gate probe [--url URL] [--model NAME] [--api-key-file FILE]
        The watchdog probe: the math gate alone (a real completion; /health lies, §8.2).

    sparkhost gate stage < LOG
        Print the latest recognised boot stage of a log read from stdin.

--api-key-file: the API key (the file holds the key alone, 0600 root), sent as
`Authorization: Bearer <key>` on every request; read from the file, never from argv.
--ca-file FILE: an https --url's certificate is checked against this CA (the pair's own);
--tls-unverified: https on loopback with the operator's certificate, not checked.

The same parsers back sparkrig/gates.py on the control side.
"""

from __future__ import annotations

import argparse
import json
import re
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from sparkhost import tokenfile, wedge
from sparkhost.pair import RESTART_LOCK, RestartLock

LOCAL_HEADER = "X-Sparkrig-Local"  # sparkrig/endpoint.py: served by this pair, never balanced
PINNED = "gate"  # its value for the gates: a draining pair still answers them

DEFAULT_URL = "http://127.0.0.1:8000"
DEFAULT_MODEL = "glm-5.3-flash"
GATES = ("health", "models", "math", "tool", "locked")
# Routes outside vLLM's guarded prefixes (/v1 /v2 /inference /cohere) that a request without the
# key must not reach: /invocations is full inference (docs/attack-surface-facts.md 1.1)
LOCKED_ROUTES = ("/invocations", "/tokenize")
# The front's answer to a path spelled with '..' or an encoded '.', '/' or NUL (400, before any
# location: templates/sparkrig-api.conf.j2), and the spellings the locked gate tries without
# the key: each reaches a keyed route through /health's location, or a keyed route another way
REFUSED_PATH = "refused path: '..' or an encoded '.', '/' or NUL"
LOCKED_SPELLINGS = (
    "/metrics/../health", "/metrics%2F..%2Fhealth", "/metrics/./../health", "/v1/../metrics",
    "/%2e%2e/metrics", "/health%2F..%2Fmetrics", "/metrics%00",
)  # fmt: skip
MATH_PROMPT = "What is 17*23? Reply with the number only."
MATH_ANSWER = "391"
TOOL_NAME = "get_weather"


@dataclass
class GateResult:
    gate: str
    ok: bool
    detail: str
    ms: int = 0

    def to_json(self) -> str:
        return json.dumps(asdict(self), ensure_ascii=False)


# --- boot stages ----------------------------------------------------------------------------------
# (stage, pattern) in boot order; the stage of a log is the one of its last matching line.
BOOT_STAGES: tuple[tuple[str, str], ...] = (
    ("starting", r"vLLM API server version|Initializing a V1 LLM engine|non-default args"),
    ("rendezvous", r"world_size=|TCP store|init_distributed_environment|connecting to the TCP"),
    ("loading", r"Starting to load model|Loading safetensors|Loading weights(?! took)"),
    ("loaded", r"Loading weights took|Model loading took"),
    ("profiling", r"GPU KV cache size|Available KV cache memory|Maximum concurrency"),
    ("compiling", r"torch\.compile|Compiling a graph|shared memory broadcast block"),
    ("graphs", r"Capturing CUDA graph|Graph capturing finished|cudagraph"),
    ("api", r"Starting vLLM API server|Available routes"),
    ("ready", r"Application startup complete"),
)
STAGE_ORDER = tuple(s for s, _ in BOOT_STAGES)
_STAGE_RE = [(s, re.compile(p)) for s, p in BOOT_STAGES]
# Lines that mean the engine is dead, as vLLM 0.33 writes them (v1/engine/core.py,
# v1/executor/multiproc_executor.py, v1/engine/exceptions.py) plus the stand-in's "peer lost".
# Not a bare Traceback or RuntimeError: real vLLM/FlashInfer boots log non-fatal tracebacks
# (autotuning, optional kernels), and an engine that really dies also logs one of these, or exits.
ERROR_RE = re.compile(
    r"EngineDeadError|Engine core initialization failed|EngineCore failed to start|"
    r"EngineCore encountered a fatal error|WorkerProc failed to start|peer lost"
)
BENIGN_RE = re.compile(r"No available shared memory broadcast block|RoCE all-reduce OFF")


def line_stage(line: str) -> str | None:
    for stage, rx in reversed(_STAGE_RE):
        if rx.search(line):
            return stage
    return None


def boot_stage(lines: Iterable[str]) -> str | None:
    """The stage named by the last recognised line, or None when nothing matched."""
    latest = None
    for line in lines:
        s = line_stage(line)
        if s is not None:
            latest = s
    return latest


def boot_errors(lines: Iterable[str]) -> list[str]:
    """Lines that mean the boot failed (benign ones excluded: docs/sources.md, "Health gates")."""
    return [ln.rstrip("\n") for ln in lines if ERROR_RE.search(ln) and not BENIGN_RE.search(ln)]


# --- payloads -------------------------------------------------------------------------------------
def math_payload(model: str) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": MATH_PROMPT}],
        "max_tokens": 16,
        "temperature": 0,
        "chat_template_kwargs": {"enable_thinking": False},
    }


def tool_payload(model: str) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": "What is the weather in Tokyo right now?"}],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": TOOL_NAME,
                    "description": "Current weather for a city",
                    "parameters": {
                        "type": "object",
                        "properties": {"city": {"type": "string"}},
                        "required": ["city"],
                    },
                },
            }
        ],
        "tool_choice": "required",
        "max_tokens": 256,
        "temperature": 0,
        "chat_template_kwargs": {"enable_thinking": False},
    }


# --- parsers (status code + body text -> GateResult) ---------------------------------------------
def _json(body: str) -> Any:
    try:
        return json.loads(body)
    except ValueError:
        return None


def _short(body: str, n: int = 200) -> str:
    return body.strip().replace("\n", " ")[:n]


def parse_health(status: int, body: str) -> GateResult:
    if status == 200:
        return GateResult("health", True, "/health 200")
    return GateResult("health", False, f"/health {status or 'unreachable'} {_short(body)}".strip())


def parse_models(status: int, body: str, model: str) -> GateResult:
    if status != 200:
        return GateResult("models", False, f"/v1/models {status or 'unreachable'} {_short(body)}")
    data = _json(body)
    ids = [m.get("id") for m in (data or {}).get("data", []) if isinstance(m, dict)]
    if model in ids:
        return GateResult("models", True, f"/v1/models lists {model}")
    return GateResult("models", False, f"/v1/models lists {ids}, not {model}")


def _message(status: int, body: str) -> tuple[dict[str, Any] | None, str]:
    if status != 200:
        return None, f"HTTP {status or 'unreachable'} {_short(body)}"
    data = _json(body)
    try:
        msg = data["choices"][0]["message"]
    except (TypeError, KeyError, IndexError):
        return None, f"no choices[0].message in {_short(body)}"
    if not isinstance(msg, dict):
        return None, "choices[0].message is not an object"
    return msg, ""


def parse_math(status: int, body: str) -> GateResult:
    msg, err = _message(status, body)
    if msg is None:
        return GateResult("math", False, err)
    content = msg.get("content") or ""
    if MATH_ANSWER in content:
        return GateResult("math", True, f"17*23 -> {_short(content, 40)!r}")
    return GateResult("math", False, f"17*23 answer lacks 391: {_short(content, 80)!r}")


def parse_tool(status: int, body: str, name: str = TOOL_NAME) -> GateResult:
    msg, err = _message(status, body)
    if msg is None:
        return GateResult("tool", False, err)
    calls = msg.get("tool_calls") or []
    if not calls:
        return GateResult(
            "tool", False, f"no tool_calls; content {_short(msg.get('content') or '')!r}"
        )
    fn = (calls[0] or {}).get("function") or {}
    raw = fn.get("arguments")
    args = _json(raw) if isinstance(raw, str) else None
    if not isinstance(args, dict):
        return GateResult("tool", False, f"tool_calls[0].function.arguments not JSON: {raw!r}")
    if fn.get("name") != name:
        return GateResult("tool", False, f"called {fn.get('name')!r}, not {name!r}")
    return GateResult("tool", True, f"{name}({json.dumps(args, ensure_ascii=False)})")


def refused(route: str, status: int, body: str) -> bool:
    """The front refused ``route`` without the key: 401, or a 400 of the front's for a path
    spelled with '..' or an encoded '.', '/' or NUL: sparkrig's (REFUSED_PATH), or nginx's own
    page for a path it cannot normalise (``/%2e%2e/metrics`` climbs above the root). A 400 of
    the engine's own is an answer."""
    if status == 401:
        return True
    by_nginx = "<center>nginx</center>" in body and "400 Bad Request" in body
    return route in LOCKED_SPELLINGS and status == 400 and (REFUSED_PATH in body or by_nginx)


def parse_locked(answers: Sequence[tuple[str, int, str]]) -> GateResult:
    """The locked gate from (route, status, body) of requests sent without the key: every route
    must be refused by the front; anything else means the engine is reachable bare."""
    open_routes = [f"{route} {status or 'unreachable'}" for route, status, body in answers
                   if not refused(route, status, body)]  # fmt: skip
    if open_routes:
        return GateResult("locked", False, "without the key: " + ", ".join(open_routes))
    return GateResult("locked", True, " ".join(r for r, _, _ in answers) + " 401 without the key")


# --- HTTP -----------------------------------------------------------------------------------------
def http(
    url: str,
    payload: dict[str, Any] | None = None,
    timeout: float = 60.0,
    api_key: str = "",
    context: ssl.SSLContext | None = None,
) -> tuple[int, str]:
    """(status, body); status 0 when the server could not be reached. ``api_key``: sent as
    ``Authorization: Bearer`` (vLLM checks it on /v1/*, not on /health); ``context``: how an
    https URL's certificate is checked (``tls_context``)."""
    data = None if payload is None else json.dumps(payload).encode()
    req = urllib.request.Request(url, data=data, method="GET" if data is None else "POST")
    if data is not None:
        req.add_header("Content-Type", "application/json")
    # served by this head's own pair, never balanced to another (sparkrig/endpoint.py)
    req.add_header(LOCAL_HEADER, PINNED)
    if api_key:
        req.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=context) as resp:
            return resp.status, resp.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode("utf-8", "replace")
    except (OSError, ValueError) as exc:
        return 0, str(exc)


Fetch = Callable[[str, "dict[str, Any] | None", float], "tuple[int, str]"]


def read_api_key(path: str) -> str:
    """The key from its file (the key alone, surrounding whitespace ignored); an empty file is
    an error, not an unauthenticated request."""
    return tokenfile.read_secret(path, required=True) or ""


def authed_http(api_key: str, context: ssl.SSLContext | None = None) -> Fetch:
    """``http`` sending ``api_key`` (none when "") on every request, over ``context``."""

    def fetch(url: str, payload: dict[str, Any] | None, timeout: float) -> tuple[int, str]:
        return http(url, payload, timeout, api_key, context)

    return fetch


def tls_context(ca_file: str | None, unverified: bool = False) -> ssl.SSLContext | None:
    """The front's certificate checked against the pair's CA (``ca_file``), host name included
    (the head's certificate names 127.0.0.1); ``unverified``: the operator's certificate, issued
    for the names clients dial, not loopback (the connection never leaves the host). None: the
    system's trust."""
    if ca_file:
        return ssl.create_default_context(cafile=ca_file)
    if unverified:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        return context
    return None


def run_gate(
    gate: str,
    url: str,
    model: str,
    fetch: Fetch = http,
    timeout: float = 120.0,
    keyed: bool = True,
    bare: Fetch = http,
) -> GateResult:
    """One gate. ``keyed``: the API has a key (the locked gate then asks, without it, that the
    routes vLLM leaves open answer 401; an open API passes it); ``bare``: ``fetch`` without the
    key (the locked gate's)."""
    t0 = time.monotonic()
    base = url.rstrip("/")
    if gate == "health":
        res = parse_health(*fetch(base + "/health", None, 10.0))
    elif gate == "models":
        res = parse_models(*fetch(base + "/v1/models", None, 10.0), model)
    elif gate == "math":
        res = parse_math(*fetch(base + "/v1/chat/completions", math_payload(model), timeout))
    elif gate == "tool":
        res = parse_tool(*fetch(base + "/v1/chat/completions", tool_payload(model), timeout))
    elif gate == "locked" and not keyed:
        res = GateResult("locked", True, "api_auth off: the API is open, no key to check")
    elif gate == "locked":  # bare: never the key, whatever fetch sends
        res = parse_locked([(route, *bare(base + route, math_payload(model), 10.0))
                            for route in LOCKED_ROUTES]
                           + [(route, *bare(base + route, None, 10.0))
                              for route in LOCKED_SPELLINGS])  # fmt: skip
    else:
        raise ValueError(f"unknown gate {gate!r}")
    res.ms = int((time.monotonic() - t0) * 1000)
    return res


def run_gates(
    url: str,
    model: str,
    gates: Sequence[str] = GATES,
    fetch: Fetch = http,
    timeout: float = 120.0,
    keyed: bool = True,
    bare: Fetch = http,
) -> list[GateResult]:
    """Run the gates in order; after a failed /health the others are not attempted."""
    out: list[GateResult] = []
    for g in gates:
        if out and out[0].gate == "health" and not out[0].ok:
            out.append(GateResult(g, False, "skipped: /health failed"))
            continue
        out.append(run_gate(g, url, model, fetch, timeout, keyed, bare))
    return out


# --- wait -----------------------------------------------------------------------------------------
def docker_log_tail(container: str, lines: int = 400) -> tuple[bool, list[str]]:
    """(running, last log lines) of a container; (False, []) when it does not exist."""
    state = subprocess.run(
        ["docker", "inspect", "-f", "{{.State.Running}}", container],
        capture_output=True,
        text=True,
    )
    if state.returncode != 0:
        return False, []
    logs = subprocess.run(
        ["docker", "logs", "--tail", str(lines), container],
        capture_output=True,
        text=True,
        errors="replace",
    )
    return state.stdout.strip() == "true", (logs.stdout + logs.stderr).splitlines()


def wait_ready(
    url: str,
    container: str | None,
    timeout: float,
    interval: float,
    fetch: Fetch = http,
    tail: Callable[[str], tuple[bool, list[str]]] = docker_log_tail,
    emit: Callable[[str], None] = print,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    start_grace: float = 300.0,
) -> int:
    """Poll /health until 200. The container may take a while to appear after its unit started
    (``docker run`` creates it); it fails the wait once it stopped after running, or when it has
    not appeared within ``start_grace`` seconds."""
    start = clock()
    last = None
    seen_running = False
    while True:
        elapsed = clock() - start
        stage = None
        if container:
            running, lines = tail(container)
            seen_running = seen_running or running
            stage = boot_stage(lines)
            errors = boot_errors(lines)
            gone = not running and (seen_running or elapsed >= start_grace)
            if gone or errors:
                why = "container not running" if gone else errors[-1][:300]
                emit(json.dumps({"event": "failed", "stage": stage, "s": int(elapsed),
                                 "detail": why}))  # fmt: skip
                return 1
        status, _ = fetch(url.rstrip("/") + "/health", None, 5.0)
        if status == 200:
            emit(json.dumps({"event": "ready", "stage": stage or "ready", "s": int(elapsed)}))
            return 0
        if stage != last:
            emit(json.dumps({"event": "stage", "stage": stage, "s": int(elapsed)}))
            last = stage
        if elapsed >= timeout:
            emit(json.dumps({"event": "timeout", "stage": stage, "s": int(elapsed)}))
            return 2
        sleep(interval)


# --- drain ----------------------------------------------------------------------------------------
def drain(
    url: str,
    parser: str,
    timeout: float,
    interval: float = 2.0,
    read: Callable[[str, str], wedge.Sample] | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    emit: Callable[[str], None] = print,
) -> int:
    """Wait until the engine has no request in flight (running and waiting both 0 on its progress
    page ``url``) or ``timeout`` seconds passed; says which. Always 0: a bound reached lets the
    restart go on (the requests still in flight are the bound's price, said in the log), and an
    engine that does not answer has nothing in flight to wait for."""
    get = read or (lambda u, p: wedge.read_metrics(u, timeout=5.0, parser=p))
    start = clock()
    while True:
        try:
            sample = get(url, parser)
        except (OSError, ValueError) as err:
            emit(f"drained: the engine does not answer ({err}): nothing in flight to wait for")
            return 0
        waited = clock() - start
        left = sample.running + sample.waiting
        if left == 0:
            emit(f"drained: no request in flight after {waited:.0f} s")
            return 0
        if waited >= timeout:
            emit(f"drain bound reached: {left:g} request(s) still in flight after {timeout:g} s")
            return 0
        sleep(interval)


# --- CLI ------------------------------------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="sparkhost gate", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("gates", "wait", "probe"):
        p = sub.add_parser(name)
        p.add_argument("--url", default=DEFAULT_URL)
        # an https --url: the pair's CA to verify the front with, or the operator's certificate
        p.add_argument("--ca-file", help="PEM CA the front's certificate is checked against")
        p.add_argument("--tls-unverified", action="store_true", help="https on loopback, unchecked")
        p.add_argument("--model", default=DEFAULT_MODEL)
        p.add_argument("--timeout", type=float, default=120.0 if name != "wait" else 3600.0)
        if name == "gates":
            p.add_argument("--only", default=",".join(GATES))
            # the ordered-restart lock the gates hold (a restart in flight is waited for)
            p.add_argument("--restart-lock", default=RESTART_LOCK)
            p.add_argument("--restart-wait", type=float, default=900.0)
        if name != "wait":  # /health, all `wait` asks for, is not behind the key in vLLM
            p.add_argument("--api-key-file", help="file holding the API key (Bearer)")
        if name == "wait":
            p.add_argument("--container")
            p.add_argument("--interval", type=float, default=10.0)
    sub.add_parser("stage")
    p = sub.add_parser("drain")  # before a restart, behind one endpoint: wait for the in-flight
    p.add_argument("--metrics", required=True, help="the engine's progress page on loopback")
    p.add_argument("--parser", default="vllm-metrics", choices=sorted(wedge.PARSERS))
    p.add_argument("--timeout", type=float, default=120.0)
    a = ap.parse_args(argv)
    if a.cmd == "drain":
        return drain(a.metrics, a.parser, a.timeout)
    if a.cmd == "stage":
        lines = sys.stdin.read().splitlines()
        print(json.dumps({"stage": boot_stage(lines), "errors": boot_errors(lines)[-5:]}))
        return 0
    try:
        context = tls_context(a.ca_file, a.tls_unverified)
    except (OSError, ssl.SSLError) as err:
        ap.error(f"cannot read the CA file {a.ca_file}: {err}")
    bare = authed_http("", context)
    if a.cmd == "wait":
        return wait_ready(a.url, a.container, a.timeout, a.interval, fetch=bare)
    gates = ("math",) if a.cmd == "probe" else tuple(g for g in a.only.split(",") if g)
    unknown = set(gates) - set(GATES)
    if unknown:
        ap.error(f"unknown gate(s): {', '.join(sorted(unknown))}")
    fetch: Fetch = bare
    if a.api_key_file:
        try:
            fetch = authed_http(read_api_key(a.api_key_file), context)
        except (OSError, ValueError) as err:
            ap.error(f"cannot read the API key: {err}")
    keyed = bool(a.api_key_file)

    def gated() -> int:
        results = run_gates(
            a.url, a.model, gates, fetch=fetch, timeout=a.timeout, keyed=keyed, bare=bare
        )
        for r in results:
            print(r.to_json(), flush=True)
        return 0 if all(r.ok for r in results) else 1

    if a.cmd == "probe":  # the watchdog's own: it holds no lock its restarts take
        return gated()
    ready = lambda: wait_ready(a.url, None, a.restart_wait, 5.0, bare, emit=lambda line: None)  # noqa: E731
    return held_against_restarts(gated, ready, a.restart_lock, a.restart_wait)


def held_against_restarts(
    gated: Callable[[], int], ready: Callable[[], int], lock_path: str, wait_s: float
) -> int:
    """``gated()`` while holding the pair's ordered-restart lock (files/sparkhost/pair.py), so
    neither the watchdog nor the supervisor restarts the pair under the gates; a restart in
    flight is waited for (up to ``wait_s``), then the boot it started (``ready``). Without the
    lock (another user's run dir) the gates run as they are."""
    lock = RestartLock(lock_path)
    try:
        free = lock.acquire()
        if not free and lock.acquire(timeout=wait_s):
            ready()
    except OSError:
        return gated()
    try:
        return gated()
    finally:
        lock.release()
