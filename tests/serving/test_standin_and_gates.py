"""lab/standin_vllm.py as subprocesses on 127.0.0.1, checked with the gate script and parsers."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from serving_helpers import REPO, Proc, free_port, load_path, local_argv
from sparkhost import gate as gate_script
from vllm_helpers import skip_without_vllm_package

from sparkrig import gates

standin = load_path("standin_vllm", REPO / "lab" / "standin_vllm.py")
STANDIN = str(REPO / "lab" / "standin_vllm.py")


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text("{}")
    return d


def serve_argv(
    model: Path, rank: int, nnodes: int, master_port: int, api_port: int, *extra: str
) -> list[str]:
    from sparkrig.profiles import serve_args

    args = serve_args(
        "shared",
        rank=rank,
        nnodes=nnodes,
        master_addr="127.0.0.1",
        master_port=master_port,
        model_dir=str(model),
        engine_port=api_port,
        served_name="glm-5.3-flash",
        host="127.0.0.1",
        extra_args=["--standin-delay", "0.05", *extra],
    )
    assert args[:2] == ["vllm", "serve"]
    return args[1:]  # what the image's `vllm` wrapper passes on


def get(url: str, payload: dict[str, Any] | None = None) -> tuple[int, str]:
    return gate_script.http(url, payload, 10.0)


# --- pure parts of the stand-in -------------------------------------------------------------------


def test_parse_args_with_the_pinned_flag_set() -> None:
    o = standin.parse_args(
        ["serve", "/m", "--port", "9000", "--headless", "--node-rank=1", "--nnodes", "2",
         "--logits-processors", "a:B", "c:D", "--enforce-eager", "--max_model_len", "4096",
         "--speculative-config", '{"method":"mtp"}', "-tp", "2"]
    )  # fmt: skip
    assert o.model == "/m" and o.get("--port") == "9000" and o.rank == 1 and o.nnodes == 2
    assert o.headless and "--enforce-eager" in o.switches and o.get("-tp") == "2"
    assert o.multi["--logits-processors"] == ["a:B", "c:D"]
    assert o.get("--max-model-len") == "4096"  # underscores count as dashes, as in vLLM
    assert o.unknown == [] and o.served_name == "/m"


@pytest.mark.parametrize(
    ("extra", "unknown"),
    [
        (["--weird", "x"], ["--weird", "x"]),
        (["--kv-cache", "1"], ["--kv-cache", "1"]),  # ambiguous prefix, as in argparse
        (["--block_sizes=4"], ["--block-sizes"]),
        (["second-model"], ["second-model"]),
    ],
)
def test_parse_args_collects_what_vllm_does_not_know(extra: list[str], unknown: list[str]) -> None:
    assert standin.parse_args(["serve", "/m", "--enforce-eager", *extra]).unknown == unknown


def test_flag_file_is_the_pinned_vllm_parser() -> None:
    flags = standin.load_flags()
    assert flags["--logits-processors"] == "+" and flags["--headless"] == "0"
    assert flags["--kv-cache-memory-bytes"] == "1" and "--kv-cache-memory" not in flags
    o = standin.parse_args(["serve", "/m", "--kv-cache-memory", "5"])  # a unique prefix
    assert o.get("--kv-cache-memory-bytes") == "5" and not o.unknown
    assert "# `vllm serve` options of vllm 0.33.0" in Path(standin.FLAGS_FILE).read_text()


@pytest.mark.parametrize(
    ("text", "answer"),
    [("What is 17*23?", "391"), ("17 x 23", "391"), ("2+2", "4"), ("7/2", "3.5"), ("hi", None)],
)
def test_arithmetic(text: str, answer: str | None) -> None:
    assert standin.arithmetic_answer(text) == answer


def test_tool_arguments_from_schema() -> None:
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}, "n": {"type": "integer"},
                       "unit": {"enum": ["c", "f"]}},
        "required": ["city", "n", "unit"],
    }  # fmt: skip
    assert standin.tool_arguments(schema) == {"city": "standin", "n": 1, "unit": "c"}


def test_chat_completion_tool_and_named_choice() -> None:
    req = gate_script.tool_payload("m")
    body = standin.chat_completion(req, "m")
    assert gate_script.parse_tool(200, json.dumps(body)).ok
    req["tool_choice"] = {"type": "function", "function": {"name": "get_weather"}}
    assert standin.chat_completion(req, "m")["choices"][0]["finish_reason"] == "tool_calls"
    req["tool_choice"] = "auto"
    assert standin.chat_completion(req, "m")["choices"][0]["message"]["content"]


# --- processes ------------------------------------------------------------------------------------


def test_missing_config_json_exits_1(tmp_path: Path) -> None:
    p = Proc(STANDIN, ["serve", str(tmp_path / "nope"), "--standin-delay", "0"])
    assert p.exit_code() == 1
    assert any("has no config.json" in ln for ln in p.lines)


def test_unknown_flag_refused_at_start(model_dir: Path) -> None:
    p = Proc(STANDIN, ["serve", str(model_dir), "--standin-delay", "0", "--kv-cache-bytes", "1"])
    assert p.exit_code() == 2
    assert any("unrecognized arguments: --kv-cache-bytes 1" in ln for ln in p.lines)
    assert not any("API server version" in ln for ln in p.lines)  # refused before booting


def test_missing_drafter_exits_1(model_dir: Path) -> None:
    spec = json.dumps({"method": "dflash", "model": "/nonexistent", "num_speculative_tokens": 7})
    p = Proc(
        STANDIN, ["serve", str(model_dir), "--speculative-config", spec, "--standin-delay", "0"]
    )
    assert p.exit_code() == 1
    assert any("drafter" in ln for ln in p.lines)


def test_help_and_version() -> None:
    out = subprocess.run([sys.executable, STANDIN, "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "vllm serve" in out.stdout


def test_pair_boot_gates_and_worker_loss(model_dir: Path, procs: list[Proc]) -> None:
    mport, aport = free_port(), free_port()
    worker = Proc(STANDIN, serve_argv(model_dir, 1, 2, mport, aport))
    procs.append(worker)
    worker.wait_for("head not reachable yet")  # worker first, like the deploy
    head = Proc(STANDIN, serve_argv(model_dir, 0, 2, mport, aport))
    procs.append(head)
    head.wait_for("Application startup complete")
    worker.wait_for("headless worker ready")
    assert gates.boot_stage(head.lines) == "ready"
    assert any("Traceback (most recent call last)" in ln for ln in head.lines)  # benign, logged
    assert gates.boot_errors(head.lines) == []  # ... and not a boot failure
    assert gates.boot_stage(worker.lines) == "graphs"
    assert not any("Starting vLLM API server" in ln for ln in worker.lines)  # no API on workers

    base = f"http://127.0.0.1:{aport}"
    results = gate_script.run_gates(base, "glm-5.3-flash", keyed=False)  # no key: an open API
    assert [r.gate for r in results] == ["health", "models", "math", "tool", "locked"]
    assert all(r.ok for r in results), results

    # the gate script as the head would run it
    argv = gates.gate_command("/opt/sparkrig", aport, "glm-5.3-flash")
    out = subprocess.run(local_argv(argv), capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    parsed = gates.parse_gate_lines(out.stdout)
    assert gates.gates_passed(parsed) and len(parsed) == 5

    # curl variant parsed the same way
    if subprocess.run(["which", "curl"], capture_output=True).returncode == 0:
        for gate, cmd in gates.curl_gate_commands(aport, "glm-5.3-flash").items():
            res = subprocess.run(cmd, capture_output=True, text=True)
            assert gates.parse_curl_gate(gate, res.stdout, "glm-5.3-flash").ok, (gate, res)

    # wrong model name -> 404 like vLLM
    status, body = get(base + "/v1/chat/completions", gate_script.math_payload("other"))
    assert status == 404 and "does not exist" in body

    # kill the worker: /health stays 200 (like real vLLM), completions fail
    worker.p.send_signal(signal.SIGKILL)
    worker.exit_code()
    head.wait_for("peer lost: worker rank 1")
    assert get(base + "/health")[0] == 200
    dead = get(base + "/v1/chat/completions", gate_script.math_payload("glm-5.3-flash"))
    assert dead[0] == 500 and gate_script.parse_math(*dead).ok is False
    # no elastic rejoin: a restarted worker is refused
    again = Proc(STANDIN, serve_argv(model_dir, 1, 2, mport, aport))
    procs.append(again)
    assert again.exit_code() == 1
    assert any("refused" in ln for ln in again.lines)
    # the head survives until the deploy stops it; SIGTERM ends it cleanly
    head.p.send_signal(signal.SIGTERM)
    assert head.exit_code() == 0


def test_worker_exits_when_head_goes(model_dir: Path, procs: list[Proc]) -> None:
    mport, aport = free_port(), free_port()
    head = Proc(STANDIN, serve_argv(model_dir, 0, 2, mport, aport))
    procs.append(head)
    head.wait_for("TCP store listening")
    worker = Proc(STANDIN, serve_argv(model_dir, 1, 2, mport, aport))
    procs.append(worker)
    head.wait_for("Application startup complete")
    head.p.send_signal(signal.SIGKILL)
    assert worker.exit_code() == 1
    assert any("peer lost" in ln for ln in worker.lines)
    assert gates.boot_errors(worker.lines)


def test_head_exit_on_peer_loss_flag(model_dir: Path, procs: list[Proc]) -> None:
    mport, aport = free_port(), free_port()
    head = Proc(STANDIN, serve_argv(model_dir, 0, 2, mport, aport, "--standin-exit-on-peer-loss"))
    worker = Proc(STANDIN, serve_argv(model_dir, 1, 2, mport, aport))
    procs += [head, worker]
    head.wait_for("Application startup complete")
    worker.p.send_signal(signal.SIGTERM)
    assert head.exit_code() == 1


def test_head_rendezvous_timeout(model_dir: Path) -> None:
    mport, aport = free_port(), free_port()
    head = Proc(
        STANDIN, serve_argv(model_dir, 0, 2, mport, aport, "--standin-rendezvous-timeout", "1")
    )
    assert head.exit_code() == 1
    assert any("rendezvous timed out" in ln for ln in head.lines)


def test_worker_with_wrong_nnodes_refused(model_dir: Path, procs: list[Proc]) -> None:
    mport, aport = free_port(), free_port()
    head = Proc(
        STANDIN, serve_argv(model_dir, 0, 2, mport, aport, "--standin-rendezvous-timeout", "5")
    )
    procs.append(head)
    head.wait_for("TCP store listening")
    worker = Proc(STANDIN, serve_argv(model_dir, 1, 3, mport, aport))
    procs.append(worker)
    assert worker.exit_code() == 1


def test_three_nodes_wait_for_all(model_dir: Path, procs: list[Proc]) -> None:
    mport, aport = free_port(), free_port()
    head = Proc(STANDIN, serve_argv(model_dir, 0, 3, mport, aport))
    w1 = Proc(STANDIN, serve_argv(model_dir, 1, 3, mport, aport))
    procs += [head, w1]
    head.wait_for("(1/2)")
    time.sleep(0.3)
    assert not any("Application startup complete" in ln for ln in head.lines)
    w2 = Proc(STANDIN, serve_argv(model_dir, 2, 3, mport, aport))
    procs.append(w2)
    head.wait_for("Application startup complete")


def test_single_node_head(model_dir: Path, procs: list[Proc]) -> None:
    aport = free_port()
    head = Proc(STANDIN, ["serve", str(model_dir), "--port", str(aport), "--host", "127.0.0.1",
                          "--standin-delay", "0"])  # fmt: skip
    procs.append(head)
    head.wait_for("Application startup complete")
    code = gate_script.wait_ready(f"http://127.0.0.1:{aport}", None, 5, 0.1, emit=lambda s: None)
    assert code == 0


def test_the_failing_variant_fails_the_math_gate_alone(model_dir: Path, procs: list[Proc]) -> None:
    """The lab's failing image variant (STANDIN_FAIL_GATES=math, lab/image.py) boots and passes
    /health and /v1/models, and fails the math gate: an upgrade to it must roll back."""
    aport = free_port()
    head = Proc(
        STANDIN,
        ["serve", str(model_dir), "--port", str(aport), "--host", "127.0.0.1",
         "--standin-delay", "0", "--served-model-name", "glm-5.3-flash"],
        env={"STANDIN_FAIL_GATES": "math"},
    )  # fmt: skip
    procs.append(head)
    head.wait_for("Application startup complete")
    results = {
        r.gate: r.ok
        for r in gate_script.run_gates(f"http://127.0.0.1:{aport}", "glm-5.3-flash", keyed=False)
    }
    assert results == {"health": True, "models": True, "math": False, "tool": True, "locked": True}


# --- the API key, as vLLM enforces it -------------------------------------------------------------
KEY = "k3y-" + "0123456789abcdef" * 3


def vllm_authenticate() -> Any:
    """The real vLLM's AuthenticationMiddleware module (loaded by path: it needs starlette only,
    not the whole vllm package)."""
    import importlib.util

    skip_without_vllm_package("vllm")
    skip_without_vllm_package("starlette")
    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.submodule_search_locations
    root = Path(next(iter(spec.submodule_search_locations)))
    return load_path("vllm_authenticate", root / "entrypoints/serve/middleware/authenticate.py")


def vllm_lets_through(
    middleware: Any, method: str, path: str, header: str | None, tokens: list[str]
) -> bool:
    """Drive vLLM's middleware with one ASGI request: True when it reaches the app, False on 401."""
    import asyncio

    reached: list[bool] = []
    sent: list[dict[str, Any]] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        reached.append(True)

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b""}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    headers = [] if header is None else [(b"authorization", header.encode())]
    scope = {"type": "http", "method": method, "path": path, "root_path": "", "headers": headers,
             "query_string": b""}  # fmt: skip
    asyncio.run(middleware(app, tokens=tokens)(scope, receive, send))
    if reached:
        return True
    assert sent and sent[0]["status"] == 401, sent
    return False


def test_the_standins_key_check_is_vllms_middleware_decision_for_decision() -> None:
    auth = vllm_authenticate()
    assert standin.GUARDED_PREFIX == auth.GUARDED_PREFIX
    paths = ["/health", "/version", "/metrics", "/invocations", "/tokenize", "/v1/models",
             "/v1/chat/completions", "/v1", "/v1x", "/v2/x", "/inference/v1/generate",
             "/cohere/v2/chat", "/x/v1/models"]  # fmt: skip
    headers = [None, "", f"Bearer {KEY}", f"bearer {KEY}", f"BEARER {KEY}", "Bearer wrong",
               f"Bearer  {KEY}", f"Bearer {KEY} ", f"Basic {KEY}", KEY, f"Token {KEY}"]  # fmt: skip
    for tokens in ([KEY], ["other", KEY], ["other"]):
        for method in ("GET", "POST", "OPTIONS"):
            for path in paths:
                for header in headers:
                    want = vllm_lets_through(auth.AuthenticationMiddleware, method, path, header,
                                             tokens)  # fmt: skip
                    got = standin.authorized(method, path, header, tokens)
                    assert got == want, (tokens, method, path, header)
    assert not standin.authorized("GET", "/v1/models", None, [KEY])  # the matrix is not all-open


def test_the_standin_takes_its_keys_where_vllm_does() -> None:
    opts = standin.parse_args(["serve", "/m"])
    assert standin.api_tokens(opts, {"VLLM_API_KEY": KEY}) == [KEY]
    assert (
        standin.api_tokens(opts, {}) == [] and standin.api_tokens(opts, {"VLLM_API_KEY": ""}) == []
    )
    flagged = standin.parse_args(["serve", "/m", "--api-key", "a", "b"])
    assert standin.api_tokens(flagged, {"VLLM_API_KEY": KEY}) == ["a", "b"]  # the flag wins
    assert standin.authorized("GET", "/v1/models", None, [])  # no key: an open API


def authed(url: str, header: str | None, payload: dict[str, Any] | None = None) -> int:
    import urllib.error
    import urllib.request

    data = None if payload is None else json.dumps(payload).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    if header is not None:
        req.add_header("Authorization", header)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as err:
        assert err.code != 401 or json.loads(err.read()) == {"error": "Unauthorized"}
        return int(err.code)


def test_the_standin_answers_401_without_the_key_and_the_gates_pass_with_its_file(
    model_dir: Path, procs: list[Proc], tmp_path: Path
) -> None:
    mport, aport = free_port(), free_port()
    head = Proc(STANDIN, serve_argv(model_dir, 0, 1, mport, aport), env={"VLLM_API_KEY": KEY})
    procs.append(head)
    head.wait_for("Application startup complete")
    base = f"http://127.0.0.1:{aport}"
    chat = base + "/v1/chat/completions"
    math = gate_script.math_payload("glm-5.3-flash")
    assert authed(base + "/health", None) == 200  # open, as in vLLM
    assert authed(base + "/version", None) == 200
    for header in (None, "Bearer wrong", KEY, f"Basic {KEY}"):
        assert authed(base + "/v1/models", header) == 401, header
        assert authed(chat, header, math) == 401, header
    assert authed(base + "/v1/no-such-route", None) == 401  # refused before routing, as vLLM
    assert authed(base + "/v1/models", f"Bearer {KEY}") == 200
    assert authed(chat, f"bearer {KEY}", math) == 200

    key_file = tmp_path / "api-key"
    key_file.write_text(KEY + "\n")
    without = subprocess.run(
        local_argv(gates.gate_command("/opt/sparkrig", aport, "glm-5.3-flash")),
        capture_output=True, text=True,
    )  # fmt: skip
    assert without.returncode == 1
    refused = {r.gate: r for r in gates.parse_gate_lines(without.stdout)}
    assert refused["health"].ok and "401" in refused["models"].detail
    argv = gates.gate_command("/opt/sparkrig", aport, "glm-5.3-flash", key_file=str(key_file))
    out = subprocess.run(local_argv(argv), capture_output=True, text=True)
    # the bare engine serves /invocations and /tokenize without the key, as vLLM does: only the
    # locked gate fails; through the front it passes (tests/serving/test_front_nginx.py)
    assert out.returncode == 1, out.stdout + out.stderr
    results = gates.parse_gate_lines(out.stdout)
    assert gates.gates_passed(results, ("health", "models", "math", "tool"))
    locked = {r.gate: r for r in results}["locked"]
    assert not locked.ok and "/invocations 200, /tokenize 200" in locked.detail
    assert authed(base + "/invocations", None, math) == 200  # vLLM's key does not guard it
    assert authed(base + "/docs", None) == 404  # --disable-fastapi-docs, as the deploy passes
    probe = gates.probe_command("/opt/sparkrig", aport, "glm-5.3-flash", key_file=str(key_file))
    bare = gates.probe_command("/opt/sparkrig", aport, "glm-5.3-flash")
    assert subprocess.run(local_argv(probe), capture_output=True).returncode == 0
    assert subprocess.run(local_argv(bare), capture_output=True).returncode == 1
    curl = gates.curl_gate_commands(aport, "glm-5.3-flash", key_file=str(key_file))
    if subprocess.run(["which", "curl"], capture_output=True).returncode == 0:
        for gate, cmd in curl.items():
            res = subprocess.run(cmd, capture_output=True, text=True)
            verdict = gates.parse_curl_gate(gate, res.stdout, "glm-5.3-flash")
            assert verdict.ok == (gate != "locked"), (gate, res)  # the bare engine: not locked
        res = subprocess.run(gates.curl_gate_commands(aport, "glm-5.3-flash")["models"],
                             capture_output=True, text=True)  # fmt: skip
        assert gates.parse_curl_output(res.stdout)[0] == 401
    for cmd in (argv, probe, *curl.values()):
        assert not [a for a in cmd if KEY in a], cmd  # the key is read from the file, never argv
