"""Least privilege on the lab (issue 35 item 6): the rank containers' capabilities and limits
from `docker inspect`, sparkrig's units' sandbox from `systemctl show`, and the pair still
serving under them. Runs on a converged lab; the lead runs it, never a helper session."""

from __future__ import annotations

import json

import pytest

from lab.guest import API_KEY, GATE_URL, SPARKHOST
from tests.lab.conftest import Lab

pytestmark = pytest.mark.lab


def inspect(guest) -> dict:
    return json.loads(guest.sh(f"docker inspect {guest.container}"))[0]["HostConfig"]


def test_rank_containers_hold_only_ipc_lock_no_new_privileges_and_a_pids_limit(lab: Lab):
    for guest in lab.guests:
        hc = inspect(guest)
        assert [c.upper().removeprefix("CAP_") for c in hc["CapDrop"]] == ["ALL"], hc["CapDrop"]
        assert [c.upper().removeprefix("CAP_") for c in hc["CapAdd"]] == ["IPC_LOCK"]
        assert "no-new-privileges" in (hc.get("SecurityOpt") or []), hc.get("SecurityOpt")
        assert hc["PidsLimit"] == 4096
        # what the engine's process actually holds: no NET_RAW, no CHOWN (CapEff of the
        # container's PID 1, read from the host: the image need not ship grep)
        pid = guest.sh(f"docker inspect --format '{{{{.State.Pid}}}}' {guest.container}").strip()
        eff = guest.sh(f"grep CapEff /proc/{pid}/status").split()[-1]
        assert int(eff, 16) == 1 << 14, eff  # CAP_IPC_LOCK is bit 14


def show(guest, unit: str, *props: str) -> dict[str, str]:
    out = guest.sh(f"systemctl show {unit} " + " ".join(f"-p {p}" for p in props))
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


HELPERS = {"head": ["sparkrig-pair", "sparkrig-supervisor"], "worker": ["sparkrig-pair",
           "sparkrig-agent"]}  # fmt: skip


def test_helper_units_run_sandboxed(lab: Lab):
    for guest in lab.guests:
        units = HELPERS["head" if guest is lab.head else "worker"]
        for unit in units:
            p = show(
                guest, unit, "NoNewPrivileges", "ProtectSystem", "PrivateTmp", "IPAddressDeny",
                "IPAddressAllow", "TasksMax", "LimitNOFILE", "RuntimeDirectoryPreserve",
                "CapabilityBoundingSet", "AmbientCapabilities", "PrivateDevices",
                "MemoryDenyWriteExecute", "ActiveState",
            )  # fmt: skip
            assert p["ActiveState"] == "active", (guest.name, unit, p)
            assert p["NoNewPrivileges"] == "yes" and p["PrivateTmp"] == "yes", (unit, p)
            assert p["ProtectSystem"] == "strict", (unit, p)
            deny = set(p["IPAddressDeny"].split())  # systemd's order varies by version
            assert deny in ({"0.0.0.0/0", "::/0"}, {"any"}), (unit, p)
            assert p["IPAddressAllow"].strip(), (unit, p)
            assert p["TasksMax"] == "256" and p["LimitNOFILE"] == "4096", (unit, p)
            assert p["RuntimeDirectoryPreserve"] == "yes", (unit, p)
            # no capability at all (the lab's ports are above 1024), yet the pair serves
            assert p["CapabilityBoundingSet"] == "" and p["AmbientCapabilities"] == "", (unit, p)
            assert p["PrivateDevices"] == "yes" and p["MemoryDenyWriteExecute"] == "yes", (unit, p)
        rank = show(
            guest, guest.unit if hasattr(guest, "unit") else "sparkrig-*", "NoNewPrivileges"
        )
        assert rank.get("NoNewPrivileges", "yes") == "yes"


def test_the_pair_serves_under_the_sandbox(lab: Lab):
    out = lab.head.sh(
        f"{SPARKHOST} gate gates {GATE_URL} --model glm-5.3-flash --api-key-file {API_KEY}"
    )
    gates = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert gates and all(g["ok"] for g in gates), gates
    # the beacons answer each other (their IP allow lists name the peers)
    for guest in lab.guests:
        journal = guest.sh("journalctl -u sparkrig-pair -n 50 --no-pager")
        assert "Permission denied" not in journal and "Read-only file system" not in journal
