"""Gate parsers, boot-stage reader, command builders and the wait loop (pure)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from serving_helpers import local_argv
from sparkhost import gate as script

from sparkrig import gates, hostpkg


def chat(message: dict[str, Any]) -> str:
    return json.dumps({"choices": [{"index": 0, "message": message, "finish_reason": "stop"}]})


def test_health() -> None:
    assert gates.parse_health(200, "").ok
    r = gates.parse_health(0, "Connection refused")
    assert not r.ok and "unreachable" in r.detail
    assert not gates.parse_health(503, "").ok


def test_models() -> None:
    body = json.dumps({"object": "list", "data": [{"id": "glm-5.3-flash"}]})
    assert gates.parse_models(200, body, "glm-5.3-flash").ok
    r = gates.parse_models(200, body, "other")
    assert not r.ok and "glm-5.3-flash" in r.detail
    assert not gates.parse_models(200, "not json", "x").ok
    assert not gates.parse_models(500, "", "x").ok


@pytest.mark.parametrize(
    ("msg", "ok"),
    [
        ({"role": "assistant", "content": "391"}, True),
        ({"role": "assistant", "content": "17*23 = 391."}, True),
        ({"role": "assistant", "content": "381"}, False),
        ({"role": "assistant", "content": None, "reasoning_content": "391"}, False),
        ({"role": "assistant", "content": ""}, False),
    ],
)
def test_math(msg: dict[str, Any], ok: bool) -> None:
    assert gates.parse_math(200, chat(msg)).ok is ok


def test_math_errors() -> None:
    assert "HTTP 500" in gates.parse_math(500, '{"error": "dead"}').detail
    assert not gates.parse_math(200, '{"choices": []}').ok
    assert not gates.parse_math(200, '{"choices": [{"message": "x"}]}').ok


def tool_msg(args: Any, name: str = "get_weather") -> str:
    fn = {"name": name, "arguments": args}
    return chat({"role": "assistant", "content": None,
                 "tool_calls": [{"id": "1", "type": "function", "function": fn}]})  # fmt: skip


def test_tool() -> None:
    r = gates.parse_tool(200, tool_msg('{"city": "Tokyo"}'))
    assert r.ok and "Tokyo" in r.detail
    assert not gates.parse_tool(200, tool_msg("{city: Tokyo")).ok  # not JSON
    assert not gates.parse_tool(200, tool_msg('"just a string"')).ok  # JSON, not an object
    assert not gates.parse_tool(200, tool_msg({"city": "x"})).ok  # not a string
    assert not gates.parse_tool(200, tool_msg("{}", name="other")).ok
    r = gates.parse_tool(200, chat({"role": "assistant", "content": "<tool_call>get_weather"}))
    assert not r.ok and "no tool_calls" in r.detail  # what the `glm` parser does (§2.1)


def test_payloads() -> None:
    m = gates.math_payload("glm")
    assert m["model"] == "glm" and "17*23" in m["messages"][0]["content"]
    t = gates.tool_payload("glm")
    assert t["tool_choice"] == "required" and t["tools"][0]["function"]["name"] == "get_weather"


VLLM_LOG = """\
INFO 11-29 10:00:00 [api_server.py:1] vLLM API server version 0.11.1
INFO 11-29 10:00:01 [core.py:1] Initializing a V1 LLM engine (v0.11.1) with config: model=...
INFO 11-29 10:00:05 [parallel_state.py:1] world_size=2 rank=0 local_rank=0 backend=nccl
INFO 11-29 10:00:06 [gpu_model_runner.py:1] Starting to load model /models/glm...
INFO 11-29 10:06:06 [default_loader.py:1] Loading weights took 360.12 seconds
INFO 11-29 10:06:30 [gpu_worker.py:1] Available KV cache memory: 9.00 GiB
INFO 11-29 10:06:30 [kv_cache_utils.py:1] GPU KV cache size: 1,103,764 tokens
INFO 11-29 10:07:00 [shm.py:1] No available shared memory broadcast block found in 60 seconds
INFO 11-29 10:15:00 [gpu_model_runner.py:1] Graph capturing finished in 12 secs
INFO 11-29 10:15:10 [api_server.py:1] Starting vLLM API server 0 on http://0.0.0.0:8000
INFO:     Application startup complete.
"""


def test_boot_stage_progression() -> None:
    lines = VLLM_LOG.splitlines()
    seen = [gates.boot_stage(lines[: i + 1]) for i in range(len(lines))]
    assert seen == ["starting", "starting", "rendezvous", "loading", "loaded", "profiling",
                    "profiling", "compiling", "graphs", "api", "ready"]  # fmt: skip
    idx = [gates.stage_index(s) for s in seen]
    assert idx == sorted(idx)
    assert gates.boot_stage([]) is None and gates.stage_index(None) == -1
    assert gates.boot_errors(lines) == []  # the shm broadcast line is benign (§8.3)


def test_boot_errors_are_engine_fatal_lines_not_tracebacks() -> None:
    benign = [
        "INFO Loading weights took 3 s",
        "Traceback (most recent call last):",  # e.g. FlashInfer autotune trying a config
        '  File "/usr/lib/python3/dist-packages/flashinfer/autotuner.py", line 1, in tune',
        "RuntimeError: CUDA error: too many resources requested for launch",
        "ERROR 11-30 05:00:00 [autotuner.py] tactic 3 failed, skipping",
        "INFO RoCE all-reduce OFF (NCCL)",
    ]
    assert gates.boot_errors(benign) == []
    fatal = [  # vLLM 0.33's own wording
        "ERROR 11-30 05:01:00 [core.py:1584] EngineCore failed to start.",
        "RuntimeError: Engine core initialization failed. See root cause above.",
        "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.",
        "ERROR 11-30 05:01:00 [multiproc_executor.py:1057] WorkerProc failed to start.",
    ]
    for line in fatal:
        assert gates.boot_errors([*benign, line]) == [line]


def test_commands_are_argv_and_shell() -> None:
    argv = gates.gate_command("/opt/sparkrig", 8000, "glm-5.3-flash")
    assert argv[:4] == ["/usr/bin/python3", "/opt/sparkrig/lib/sparkhost", "gate", "gates"]
    assert "http://127.0.0.1:8000" in argv and "health,models,math,tool,locked" in argv
    assert gates.shell(["a b", "c"]) == "'a b' c"
    with pytest.raises(ValueError):
        gates.gate_command("/opt/sparkrig", 8000, "m", gates=["nope"])
    w = gates.wait_command("/opt/sparkrig/", 8000, "vllm_head", 3600, 15)
    assert w[1:4] == ["/opt/sparkrig/lib/sparkhost", "gate", "wait"]
    assert w[-2:] == ["--container", "vllm_head"]
    assert "probe" in gates.probe_command("/opt/sparkrig", 8000, "m")


def test_the_heads_gates_speak_https_to_the_front_with_the_pairs_ca() -> None:
    ca = gates.LoopbackTls("/etc/sparkrig/api-ca.crt")
    argv = gates.gate_command("/opt/sparkrig", 8000, "m", tls=ca)
    at = argv.index("--url")
    assert argv[at : at + 4] == [
        "--url", "https://127.0.0.1:8000", "--ca-file", "/etc/sparkrig/api-ca.crt",
    ]  # fmt: skip
    wait = gates.wait_command("/opt/sparkrig", 8000, "c", tls=gates.LoopbackTls())
    assert "https://127.0.0.1:8000" in wait and "--tls-unverified" in wait
    # what the host package makes of them (argparse: an unknown flag would exit 2)
    from sparkhost import gate

    assert gate.tls_context("", unverified=True).verify_mode.name == "CERT_NONE"
    assert gate.tls_context(None) is None  # plain: the system's trust


def test_parse_gate_lines() -> None:
    out = '{"gate": "health", "ok": true, "detail": "/health 200", "ms": 3}\ngarbage\n\n'
    res = gates.parse_gate_lines(out)
    assert res[0].gate == "health" and res[0].ok and res[0].ms == 3
    assert res[1].gate == "output" and not res[1].ok
    assert not gates.gates_passed(res)
    assert gates.gates_passed(res, required=["health"])


def test_curl_output() -> None:
    mark = gates.CURL_STATUS_MARK
    assert gates.parse_curl_output('{"a": 1}' + mark + "200") == (200, '{"a": 1}')
    assert gates.parse_curl_output(mark + "000") == (0, "")
    assert gates.parse_curl_output("curl: (7) refused") == (0, "curl: (7) refused")
    cmd = gates.curl_command("http://x/v1", {"a": 1}, 5)
    assert cmd[0] == "curl" and cmd[-1] == "http://x/v1" and '{"a": 1}' in cmd
    assert gates.parse_curl_gate("health", mark + "200", "m").ok
    with pytest.raises(ValueError):
        gates.parse_curl_gate("nope", "", "m")


def test_parse_wait_lines() -> None:
    out = '{"event": "stage", "stage": "loading", "s": 5}\nnoise\n{"event": "ready", "s": 9}\n'
    assert [e["event"] for e in gates.parse_wait_lines(out)] == ["stage", "ready"]


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s


def test_wait_ready_reports_stages_then_ready() -> None:
    log = VLLM_LOG.splitlines()
    clock = FakeClock()
    seen: list[str] = []
    calls = {"n": 0}

    def tail(_: str) -> tuple[bool, list[str]]:
        calls["n"] += 1
        return True, log[: min(len(log), calls["n"] * 2)]

    def fetch(url: str, payload: Any, timeout: float) -> tuple[int, str]:
        return (200, "") if calls["n"] >= 6 else (0, "refused")

    rc = script.wait_ready(
        "http://h", "c", 100, 1, fetch, tail, seen.append, clock.now, clock.sleep
    )
    events = [json.loads(s) for s in seen]
    assert rc == 0 and events[-1]["event"] == "ready"
    stages = [e["stage"] for e in events if e["event"] == "stage"]
    assert len(stages) >= 4 and len(set(stages)) == len(stages)  # one line per stage change
    idx = [gates.stage_index(st) for st in stages]
    assert idx == sorted(idx) and stages[0] == "starting"


def test_wait_ready_container_gone_and_timeout() -> None:
    clock = FakeClock()
    seen: list[str] = []

    def refused(url: str, payload: Any, timeout: float) -> tuple[int, str]:
        return 0, "refused"

    # a container that never appears fails once the start grace is over, not before
    rc = script.wait_ready("http://h", "c", 10, 1, refused, lambda c: (False, []), seen.append,
                           clock.now, clock.sleep, start_grace=5)  # fmt: skip
    assert rc == 1 and json.loads(seen[-1]) == {
        "event": "failed",
        "stage": None,
        "s": 5,
        "detail": "container not running",
    }
    seen.clear()
    # a container that ran and stopped fails at once
    states = iter([(True, []), (False, [])])
    rc = script.wait_ready("http://h", "c", 10, 1, refused, lambda c: next(states), seen.append,
                           clock.now, clock.sleep)  # fmt: skip
    assert rc == 1 and json.loads(seen[-1])["detail"] == "container not running"
    seen.clear()
    bad = ["Loading weights took 1 s", "RuntimeError: pe_dim must be 64 for fp8_ds_mla",
           "RuntimeError: Engine core initialization failed. See root cause above."]  # fmt: skip
    rc = script.wait_ready("http://h", "c", 10, 1, refused, lambda c: (True, bad), seen.append,
                           clock.now, clock.sleep)  # fmt: skip
    assert rc == 1 and "Engine core initialization failed" in json.loads(seen[-1])["detail"]
    seen.clear()  # a traceback alone, container running: keep waiting (here: until timeout)
    rc = script.wait_ready("http://h", "c", 10, 1, refused, lambda c: (True, bad[:2]),
                           seen.append, clock.now, clock.sleep)  # fmt: skip
    assert rc == 2 and json.loads(seen[-1])["event"] == "timeout"
    seen.clear()
    rc = script.wait_ready("http://h", "c", 10, 1, refused, lambda c: (True, []), seen.append,
                           clock.now, clock.sleep)  # fmt: skip
    assert rc == 2 and json.loads(seen[-1])["event"] == "timeout"


def test_run_gates_skips_after_failed_health() -> None:
    def fetch(url: str, payload: Any, timeout: float) -> tuple[int, str]:
        return 0, "refused"

    res = script.run_gates("http://h", "m", fetch=fetch)
    assert [r.ok for r in res] == [False] * 5 and "skipped" in res[1].detail


def test_locked_passes_only_when_every_open_route_answers_401() -> None:
    ok = gates.parse_locked([("/invocations", 401, ""), ("/tokenize", 401, "")])
    assert ok.ok and ok.gate == "locked" and "/invocations /tokenize 401" in ok.detail
    bare = gates.parse_locked([("/invocations", 200, "{}"), ("/tokenize", 401, "")])
    assert not bare.ok and "/invocations 200" in bare.detail and "/tokenize" not in bare.detail
    down = gates.parse_locked([("/invocations", 0, "refused"), ("/tokenize", 0, "refused")])
    assert not down.ok and "/invocations unreachable" in down.detail
    assert not gates.parse_locked([("/invocations", 403, "")]).ok  # only the front's 401


def test_locked_fails_when_a_spelling_around_a_keyed_route_answers_without_the_key() -> None:
    closed = [("/invocations", 401, ""), ("/tokenize", 401, "")]
    refusal = json.dumps({"error": script.REFUSED_PATH})
    spelled = [(route, 400, refusal) for route in script.LOCKED_SPELLINGS]
    assert gates.parse_locked(closed + spelled).ok
    metrics = "# HELP vllm:num_requests_running ..."
    bare = gates.parse_locked([*closed, ("/metrics/../health", 200, metrics), *spelled[1:]])
    assert not bare.ok and "/metrics/../health 200" in bare.detail
    # a 400 of the engine's own (not the front's refusal) is an answer, not a refusal
    engine_400 = [(route, 400, '{"detail": "bad"}') for route in script.LOCKED_SPELLINGS]
    assert not gates.parse_locked(closed + engine_400).ok


def test_cli_stage(tmp_path: Any) -> None:
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, str(hostpkg.SOURCE), "gate", "stage"],
        input=VLLM_LOG, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert json.loads(out.stdout)["stage"] == "ready"


# --- the API key: read from its file, sent as a Bearer header -------------------------------------
class Recorder:
    """A loopback HTTP server on a free port answering like a healthy vLLM and recording each
    request's path and Authorization header."""

    def __init__(self) -> None:
        import http.server
        import threading

        seen = self.seen = []  # type: list[tuple[str, str | None]]

        front = self.front = [True]  # answer 401 on the locked routes without a key (the front)

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                seen.append((self.path, self.headers.get("Authorization")))
                code = 200
                if self.path in script.LOCKED_ROUTES and front[0]:
                    code = 200 if self.headers.get("Authorization") else 401
                if self.path in script.LOCKED_SPELLINGS and front[0]:
                    code = 400  # the front's refusal of a path spelled around a route
                if self.path == "/v1/models":
                    out = json.dumps({"data": [{"id": "m"}]})
                elif self.path == "/v1/chat/completions" and body.get("tools"):
                    out = tool_msg('{"city": "Tokyo"}')
                elif self.path == "/v1/chat/completions":
                    out = chat({"role": "assistant", "content": "391"})
                elif code == 400:
                    out = json.dumps({"error": script.REFUSED_PATH})
                else:
                    out = ""
                data = out.encode()
                self.send_response(code)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = _answer  # noqa: N815

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = int(self.server.server_address[1])
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def recorder() -> Any:
    r = Recorder()
    yield r
    r.close()


def run_cli(argv: list[str]) -> Any:
    import subprocess

    return subprocess.run(local_argv(argv), capture_output=True, text=True)


def test_the_gates_and_the_watchdog_probe_send_the_key_read_from_its_file(
    recorder: Recorder, tmp_path: Any
) -> None:
    key = "s3cret-" + "f" * 40
    key_file = tmp_path / "api-key"
    key_file.write_text(f"{key}\n")
    argv = gates.gate_command("/opt/sparkrig", recorder.port, "m", key_file=str(key_file))
    assert argv[-2:] == ["--api-key-file", str(key_file)] and key not in " ".join(argv)
    out = run_cli(argv)
    assert out.returncode == 0, out.stdout + out.stderr
    assert [p for p, _ in recorder.seen] == ["/health", "/v1/models", "/v1/chat/completions",
                                            "/v1/chat/completions", "/invocations",
                                            "/tokenize", *script.LOCKED_SPELLINGS]  # fmt: skip
    assert {h for p, h in recorder.seen[:4]} == {f"Bearer {key}"}
    assert {h for p, h in recorder.seen[4:]} == {None}  # the locked gate never sends the key
    recorder.seen.clear()
    # an engine answering without the key (no front before it) fails the locked gate
    recorder.front[0] = False
    out = run_cli(argv)
    assert out.returncode == 1
    locked = {r.gate: r for r in gates.parse_gate_lines(out.stdout)}["locked"]
    assert not locked.ok and "/invocations 200, /tokenize 200" in locked.detail
    recorder.front[0] = True
    # an open API (api_auth off, no key file) passes it without asking
    recorder.seen.clear()
    out = run_cli(gates.gate_command("/opt/sparkrig", recorder.port, "m"))
    assert out.returncode == 0 and "/invocations" not in [p for p, _ in recorder.seen]
    recorder.seen.clear()
    # the watchdog's probe, as its unit runs it (the pair job runs --probe through a shell)
    probe = gates.probe_command("/opt/sparkrig", recorder.port, "m", key_file=str(key_file))
    assert run_cli(probe).returncode == 0
    assert recorder.seen == [("/v1/chat/completions", f"Bearer {key}")]
    recorder.seen.clear()
    # without a key file nothing is sent (api_auth = False)
    assert run_cli(gates.probe_command("/opt/sparkrig", recorder.port, "m")).returncode == 0
    assert recorder.seen == [("/v1/chat/completions", None)]


@pytest.mark.parametrize("content", [None, "", "\n"])
def test_an_unreadable_or_empty_key_file_fails_before_any_request(
    recorder: Recorder, tmp_path: Any, content: str | None
) -> None:
    key_file = tmp_path / "api-key"
    if content is not None:
        key_file.write_text(content)
    out = run_cli(gates.gate_command("/x", recorder.port, "m", key_file=str(key_file)))
    assert out.returncode == 2 and "cannot read the API key" in out.stderr
    assert recorder.seen == []


def test_the_gates_wait_for_a_restart_in_flight_then_its_boot_and_hold_the_lock(tmp_path):
    """Issue 47: a run never races a restart it did not order: the gates wait while the
    watchdog or the supervisor holds the ordered-restart lock, then for the boot it started,
    and hold the lock themselves, so neither restarts the pair under them."""
    import threading

    from sparkhost import gate as gate_script
    from sparkhost.pair import RestartLock

    path = str(tmp_path / "restart.lock")
    theirs = RestartLock(path)
    assert theirs.acquire()
    seen: list[str] = []
    threading.Timer(1.0, lambda: (seen.append("their restart done"), theirs.release())).start()

    def gated() -> int:
        seen.append("gates")
        assert not RestartLock(path).acquire(), "the gates run without the lock"
        return 0

    rc = gate_script.held_against_restarts(gated, lambda: seen.append("ready") or 0, path, 30)
    assert rc == 0
    assert seen == ["their restart done", "ready", "gates"]
    assert RestartLock(path).acquire()  # released after
    seen.clear()
    assert (
        gate_script.held_against_restarts(gated, lambda: seen.append("ready") or 0, path, 30) == 0
    )
    assert seen == ["gates"]  # nothing in flight: no boot wait
