"""`python3 -m sparkrig.bench --inventory`: the head's API as the deploy made it, read by the
deploy's own settings in a child process (pyinfra's CLI gevent-patches the process it loads in)."""

from __future__ import annotations

import sys

import pytest
from bench_helpers import REPO

from sparkrig.bench import target


def test_the_inventory_gives_the_heads_url_model_profile_stack_and_key_file() -> None:
    t = target.read("inventory.py", REPO)
    assert t == {"url": "http://spark-a.local:8000", "model": "glm-5.3-flash",
                 "profile": "shared", "stack": "vllm-nvfp4",
                 "api_key_file": ".sparkrig/api-key"}  # fmt: skip
    assert "gevent" not in sys.modules or not __import__("gevent.monkey").monkey.is_module_patched(
        "socket"
    )  # this process stays unpatched


def test_a_bad_inventory_is_named() -> None:
    with pytest.raises(SystemExit, match="cannot read the inventory nope.py"):
        target.read("nope.py", REPO)
