"""The ring lab (issue 36): `python3 -m lab up --fabric ports --hosts N` (lab/fabric.py), booted
once for this directory's tests and always torn down. Its own directory and its own lab, since
tests/lab's session runs today's two-guest lab: `make lab-rings` (N: RING_HOSTS, default 3).

Opt-in with SPARKRIG_LAB=1, as tests/lab; SPARKRIG_LAB_KEEP=1 reuses a running ring lab."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import pytest

from lab.guest import guests, lab_cli
from tests.lab.conftest import KEEP, STATE, Lab

HOSTS = int(os.environ.get("SPARKRIG_RING_HOSTS", "3"))


@pytest.fixture(scope="session")
def ring() -> Iterator[Lab]:
    if os.environ.get("SPARKRIG_LAB") != "1":
        pytest.skip("the qemu lab suite is opt-in: SPARKRIG_LAB=1 (make lab-rings)")
    state = json.loads(STATE.read_text()) if STATE.exists() else {}
    reuse = (
        KEEP
        and state.get("status") == "up"
        and state.get("fabric_layout") == "ports"
        and len(state.get("hosts", [])) == HOSTS
    )
    try:
        if not reuse:
            lab_cli("up", "--fabric", "ports", "--hosts", str(HOSTS))
        yield Lab(guests(json.loads(STATE.read_text())))
    finally:
        if not KEEP:
            lab_cli("down", timeout=300)
