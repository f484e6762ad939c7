"""The running lab's guests as the control machine sees them: SSH to a guest, the operator's
pyinfra command, and the few reads the lab suite (tests/lab) and the chaos campaign (bench/chaos)
both make: the RoCE GID table, the pair's serving probe.

Everything here needs a lab that `python3 -m lab up` started (.lab/state.json)."""

from __future__ import annotations

import ipaddress
import json
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lab import REPO, STATE_FILE

API_KEY = "/etc/sparkrig/api-key"  # api_auth is on by default: the head's key file
# the front serves HTTPS by default: the pair's CA the deploy installs for the head's gates
API_CA = "/etc/sparkrig/api-ca.crt"
HEAD_API = "https://127.0.0.1:8000"  # the head's front from the head itself
CURL = f"curl --cacert {API_CA}"  # curl on the head, the front's certificate verified
GATE_URL = f"--url {HEAD_API} --ca-file {API_CA}"  # sparkhost gate's way to the front
CONTROL_CA = REPO / ".sparkrig" / "tls" / "ca.crt"  # the pair's CA as clients get it (api_tls_dir)
SPARKHOST = "/usr/bin/python3 /opt/sparkrig/lib/sparkhost"  # runs each job (sparkrig/hostpkg.py)


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
    pair: str = ""  # `lab up --pairs P`: the guest's pair ("pair_a", ...); "": one cluster

    @property
    def ip(self) -> str:
        return self.fabric_address.split("/")[0]

    @property
    def container(self) -> str:
        """The rank's container: sparkrig-rank<rank>, lab-workerN being rank N (lab/vm.py); in a
        lab of pairs each pair's worker is its rank 1 (lab-worker2 is pair_b's)."""
        if self.pair:
            return f"sparkrig-rank{0 if self.role == 'head' else 1}"
        rank = 0 if self.role == "head" else int(self.name.removeprefix("lab-worker"))
        return f"sparkrig-rank{rank}"

    @property
    def rank_unit(self) -> str:
        return "sparkrig-head" if self.role == "head" else "sparkrig-worker"

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
        out = self.run(command, timeout=timeout)
        if check and out.returncode != 0:
            raise AssertionError(
                f"{self.name}: {command!r} failed ({out.returncode}): {out.stderr}"
            )
        return out.stdout

    def run(self, command: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """Run ``command`` as root on the guest over SSH, whatever its exit status."""
        argv = [*self.ssh_argv(shared=True), "sudo sh -c " + shlex.quote(command)]
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)

    def unit_started(self, unit: str) -> str:
        """ActiveState and monotonic start time: changes exactly when the unit (re)starts."""
        return (
            self.sh(
                f"systemctl show -p ActiveState -p ActiveEnterTimestampMonotonic --value {unit}"
            )
            .replace("\n", " ")
            .strip()
        )


def lab_state() -> dict[str, Any]:
    state: dict[str, Any] = json.loads(STATE_FILE.read_text())
    return state


def guests(state: dict[str, Any] | None = None) -> list[Guest]:
    """The lab's guests, head first (the order `lab up` gave them)."""
    state = state or lab_state()
    return [
        Guest(
            name=h["name"],
            role=h["role"],
            port=h["ssh_port"],
            fabric_interface=h["fabric_interface"],
            fabric_address=h["fabric_address"],
            key=state["ssh_key"],
            known_hosts=state["known_hosts"],
            user=state["ssh_user"],
            pair=str(h.get("pair", "")),
        )
        for h in state["hosts"]
    ]


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
        cwd=REPO,
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
    subprocess.run([sys.executable, "-m", "lab", *args], cwd=REPO, check=True, timeout=timeout)


def fabric_functions(
    guest: Guest, state: dict[str, Any] | None = None
) -> list[tuple[str, str, str]]:
    """(netdev, RDMA device, IPv4) of each fabric function the deploy addresses on ``guest``:
    its one NIC (``lab up --fabric single``), or on the default pair lab (``cable``) the typed
    primary and its twin, the same host number on the buddy subnet (fabric_layout "auto",
    sparkrig/topology.py ``typed_links``)."""
    from sparkrig.topology import buddy_address

    state = state or lab_state()
    host = next(h for h in state["hosts"] if h["name"] == guest.name)
    nics = host.get("fabric_nics") or []
    if host.get("fabric_layout", "single") != "cable" or len(nics) < 2:
        return [(guest.fabric_interface, str(host["roce_device"]), guest.ip)]
    twin = str(buddy_address(ipaddress.IPv4Interface(guest.fabric_address)).ip)
    return [
        (nics[0]["netdev"], nics[0]["rdma"], guest.ip),
        (nics[1]["netdev"], nics[1]["rdma"], twin),
    ]


def gid_table(guest: Guest) -> list[Any]:
    """The guest's own GID table, read the way the fact reads it (one grep)."""
    from sparkrig.fabricfacts import RoceGids

    table: list[Any] = RoceGids().process(guest.sh(RoceGids().command()).splitlines())
    return table


def gid_index_for(guest: Guest, ip: str) -> int:
    """The guest's own RoCE v2 index for ::ffff:<ip>."""
    table = gid_table(guest)
    a, b, c, d = (int(x) for x in ip.split("."))
    want = f"0000:0000:0000:0000:0000:ffff:{a:02x}{b:02x}:{c:02x}{d:02x}"
    found = [e.index for e in table if e.gid == want and e.type == "RoCE v2"]
    assert len(found) == 1, f"RoCE v2 entries for {ip}: {found}\n{table}"
    return int(found[0])


def serving(head: Guest) -> bool:
    """The head's API answers a completion (the gates' own probe, with the head's key)."""
    out = head.sh(
        f"{SPARKHOST} gate probe {GATE_URL} "
        f"--model glm-5.3-flash --timeout 10 --api-key-file {API_KEY} >/dev/null 2>&1 "
        "&& echo ok || true",
        check=False,
    )
    return out.strip() == "ok"


def control_api_key() -> Path:
    """The control machine's copy of the head's API key (api_key_file's default)."""
    return REPO / ".sparkrig" / "api-key"
