"""Control side of the serving gates: remote command lines to run on the head, and their parsers.

The gate logic itself lives in the host package (files/sparkhost/gate.py, stdlib, shipped to every
rank, so the watchdog can use it without the control machine). This module imports it and adds
what a pyinfra op needs: argv builders (the ``gate`` job, or plain curl) and parsers of their
stdout. Everything here is pure: nothing runs a command.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sparkhost import gate as _impl

from sparkrig import hostpkg

CURL_STATUS_MARK = "\n__sparkrig_http_status__="

GateResult = _impl.GateResult
GATES: tuple[str, ...] = _impl.GATES
STAGE_ORDER: tuple[str, ...] = _impl.STAGE_ORDER
MATH_ANSWER: str = _impl.MATH_ANSWER
TOOL_NAME: str = _impl.TOOL_NAME


def boot_stage(lines: Iterable[str]) -> str | None:
    """Latest recognised boot stage in log lines (see STAGE_ORDER), None if none matched."""
    return _impl.boot_stage(lines)


def boot_errors(lines: Iterable[str]) -> list[str]:
    return _impl.boot_errors(lines)


def stage_index(stage: str | None) -> int:
    """Position of a stage in boot order (-1 for None): progress as a number."""
    return STAGE_ORDER.index(stage) if stage in STAGE_ORDER else -1


def math_payload(model: str) -> dict[str, Any]:
    return _impl.math_payload(model)


def tool_payload(model: str) -> dict[str, Any]:
    return _impl.tool_payload(model)


def parse_health(status: int, body: str) -> Any:
    return _impl.parse_health(status, body)


def parse_models(status: int, body: str, model: str) -> Any:
    return _impl.parse_models(status, body, model)


def parse_math(status: int, body: str) -> Any:
    return _impl.parse_math(status, body)


def parse_tool(status: int, body: str, name: str = TOOL_NAME) -> Any:
    return _impl.parse_tool(status, body, name)


def parse_locked(answers: Sequence[tuple[str, int, str]]) -> Any:
    return _impl.parse_locked(answers)


# --- the script on the head -----------------------------------------------------------------------
@dataclass(frozen=True)
class LoopbackTls:
    """How the head's own gates speak TLS to its front on loopback: verified against the pair's
    CA (``ca_file``), or, for the operator's certificate (issued for the names clients dial,
    not for 127.0.0.1), unverified: that connection never leaves the head."""

    ca_file: str = ""

    def args(self) -> list[str]:
        return ["--ca-file", self.ca_file] if self.ca_file else ["--tls-unverified"]


def local_url(api_port: int, tls: LoopbackTls | None = None) -> str:
    return f"{'https' if tls else 'http'}://127.0.0.1:{api_port}"


def _url_args(api_port: int, tls: LoopbackTls | None) -> list[str]:
    return ["--url", local_url(api_port, tls), *(tls.args() if tls else [])]


def gate_command(
    install_dir: str,
    api_port: int,
    served_name: str,
    gates: Sequence[str] = GATES,
    timeout: float = 120.0,
    key_file: str | None = None,
    tls: LoopbackTls | None = None,
) -> list[str]:
    """argv that runs the gates on the head; stdout is one JSON line per gate, exit 1 on failure.
    ``key_file``: the API key file the script reads (the key itself never reaches an argv);
    ``tls``: the front serves HTTPS (None: HTTP)."""
    bad = set(gates) - set(GATES)
    if bad:
        raise ValueError(f"unknown gate(s): {sorted(bad)}")
    return hostpkg.command(
        install_dir, "gate", "gates",
        *_url_args(api_port, tls), "--model", served_name,
        "--only", ",".join(gates), "--timeout", f"{timeout:g}", *_key_args(key_file),
    )  # fmt: skip


def _key_args(key_file: str | None) -> list[str]:
    return ["--api-key-file", key_file] if key_file else []


def wait_command(
    install_dir: str,
    api_port: int,
    container: str | None,
    timeout: float = 3600.0,
    interval: float = 10.0,
    tls: LoopbackTls | None = None,
) -> list[str]:
    """argv that waits for /health on the head, printing JSON stage lines as the boot moves on.
    Exit 0 ready, 1 container gone / error line in its log, 2 timeout."""
    argv = hostpkg.command(install_dir, "gate", "wait", *_url_args(api_port, tls),
                           "--timeout", f"{timeout:g}", "--interval", f"{interval:g}")  # fmt: skip
    if container:
        argv += ["--container", container]
    return argv


def probe_command(
    install_dir: str,
    api_port: int,
    served_name: str,
    timeout: float = 60,
    key_file: str | None = None,
) -> list[str]:
    """argv of the watchdog probe: one real completion (the math gate), authenticated with the
    key read from ``key_file`` when the API has one."""
    return hostpkg.command(install_dir, "gate", "probe", "--url", local_url(api_port),
                           "--model", served_name, "--timeout", f"{timeout:g}",
                           *_key_args(key_file))  # fmt: skip


def shell(argv: Sequence[str]) -> str:
    """One shell-quoted command line (pyinfra server.shell takes strings)."""
    return shlex.join(argv)


def parse_gate_lines(stdout: str) -> list[Any]:
    """GateResults from the script's stdout; a non-JSON line becomes a failed "output" result."""
    out = []
    for line in stdout.splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            d = json.loads(line)
            out.append(GateResult(str(d["gate"]), bool(d["ok"]), str(d.get("detail", "")),
                                  int(d.get("ms", 0))))  # fmt: skip
        except (ValueError, KeyError, TypeError):
            out.append(GateResult("output", False, line[:300]))
    return out


def parse_wait_lines(stdout: str) -> list[dict[str, Any]]:
    """Progress events of `wait`: {"event": stage|ready|failed|timeout, "stage": ..., "s": ...}"""
    events = []
    for line in stdout.splitlines():
        try:
            d = json.loads(line)
        except ValueError:
            continue
        if isinstance(d, dict) and "event" in d:
            events.append(d)
    return events


def gates_passed(results: Iterable[Any], required: Sequence[str] = GATES) -> bool:
    got = {r.gate: r.ok for r in results}
    return all(got.get(g, False) for g in required)


# --- plain curl (when the script is not installed yet) -------------------------------------------
def curl_command(
    url: str,
    payload: dict[str, Any] | None = None,
    timeout: float = 60,
    key_file: str | None = None,
) -> list[str]:
    """curl argv printing the body, then a marker line with the HTTP status (000 = unreachable).
    With ``key_file``, sh builds the Authorization header from the file and hands it to curl on
    stdin (``-H @-``), so the key is in no argv."""
    argv = ["curl", "-sS", "-m", f"{timeout:g}", "-o", "-",
            "-w", CURL_STATUS_MARK.replace("\n", "\\n") + "%{http_code}"]  # fmt: skip
    if payload is not None:
        argv += ["-H", "Content-Type: application/json", "--data-binary", json.dumps(payload)]
    if key_file:
        header = 'printf "Authorization: Bearer %s\\n" "$(cat "$0")" | exec "$@" -H @-'
        return ["sh", "-c", header, key_file, *argv, url]
    return argv + [url]


def parse_curl_output(stdout: str) -> tuple[int, str]:
    """(status, body) from curl_command's stdout; status 0 when curl reached nothing."""
    body, sep, status = stdout.rpartition(CURL_STATUS_MARK)
    if not sep:
        return 0, stdout
    try:
        code = int(status.strip())
    except ValueError:
        return 0, stdout
    return code, body


def curl_gate_commands(
    api_port: int, served_name: str, key_file: str | None = None
) -> dict[str, list[str]]:
    """One curl argv per gate, against the head's loopback (/health needs no key, as in vLLM).
    With a key, the locked gate asks /invocations without it (401 expected); an open API
    (no ``key_file``) has no locked gate to run."""
    base, chat = local_url(api_port), local_url(api_port) + "/v1/chat/completions"
    commands = {
        "health": curl_command(base + "/health", timeout=10),
        "models": curl_command(base + "/v1/models", timeout=10, key_file=key_file),
        "math": curl_command(chat, math_payload(served_name), 120, key_file),
        "tool": curl_command(chat, tool_payload(served_name), 120, key_file),
    }
    if key_file:
        commands["locked"] = curl_command(base + "/invocations", math_payload(served_name), 10)
    return commands


def parse_curl_gate(gate: str, stdout: str, served_name: str) -> Any:
    status, body = parse_curl_output(stdout)
    if gate == "health":
        return parse_health(status, body)
    if gate == "models":
        return parse_models(status, body, served_name)
    if gate == "math":
        return parse_math(status, body)
    if gate == "tool":
        return parse_tool(status, body)
    if gate == "locked":
        return parse_locked([("/invocations", status, body)])
    raise ValueError(f"unknown gate {gate!r}")
