"""Helpers for the serving tests: load host-side programs from files/ and lab/ by path, run the
host package's remote commands from the checkout, and run the lab's engine stand-ins as
subprocesses (``Proc``; the ``procs`` fixture of tests/serving/conftest.py stops them)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from sparkrig.scripts import load_script

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # `sparkrig` is imported from the checkout, installed or not
    sys.path.insert(0, str(REPO))


load_path = load_script  # the same loader the control side uses


def files_module(name: str) -> ModuleType:
    return load_path(name, REPO / "files" / f"{name}.py")


def local_argv(argv: list[str]) -> list[str]:
    """A host package command (sparkrig/hostpkg.py) as this checkout runs it: this Python, the
    package in files/ (the argv must start with the package's invocation, whatever directory)."""
    from sparkrig import hostpkg

    assert argv[0] == hostpkg.PYTHON and argv[1].endswith("/lib/sparkhost"), argv
    return [sys.executable, str(hostpkg.SOURCE), *argv[2:]]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Proc:
    """A stand-in (``script``, e.g. lab/standin_vllm.py) run by this Python with ``argv``, its
    output collected line by line in the background; ``env`` is added to this process's."""

    def __init__(
        self, script: str | Path, argv: Sequence[str], env: dict[str, str] | None = None
    ) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self.p = subprocess.Popen(
            [sys.executable, str(script), *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        self.lines: list[str] = []
        self._t = threading.Thread(target=self._read, daemon=True)
        self._t.start()

    def _read(self) -> None:
        assert self.p.stdout is not None
        for line in self.p.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, text: str, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(text in ln for ln in self.lines):
                return
            if self.p.poll() is not None:
                time.sleep(0.2)
                if any(text in ln for ln in self.lines):
                    return
                raise AssertionError(f"exited {self.p.returncode} before {text!r}: {self.lines}")
            time.sleep(0.05)
        raise AssertionError(f"timed out waiting for {text!r}: {self.lines}")

    def exit_code(self, timeout: float = 15.0) -> int:
        rc = self.p.wait(timeout)
        self._t.join(5)
        return rc

    def stop(self) -> None:
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait(10)
