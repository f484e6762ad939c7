from __future__ import annotations

import runpy
from pathlib import Path
from typing import Any

import pytest

from sparkrig.config.inventory import InventoryView

ROOT = Path(__file__).resolve().parents[2]
DIGEST = "registry.example/vllm@sha256:" + "ab" * 32


def knob_defaults() -> dict[str, Any]:
    """group_data/all.py as pyinfra loads it (module-level names, imports and dunders aside)."""
    data = runpy.run_path(str(ROOT / "group_data/all.py"))
    return {k: v for k, v in data.items() if not k.startswith("__")}


def cluster(n: int = 2, **knobs: Any) -> InventoryView:
    """A valid n-node inventory view; knobs override group data on every host. Its fabric is
    one netdev per rank (fabric_layout "single"), whatever the default: the layout's own
    tests (test_settings_layout.py) name theirs."""
    base = {**knob_defaults(), "fabric_layout": "single", "base_image": DIGEST, **knobs}
    hosts = [
        (
            f"spark-{i}",
            {
                **base,
                "fabric_interface": "enp1s0f1np1",
                "fabric_address": f"192.168.100.{10 + i}/24",
            },
        )
        for i in range(n)
    ]
    return InventoryView({"head": hosts[:1], "worker": hosts[1:]})


@pytest.fixture
def defaults() -> dict[str, Any]:
    return knob_defaults()
