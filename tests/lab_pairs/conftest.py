"""The two-pair lab (issue 52): `python3 -m lab up --pairs 2` (lab/fabric.py), four guests as two
pairs behind one endpoint (pair_a: lab-head, lab-worker1; pair_b: lab-head2, lab-worker2), booted
once for this directory's tests and torn down at the end. Its own directory and its own lab, as
tests/lab_rings: `make lab-pairs`.

Opt-in with SPARKRIG_LAB=1 and SPARKRIG_PAIRS=2; SPARKRIG_LAB_KEEP=1 reuses a running lab of two
pairs and leaves it up. SPARKRIG_PAIRS_FIGURES=1 records each test's client figures under
bench/results/pairs-lab/.

Helpers: ``deploy(*args)`` (the operator's command with the lab's timeouts), ``dry(*args)`` (what
the next run would change), ``ssh(host, cmd)``, and ``SteadyClient``: threads sending
non-streaming completions in a loop to a list of head API URLs (the lab's loopback forwards, the
front's certificate verified against the endpoint's CA, the control machine's API key), every
request recorded."""

from __future__ import annotations

import http.client
import json
import os
import ssl
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

import pytest

from bench.chaos.pyinfra_output import planned
from lab import REPO
from lab.guest import CONTROL_CA, Deploy, Guest, control_api_key, guests, lab_cli, pyinfra
from tests.lab.conftest import KEEP, STATE, Lab

PAIRS = int(os.environ.get("SPARKRIG_PAIRS", "0") or 0)
FIGURES = os.environ.get("SPARKRIG_PAIRS_FIGURES") == "1"
FIGURES_DIR = REPO / "bench" / "results" / "pairs-lab"
INV = "lab/inventory.py"
DEPLOY_TIMEOUT_S = 5400  # tests/lab_rings' bound: four guests share the 2 host cores under TCG
MODEL = "glm-5.3-flash"  # served_model_name's default (the lab keeps it)
PAIR_HEADER = "X-Sparkrig-Pair"  # the front names the pair that served (sparkrig/endpoint.py)


def lab_state() -> dict[str, Any]:
    state: dict[str, Any] = json.loads(STATE.read_text())
    return state


@dataclass
class PairsLab:
    """The running lab of pairs: its guests in `lab up`'s order (pair_a's head first)."""

    guests: list[Guest]

    @property
    def heads(self) -> list[Guest]:
        return [g for g in self.guests if g.role == "head"]

    @property
    def names(self) -> list[str]:
        """The pairs' names, in the order of their heads."""
        return [g.pair for g in self.heads]

    def pair(self, name: str) -> Lab:
        """One pair as tests/lab's ``Lab`` (its head first), for that suite's helpers."""
        return Lab([g for g in self.guests if g.pair == name])

    def guest(self, name: str) -> Guest:
        return next(g for g in self.guests if g.name == name)

    def api_url(self, head: Guest) -> str:
        """The head's API from the control machine: its loopback forward (`lab up`)."""
        return f"https://127.0.0.1:{lab_state()['api_forward_ports'][head.name]}"

    @property
    def api_urls(self) -> list[str]:
        return [self.api_url(h) for h in self.heads]


@pytest.fixture(scope="session")
def pairs() -> Iterator[PairsLab]:
    if os.environ.get("SPARKRIG_LAB") != "1" or PAIRS != 2:
        pytest.skip("the two-pair lab is opt-in: SPARKRIG_LAB=1 SPARKRIG_PAIRS=2 (make lab-pairs)")
    state = json.loads(STATE.read_text()) if STATE.exists() else {}
    reuse = KEEP and state.get("status") == "up" and state.get("pairs") == PAIRS
    try:
        if not reuse:
            lab_cli("up", "--pairs", str(PAIRS))
        yield PairsLab(guests(lab_state()))
    finally:
        if not KEEP:
            lab_cli("down", timeout=300)


def deploy(*args: str, timeout: float = DEPLOY_TIMEOUT_S) -> Deploy:
    """``pyinfra -y lab/inventory.py deploy.py ARGS...`` (e.g. ``--limit pair_b``, ``--data
    stack=...``, ``--json``)."""
    return pyinfra("-y", INV, "deploy.py", *args, timeout=timeout)


def dry(*args: str, timeout: float = DEPLOY_TIMEOUT_S) -> tuple[list[str], Deploy]:
    """What the next run would change: ``host: operation`` for every unconditional change of
    ``pyinfra --dry --json`` (an ``_if``-gated operation is always listed as conditional: see
    bench/chaos/pyinfra_output.py), and the run."""
    r = pyinfra("--dry", "--json", INV, "deploy.py", *args, timeout=timeout)
    assert r.rc == 0, r.output[-6000:]
    return planned(r.stdout), r


def ssh(host: str, cmd: str, check: bool = True, timeout: float = 120) -> str:
    """Run ``cmd`` as root on the lab guest named ``host``; return its stdout."""
    guest = next(g for g in guests(lab_state()) if g.name == host)
    return guest.sh(cmd, check=check, timeout=timeout)


def sparkrig(*args: str, timeout: float = DEPLOY_TIMEOUT_S) -> Deploy:
    """``python3 -m sparkrig ARGS...`` from the project root (e.g. ``roll lab/inventory.py``)."""
    start = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-m", "sparkrig", *args], cwd=REPO, capture_output=True, text=True,
        timeout=timeout, check=False, env={**os.environ, "PYINFRA_PROGRESS": "off"},
    )  # fmt: skip
    seconds = time.monotonic() - start
    print(f"sparkrig {' '.join(args)}: rc {out.returncode} in {seconds:.0f} s")
    return Deploy(out.returncode, out.stdout + out.stderr, seconds, out.stdout)


@dataclass
class Request:
    """One request of a ``SteadyClient``: monotonic start and end, the HTTP status (0: none
    came) and the error ("" when the answer was a 200 with a completion)."""

    url: str
    start: float
    end: float
    status: int
    error: str = ""
    pair: str = ""  # the X-Sparkrig-Pair the answer carried

    @property
    def ok(self) -> bool:
        return self.status == 200 and not self.error


def chat_body(max_tokens: int) -> bytes:
    return json.dumps(
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "17*23"}],
            "max_tokens": max_tokens,
            "stream": False,
        }
    ).encode()


def ask(url: str, body: bytes, timeout: float, key: str | None = None) -> Request:
    """One POST /v1/chat/completions to ``url`` (https://host:port), the certificate verified
    against the endpoint's CA (<api_tls_dir>/ca.crt), the control machine's API key sent."""
    key = control_api_key().read_text().strip() if key is None else key
    where = urlsplit(url)
    start = time.monotonic()
    status, error, pair = 0, "", ""
    conn = http.client.HTTPSConnection(
        where.hostname or "127.0.0.1",
        where.port or 443,
        timeout=timeout,
        context=ssl.create_default_context(cafile=str(CONTROL_CA)),
    )
    try:
        conn.request(
            "POST",
            "/v1/chat/completions",
            body=body,
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"},
        )
        resp = conn.getresponse()
        data = resp.read()
        status, pair = resp.status, resp.getheader(PAIR_HEADER, "") or ""
        if status != 200:
            error = f"HTTP {status}: {data[:200]!r}"
        else:
            doc = json.loads(data)
            if not (isinstance(doc, dict) and doc.get("choices")):
                error = f"no choices: {data[:200]!r}"
    except (OSError, http.client.HTTPException, ValueError) as e:
        error = f"{type(e).__name__}: {e}"
    finally:
        conn.close()
    return Request(url, start, time.monotonic(), status, error, pair)


@dataclass
class SteadyClient:
    """``threads`` clients, each sending one non-streaming completion after the other to
    ``urls`` (thread i starts at url i and goes round them), ``pause_s`` between two of its
    requests, from entering the block until leaving it; every request recorded::

        with SteadyClient(pairs.api_urls) as client:
            ...  # a roll, a kill
        assert client.failed == 0 and client.ok > 0, client.summary()
    """

    urls: Sequence[str]
    threads: int = 4
    max_tokens: int = 8
    timeout_s: float = 120
    pause_s: float = 0.2
    requests: list[Request] = field(default_factory=list)
    started: float = 0.0
    stopped: float = 0.0
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _workers: list[threading.Thread] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        if not self.urls:
            raise ValueError("SteadyClient: no URL to ask")

    def _loop(self, n: int) -> None:
        key = control_api_key().read_text().strip()
        body = chat_body(self.max_tokens)
        i = n
        while not self._stop.is_set():
            req = ask(self.urls[i % len(self.urls)], body, self.timeout_s, key)
            with self._lock:
                self.requests.append(req)
            i += 1
            self._stop.wait(self.pause_s)

    def __enter__(self) -> SteadyClient:
        self.started = time.monotonic()
        for n in range(self.threads):
            t = threading.Thread(target=self._loop, args=(n,), name=f"steady-{n}", daemon=True)
            self._workers.append(t)
            t.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        for t in self._workers:
            t.join(self.timeout_s + 30)  # a request in flight finishes (or times out) first
        self.stopped = time.monotonic()
        summary = self.summary()
        summary["failures"] = summary["failures"][:3]  # the rest in summary()
        print(f"steady client: {json.dumps(summary)}")

    def done(self) -> list[Request]:
        with self._lock:
            return list(self.requests)

    @property
    def ok(self) -> int:
        return sum(r.ok for r in self.done())

    @property
    def failed(self) -> int:
        return sum(not r.ok for r in self.done())

    def served_by(self) -> dict[str, int]:
        """Answers per pair (the front's X-Sparkrig-Pair; "" when the answer named none)."""
        out: dict[str, int] = {}
        for r in self.done():
            if r.ok:
                out[r.pair] = out.get(r.pair, 0) + 1
        return dict(sorted(out.items()))

    def summary(self) -> dict[str, Any]:
        """requests, ok, failed, seconds, latency (median, max), answers per URL and per pair,
        and the first failures (seconds from the start, URL, status, error)."""
        done = self.done()
        end = self.stopped or time.monotonic()
        latencies = [r.end - r.start for r in done if r.ok]
        per_url: dict[str, dict[str, int]] = {}
        for r in done:
            tally = per_url.setdefault(r.url, {"ok": 0, "failed": 0})
            tally["ok" if r.ok else "failed"] += 1
        return {
            "requests": len(done),
            "ok": sum(r.ok for r in done),
            "failed": sum(not r.ok for r in done),
            "seconds": round(end - self.started, 1) if self.started else 0.0,
            "threads": self.threads,
            "latency_median_s": round(statistics.median(latencies), 3) if latencies else None,
            "latency_max_s": round(max(latencies), 3) if latencies else None,
            "per_url": per_url,
            "served_by": self.served_by(),
            "failures": [
                {**asdict(r), "start": round(r.start - self.started, 1),
                 "end": round(r.end - self.started, 1)}
                for r in done if not r.ok
            ][:20],
        }  # fmt: skip


def record_figures(name: str, **figures: Any) -> Path | None:
    """With SPARKRIG_PAIRS_FIGURES=1, write ``figures`` (a client's summary, run times) to
    bench/results/pairs-lab/<name>.json, with the commit and the time; else nothing."""
    if not FIGURES:
        return None
    FIGURES_DIR.mkdir(parents=True, exist_ok=True)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    out = FIGURES_DIR / f"{name}.json"
    doc = {"test": name, "commit": commit, "at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
           "pairs": PAIRS, **figures}  # fmt: skip
    out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"figures: {out}")
    return out
