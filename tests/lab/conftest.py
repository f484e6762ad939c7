"""The lab suite: boots the qemu lab once per session and always tears it down.

Opt-in with SPARKRIG_LAB=1 (`make lab-test`): it boots VMs under software emulation and takes tens
of minutes. SPARKRIG_LAB_KEEP=1 reuses a running lab and leaves it up (for iterating by hand)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

# the guests, the operator's command and the lab CLI are shared with bench/chaos: lab/guest.py
from lab.guest import (  # noqa: F401  (re-exported)
    Deploy,
    Guest,
    fabric_functions,
    guests,
    lab_cli,
    pyinfra,
)

ROOT = Path(__file__).resolve().parents[2]
STATE = ROOT / ".lab" / "state.json"
KEEP = os.environ.get("SPARKRIG_LAB_KEEP") == "1"


@dataclass
class Lab:
    guests: list[Guest]

    @property
    def head(self) -> Guest:
        return self.guests[0]

    @property
    def workers(self) -> list[Guest]:
        return self.guests[1:]

    @property
    def layout(self) -> str:
        """How `lab up` cabled the fabric (lab/fabric.py): "cable", "single" or "ports"."""
        return str(json.loads(STATE.read_text()).get("fabric_layout", "single"))

    def functions(self, guest: Guest) -> list[tuple[str, str, str]]:
        """(netdev, RDMA device, IPv4) of each fabric function (lab/guest.py)."""
        return fabric_functions(guest)

    def single_only(self) -> None:
        """Skip a test written against one netdev's pinned GID index (fabric_layout "single")
        on a lab cabled otherwise: `make lab-test SPARKRIG_LAB_FABRIC=single` runs it."""
        if self.layout != "single":
            pytest.skip(f"needs the single-NIC lab (this one is {self.layout!r})")


@pytest.fixture(scope="session")
def lab() -> Iterator[Lab]:
    if os.environ.get("SPARKRIG_LAB") != "1":
        pytest.skip("the qemu lab suite is opt-in: SPARKRIG_LAB=1 (make lab-test)")
    reuse = KEEP and STATE.exists() and json.loads(STATE.read_text()).get("status") == "up"
    try:
        if not reuse:
            fabric = os.environ.get("SPARKRIG_LAB_FABRIC")  # default: lab/fabric.default_layout
            lab_cli("up", *(["--fabric", fabric] if fabric else []))
        yield Lab(guests(json.loads(STATE.read_text())))
    finally:
        if not KEEP:
            lab_cli("down", timeout=300)
