"""Fixtures for the weights pipeline tests: generated repos, an in-process fakehub on loopback,
and helpers to run the fetcher as a subprocess (as the deploy does)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from lab import fakehub  # noqa: E402
from sparkrig import lockfile  # noqa: E402

FETCH = str(ROOT / "files" / "sparkhost")  # the host package: `python3 FETCH fetch ...`
FAKEHUB = str(ROOT / "lab" / "fakehub.py")


@pytest.fixture(scope="session")
def hub_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hub")
    fakehub.generate_repos(str(root))
    return root


class Hub:
    def __init__(
        self,
        root: Path,
        token: str | None = None,
        cdn: bool = True,
        page: int = 0,
        tls: tuple[str, str] | None = None,
    ):
        self.state = fakehub.HubState(str(root), page or None, token, None)
        servers = fakehub.make_servers(
            self.state, ("127.0.0.1", 0), ("127.0.0.1", 0) if cdn else None
        )
        self.servers = servers
        scheme, host = ("https", "localhost") if tls else ("http", "127.0.0.1")
        if tls:
            fakehub.enable_tls(servers, *tls)
        self.url = f"{scheme}://{host}:{servers[0].server_address[1]}"
        if cdn:
            self.state.cdn = f"{scheme}://{host}:{servers[1].server_address[1]}"
        for s in servers:
            threading.Thread(target=s.serve_forever, daemon=True).start()

    def close(self) -> None:
        for s in self.servers:
            s.shutdown()
            s.server_close()

    def fault(self, **f: Any) -> None:
        with self.state.lock:
            self.state.faults.append(f)

    def clear(self) -> None:
        with self.state.lock:
            self.state.faults.clear()
            self.state.log.clear()

    def log(self) -> list[dict[str, Any]]:
        with self.state.lock:
            return list(self.state.log)


@pytest.fixture
def hub(hub_root: Path) -> Iterator[Hub]:
    h = Hub(hub_root)
    yield h
    h.close()


@pytest.fixture(scope="session")
def model_lock(hub_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The model lockfile, made through the real huggingface_hub client."""
    h = Hub(hub_root, page=3)
    try:
        lock = lockfile.build_lock(fakehub.MODEL_REPO, "main", h.url)
    finally:
        h.close()
    out = tmp_path_factory.mktemp("locks") / "tiny-model.lock.json"
    lockfile.write(lock, str(out))
    return out


def run_fetch(*args: str, timeout: float = 120, **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, FETCH, *args], capture_output=True, text=True, timeout=timeout, **kw
    )


def lock_files(lock: Path) -> list[dict[str, Any]]:
    return list(json.loads(lock.read_text())["files"])


def http_json(url: str, data: Any = None, method: str | None = None) -> Any:
    body = json.dumps(data).encode() if data is not None else None
    req = urllib.request.Request(url, data=body, method=method)
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def needs_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root")


def poll(ready: Callable[[], bool], what: str, timeout: float = 60) -> None:
    """Wait for a condition the test can observe (generous bound; never a fixed sleep)."""
    deadline = time.monotonic() + timeout
    while not ready():
        assert time.monotonic() < deadline, f"timed out waiting for: {what}"
        time.sleep(0.05)


def parts_in_flight(dest: Path) -> list[Path]:
    return [p for p in dest.rglob("*.part") if p.stat().st_size > 0] if dest.exists() else []
