"""The lab suite: boots the qemu lab once per session and always tears it down.

Opt-in with SPARKRIG_LAB=1 (`make lab-test`): it boots VMs under software emulation and takes tens
of minutes. SPARKRIG_LAB_KEEP=1 reuses a running lab and leaves it up (for iterating by hand)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STATE = ROOT / ".lab" / "state.json"
KEEP = os.environ.get("SPARKRIG_LAB_KEEP") == "1"


@dataclass
class Guest:
    name: str
    role: str
    port: int
    fabric_interface: str
    fabric_address: str
    key: str
    known_hosts: str
    user: str

    @property
    def ip(self) -> str:
        return self.fabric_address.split("/")[0]

    @property
    def container(self) -> str:
        """The rank's container: sparkrig-rank<rank>, lab-workerN being rank N (lab/vm.py)."""
        rank = 0 if self.role == "head" else int(self.name.removeprefix("lab-worker"))
        return f"sparkrig-rank{rank}"

    def ssh_argv(self, shared: bool = False) -> list[str]:
        """ssh to the guest; ``shared``: over one kept connection per guest (ssh's
        ControlMaster), since a new connection's key exchange costs 5-15 s under TCG. A shared
        connection to a guest that rebooted or went off is dropped within 20 s (ServerAlive)."""
        share = [
            "-o", "ControlMaster=auto", "-o", f"ControlPath=/tmp/sparkrig-lab-{self.port}-%C",
            "-o", "ControlPersist=60", "-o", "ServerAliveInterval=5",
            "-o", "ServerAliveCountMax=4",
        ] if shared else []  # fmt: skip
        return [
            "ssh", "-p", str(self.port), "-i", self.key,
            "-o", f"UserKnownHostsFile={self.known_hosts}", "-o", "StrictHostKeyChecking=yes",
            "-o", "BatchMode=yes", "-o", "ConnectTimeout=30", *share,
            f"{self.user}@127.0.0.1",
        ]  # fmt: skip

    def sh(self, command: str, check: bool = True, timeout: float = 120) -> str:
        """Run ``command`` as root on the guest over SSH; return stdout."""
        argv = [*self.ssh_argv(shared=True), "sudo sh -c " + shlex.quote(command)]
        out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
        if check and out.returncode != 0:
            raise AssertionError(
                f"{self.name}: {command!r} failed ({out.returncode}): {out.stderr}"
            )
        return out.stdout

    def unit_started(self, unit: str) -> str:
        """ActiveState and monotonic start time: changes exactly when the unit (re)starts."""
        return (
            self.sh(
                f"systemctl show -p ActiveState -p ActiveEnterTimestampMonotonic --value {unit}"
            )
            .replace("\n", " ")
            .strip()
        )


@dataclass
class Lab:
    guests: list[Guest]

    @property
    def head(self) -> Guest:
        return self.guests[0]

    @property
    def workers(self) -> list[Guest]:
        return self.guests[1:]


@dataclass
class Deploy:
    rc: int
    output: str  # stdout and stderr
    seconds: float
    stdout: str  # alone: with --json, the JSON document


def pyinfra(*args: str, timeout: float = 1800) -> Deploy:
    """The operator's command, against the lab inventory."""
    start = time.monotonic()
    out = subprocess.run(
        ["pyinfra", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env={**os.environ, "PYINFRA_PROGRESS": "off"},
    )
    seconds = time.monotonic() - start
    print(f"pyinfra {' '.join(args)}: rc {out.returncode} in {seconds:.0f} s")
    return Deploy(out.returncode, out.stdout + out.stderr, seconds, out.stdout)


def lab_cli(*args: str, timeout: float = 1500) -> None:
    subprocess.run([sys.executable, "-m", "lab", *args], cwd=ROOT, check=True, timeout=timeout)


@pytest.fixture(scope="session")
def lab() -> Iterator[Lab]:
    if os.environ.get("SPARKRIG_LAB") != "1":
        pytest.skip("the qemu lab suite is opt-in: SPARKRIG_LAB=1 (make lab-test)")
    reuse = KEEP and STATE.exists() and json.loads(STATE.read_text()).get("status") == "up"
    try:
        if not reuse:
            lab_cli("up")
        state = json.loads(STATE.read_text())
        guests = [
            Guest(
                name=h["name"],
                role=h["role"],
                port=h["ssh_port"],
                fabric_interface=h["fabric_interface"],
                fabric_address=h["fabric_address"],
                key=state["ssh_key"],
                known_hosts=state["known_hosts"],
                user=state["ssh_user"],
            )
            for h in state["hosts"]
        ]
        yield Lab(guests)
    finally:
        if not KEEP:
            lab_cli("down", timeout=300)
