"""The API front on the qemu lab (docs/front.md): from outside the head, every route but GET
/health needs the key, streaming passes through the front, and the engine's own port answers
nobody but the head's loopback.

"Outside the head" is two places: the control side, through the lab's forwarder to the head's
management (uplink) address on api_port (what a client on the LAN sees), and a worker guest,
another host on the same networks, dialling the head's uplink and fabric addresses.

Ordered: the first test converges the pair (a deploy that changes nothing on a converged lab)."""

from __future__ import annotations

import http.client
import json
import ssl
import subprocess
import time

import pytest

from lab import REPO
from lab.guest import API_CA, API_KEY, CONTROL_CA, SPARKHOST, control_api_key
from tests.lab.conftest import STATE, Lab, pyinfra

pytestmark = pytest.mark.lab
INV = "lab/inventory.py"
API_PORT, ENGINE_PORT = 8000, 8001  # group_data's api_port and engine_port
MODEL = "glm-5.3-flash"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "17*23"}]}


def forward_port() -> int:
    return int(json.loads(STATE.read_text())["api_forward_port"])


def head_uplink(lab: Lab) -> str:
    """The head's management (uplink) address, where the forwarder dials api_port."""
    return str(json.loads(STATE.read_text())["hosts"][0]["mgmt_address"])


def connect(timeout: float) -> http.client.HTTPSConnection:
    """The control side's connection through the forwarder, the front's certificate verified
    against the pair's CA (as the README's curl --cacert does)."""
    context = ssl.create_default_context(cafile=str(CONTROL_CA))
    return http.client.HTTPSConnection(
        "127.0.0.1", forward_port(), timeout=timeout, context=context
    )


def ask(path: str, method: str = "GET", key: str | None = None, body: object = None) -> int:
    """One request from the control side through the forwarder (the head's uplink, api_port)."""
    conn = connect(60)
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    data = None if body is None else json.dumps(body)
    conn.request(method, path, body=data, headers=headers)
    resp = conn.getresponse()
    resp.read()
    conn.close()
    return resp.status


def test_front_converged(lab: Lab):
    r = pyinfra("-y", INV, "deploy.py")
    assert r.rc == 0, r.output[-3000:]
    listening = lab.head.sh("ss -ltnH")
    assert f"127.0.0.1:{ENGINE_PORT} " in listening  # the engine on loopback only
    assert f"0.0.0.0:{ENGINE_PORT} " not in listening and f"*:{ENGINE_PORT} " not in listening
    assert lab.head.sh("systemctl is-active nginx.service").strip() == "active"
    assert lab.head.sh("stat -c '%a %U' /etc/sparkrig/api-front-key.conf").split() == [
        "600",
        "root",
    ]


def test_without_the_key_the_lan_gets_401_with_it_200(lab: Lab):
    key = control_api_key().read_text().strip()
    for path, method, body in (
        ("/invocations", "POST", CHAT),
        ("/tokenize", "POST", {"model": MODEL, "prompt": "hello"}),
        ("/v1/models", "GET", None),
        ("/v1/chat/completions", "POST", CHAT),
        ("/metrics", "GET", None),
        ("/docs", "GET", None),
    ):
        assert ask(path, method, None, body) == 401, path
        assert ask(path, method, "wrong", body) == 401, path
    assert ask("/health") == 200
    assert ask("/v1/models", key=key) == 200
    assert ask("/v1/chat/completions", "POST", key, CHAT) == 200
    assert ask("/invocations", "POST", key, CHAT) == 200
    assert ask("/tokenize", "POST", key, {"model": MODEL, "prompt": "hello"}) == 200
    assert ask("/docs", key=key) == 404  # --disable-fastapi-docs: gone even with the key


def test_a_stream_arrives_in_pieces_through_the_front(lab: Lab):
    key = control_api_key().read_text().strip()
    conn = connect(120)
    body = {**CHAT, "stream": True, "max_tokens": 64, "ignore_eos": True,
            "messages": [{"role": "user", "content": "Tell a long story."}]}  # fmt: skip
    t0 = time.monotonic()
    conn.request("POST", "/v1/chat/completions", body=json.dumps(body), headers={
        "Authorization": f"Bearer {key}", "Content-Type": "application/json"})  # fmt: skip
    resp = conn.getresponse()
    assert resp.status == 200
    times = []
    while True:
        line = resp.readline()
        if not line:
            break
        if line.startswith(b"data: "):
            times.append(time.monotonic() - t0)
            if line.strip() == b"data: [DONE]":
                break
    conn.close()
    print(f"{len(times)} events, first at {times[0]:.2f} s, last at {times[-1]:.2f} s")
    assert len(times) > 10
    assert times[-1] - times[0] > 0.5  # spread over the decode, not delivered at the end


def test_the_engine_port_answers_no_other_host(lab: Lab):
    worker = lab.workers[0]
    head_fabric = lab.head.ip
    for address in (head_uplink(lab), head_fabric):
        code = worker.sh(
            f"curl -s -o /dev/null -m 5 -w '%{{http_code}}' "
            f"http://{address}:{ENGINE_PORT}/health || true"
        ).strip()
        assert code == "000", (address, code)  # refused: nothing listens there
        # the key is what is judged here, not the certificate (the worker has no CA of the pair)
        front = worker.sh(
            f"curl -k -s -o /dev/null -m 5 -w '%{{http_code}}' -X POST "
            f"https://{address}:{API_PORT}/invocations || true"
        ).strip()
        assert front == "401", (address, front)
    # on the head itself the engine answers on loopback (the watchdog reads it there)
    code = lab.head.sh(
        f"curl -s -o /dev/null -w '%{{http_code}}' http://127.0.0.1:{ENGINE_PORT}/metrics"
    ).strip()
    assert code == "200"


def test_the_five_gates_pass_through_the_front(lab: Lab):
    out = lab.head.sh(
        f"{SPARKHOST} gate gates --url https://127.0.0.1:{API_PORT} --ca-file {API_CA} "
        f"--model {MODEL} --api-key-file {API_KEY}"
    )
    gates = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert [(g["gate"], g["ok"]) for g in gates] == [
        ("health", True), ("models", True), ("math", True), ("tool", True), ("locked", True),
    ]  # fmt: skip


def readme_curl() -> str:
    """The README's completion command (quick start, step 8), its continuations joined."""
    lines = (REPO / "README.md").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith("curl --cacert"))
    command = []
    for line in lines[start:]:
        command.append(line.strip().removesuffix("\\").strip())
        if not line.rstrip().endswith("\\"):
            break
    return " ".join(command)


def test_the_readmes_curl_verifies_the_front_with_the_pairs_ca(lab: Lab):
    command = readme_curl()
    assert "--cacert .sparkrig/tls/ca.crt https://spark-a.local:8000/" in command
    lab_command = command.replace(
        "https://spark-a.local:8000", f"https://127.0.0.1:{forward_port()}"
    )
    out = subprocess.run(["sh", "-c", lab_command], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["choices"][0]["message"]["content"], out.stdout
    # the same command trusting the system's CAs alone fails: the certificate is the pair's
    bare = lab_command.replace("--cacert .sparkrig/tls/ca.crt ", "")
    refused = subprocess.run(["sh", "-c", bare], cwd=REPO, capture_output=True, text=True)
    assert refused.returncode == 60, (refused.returncode, refused.stderr)  # curl: peer cert
