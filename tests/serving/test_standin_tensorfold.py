"""The lab's TensorFold stand-in (lab/standin_tensorfold.py) answers as TensorFold 0.6.0 does:
its CLI refusing unknown flags (lab/tensorfold-flags.txt), rank >= 1 never opening HTTP, the
/health JSON the watchdog's tensorfold-health parser reads, `tensorfold:` metric names, no key of
its own, and a lost peer leaving rank 0 up while requests hang. Every argv is the one the
tensorfold family adapter builds for the stack."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from serving_helpers import REPO, Proc, free_port
from sparkhost import wedge

from sparkrig.engines import tensorfold as family
from sparkrig.stacks import get

STANDIN = str(REPO / "lab" / "standin_tensorfold.py")
FLAVOUR = {"SPARKRIG_STANDIN_ENGINE": "tensorfold-0.6"}


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, Path]:
    model, drafter = tmp_path / "model", tmp_path / "drafter"
    for d in (model, drafter):
        d.mkdir()
        (d / "config.json").write_text("{}")
    return model, drafter


def argv(model: Path, drafter: Path, rank: int, master_port: int, engine_port: int,
         *extra: str) -> list[str]:  # fmt: skip
    args = family.serve_args(
        get("tensorfold"), "shared", rank=rank, nnodes=2, master_addr="127.0.0.1",
        master_port=master_port, model_dir=str(model), engine_port=engine_port,
        drafter_dir=str(drafter), extra_args=["--standin-delay", "0.05", *extra],
    )  # fmt: skip
    assert args[:2] == ["tensorfold", "serve"]
    return args[1:]  # what the image's `tensorfold` wrapper passes on


def get_json(url: str, timeout: float = 5.0) -> tuple[int, dict]:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return resp.status, json.loads(resp.read())


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def pair(procs: list[Proc], dirs: tuple[Path, Path], *extra: str) -> tuple[int, int, Proc]:
    model, drafter = dirs
    master, api, worker_port = free_port(), free_port(), free_port()
    worker = Proc(
        STANDIN,
        [*argv(model, drafter, 1, master, api, *extra), "--port", str(worker_port)],
        FLAVOUR,
    )
    head = Proc(STANDIN, argv(model, drafter, 0, master, api, *extra), FLAVOUR)
    procs += [worker, head]
    head.wait_for("Application startup complete.")
    worker.wait_for("following rank 0")
    return api, worker_port, worker


def test_unknown_flags_and_choices_are_refused_as_argparse_does(dirs) -> None:
    model, drafter = dirs
    base = argv(model, drafter, 0, 29551, 8001)
    for extra, said in (
        (["--api-key", "k"], "tensorfold: error: unrecognized arguments: --api-key k"),
        (["--max-model-len", "8"], "unrecognized arguments: --max-model-len 8"),
    ):
        done = subprocess.run([sys.executable, STANDIN, *base, *extra], capture_output=True,
                              text=True, env={**os.environ, **FLAVOUR}, timeout=30)  # fmt: skip
        assert done.returncode == 2 and said in done.stderr, done.stderr
    bad_tp = [*base[: base.index("--tp") + 1], "4", *base[base.index("--tp") + 2 :]]
    done = subprocess.run([sys.executable, STANDIN, *bad_tp], capture_output=True, text=True,
                          env={**os.environ, **FLAVOUR}, timeout=30)  # fmt: skip
    assert done.returncode == 2 and "argument --tp: invalid choice: 4" in done.stderr
    # another stack's image has no TensorFold
    done = subprocess.run(
        [sys.executable, STANDIN, *base],
        capture_output=True,
        text=True,
        env={**os.environ, "SPARKRIG_STANDIN_ENGINE": "vllm-0.33"},
        timeout=30,
    )
    assert done.returncode == 127 and "tensorfold: not found" in done.stderr


def test_rank_1_never_opens_http_and_rank_0_answers_without_a_key(procs, dirs) -> None:
    api, worker_port, _ = pair(procs, dirs)
    assert not listening(worker_port)  # even given --port, rank 1 follows rank 0
    code, models = get_json(f"http://127.0.0.1:{api}/v1/models")
    assert code == 200 and models["data"][0]["id"] == "glm-5.3-flash"
    body = json.dumps({"model": "glm-5.3-flash", "max_tokens": 8,
                       "messages": [{"role": "user", "content": "17*23"}]}).encode()  # fmt: skip
    req = urllib.request.Request(f"http://127.0.0.1:{api}/v1/chat/completions", body,
                                 {"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(req, timeout=20) as resp:  # no key: 0.6.0 checks none
        answer = json.loads(resp.read())
    assert "391" in answer["choices"][0]["message"]["content"]
    code, health = get_json(f"http://127.0.0.1:{api}/health")
    assert code == 200 and health["ok"] is True and health["backend"] == "tensorfold"
    sample = wedge.parse_tensorfold_health(json.dumps(health))
    assert sample.generation_tokens > 0 and sample.prompt_tokens > 0 and not sample.in_flight
    with urllib.request.urlopen(f"http://127.0.0.1:{api}/metrics", timeout=5) as resp:
        metrics = resp.read().decode()
    assert "tensorfold:requests_running 0" in metrics and "vllm:" not in metrics
    assert "tensorfold:generation_tokens_total" in metrics


def test_a_lost_rank_leaves_rank_0_saying_ok_while_requests_hang(procs, dirs) -> None:
    api, _, worker = pair(procs, dirs)
    worker.p.send_signal(signal.SIGKILL)
    head = procs[1]
    head.wait_for("rank 1 lost")
    code, health = get_json(f"http://127.0.0.1:{api}/health")
    assert code == 200 and health["ok"] is True  # shallow: why the watchdog reads counters
    body = json.dumps({"model": "glm-5.3-flash", "max_tokens": 8,
                       "messages": [{"role": "user", "content": "hi"}]}).encode()  # fmt: skip
    req = urllib.request.Request(f"http://127.0.0.1:{api}/v1/chat/completions", body,
                                 {"Content-Type": "application/json"})  # fmt: skip
    with pytest.raises((TimeoutError, urllib.error.URLError)) as err:
        urllib.request.urlopen(req, timeout=2)
    assert not isinstance(err.value, urllib.error.HTTPError)  # no answer at all, not a 500
    code, health = get_json(f"http://127.0.0.1:{api}/health")
    assert health["ok"] is True and health["requests_running"] == 1  # in flight, never moving


def test_the_n_rank_builds_stand_in_takes_three_ranks_which_0_6_refuses(procs, dirs) -> None:
    """The tensorfold-ring stack's image (flavour tensorfold-tp4, MiaAI's N-rank build): the
    three ranks of a triangle start with `--tp 3`, rank 0 serves once ranks 2 and 1 joined; the
    v1.10 image's flavour refuses the same argv as argparse would."""
    model, _ = dirs
    master, api = free_port(), free_port()

    def ring_argv(rank: int) -> list[str]:
        args = family.serve_args(
            get("tensorfold-ring"), "single", rank=rank, nnodes=3, master_addr="127.0.0.1",
            master_port=master, model_dir=str(model), engine_port=api,
            extra_args=["--standin-delay", "0.05"],
        )  # fmt: skip
        return args[1:]

    tp4 = {"SPARKRIG_STANDIN_ENGINE": "tensorfold-tp4"}
    done = subprocess.run([sys.executable, STANDIN, *ring_argv(2)], capture_output=True,
                          text=True, env={**os.environ, **FLAVOUR}, timeout=30)  # fmt: skip
    assert done.returncode == 2 and "argument --tp: invalid choice: 3" in done.stderr
    workers = [Proc(STANDIN, [*ring_argv(r), "--port", str(free_port())], tp4) for r in (2, 1)]
    head = Proc(STANDIN, ring_argv(0), tp4)
    procs += [*workers, head]
    head.wait_for("Application startup complete.")
    for worker in workers:
        worker.wait_for("following rank 0")
    code, models = get_json(f"http://127.0.0.1:{api}/v1/models")
    assert code == 200 and models["data"]
