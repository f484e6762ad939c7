"""The shipped inventory.py as the operator fills it, on fake Sparks: its hosts, groups and keys
kept as they are, each host answered by a fake node (bare, or what a test set in
fakehosts.STATE), with the lockfiles, base image and secrets the other plan inventories use."""

import runpy
from pathlib import Path
from typing import Any

from tests.plan.fakehosts import STATE, host

SHIPPED = runpy.run_path(str(Path(__file__).resolve().parents[2] / "inventory.py"))


def fake(name: str, data: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    ip, _, prefix = str(data["fabric_address"]).partition("/")
    return host(name, ip, int(prefix), responses=STATE.get(name), **data)


head = [fake(name, data) for name, data in SHIPPED["head"]]
worker = [fake(name, data) for name, data in SHIPPED["worker"]]
