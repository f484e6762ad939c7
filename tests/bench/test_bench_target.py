"""`python3 -m sparkrig.bench --inventory`: the head's API as the deploy made it, read by the
deploy's own settings in a child process (pyinfra's CLI gevent-patches the process it loads in)."""

from __future__ import annotations

import sys

import pytest
from bench_helpers import REPO

from sparkrig.bench import target


def test_the_inventory_gives_the_heads_url_model_profile_stack_and_key_file() -> None:
    t = target.read("inventory.py", REPO)  # profile shared: MTP, no drafter lockfile
    assert t == {"stack": "vllm-nvfp4", "url": "https://spark-a.local:8000",
                 "model": "glm-5.3-flash", "profile": "shared",
                 "api_key_file": ".sparkrig/api-key", "ca_file": ".sparkrig/tls/ca.crt",
                 "nnodes": 2, "drafter_lock": None}  # fmt: skip
    assert "gevent" not in sys.modules or not __import__("gevent.monkey").monkey.is_module_patched(
        "socket"
    )  # this process stays unpatched


def test_a_bad_inventory_is_named() -> None:
    with pytest.raises(SystemExit, match="cannot read the inventory nope.py"):
        target.read("nope.py", REPO)


def test_the_inventory_names_the_stack_it_deploys(tmp_path) -> None:
    """An inventory whose hosts serve entrpi-exl3 (over group_data's default): the bench records
    that stack, so its result is judged against entrpi-exl3's figures; --stack still wins."""
    from sparkrig.bench.__main__ import measured_stack

    text = (
        (REPO / "inventory.py")
        .read_text()
        .replace(
            '"fabric_interface": "enp1s0f1np1",',
            '"stack": "entrpi-exl3", "drafter_license_accepted": True, '
            '"fabric_interface": "enp1s0f1np1",',
        )
    )
    assert text.count('"stack": "entrpi-exl3"') == 2  # both hosts
    (tmp_path / "inv.py").write_text(text)
    t = target.read(str(tmp_path / "inv.py"), REPO)
    assert t["stack"] == "entrpi-exl3" and t["profile"] == "single"
    # its profile loads the MXFP8 drafter: the bench records that lockfile's digest
    assert t["drafter_lock"] == "locks/local-inference-lab--GLM-5.3-Flash-DFlash2-MXFP8.lock.json"
    assert measured_stack(None, t) == "entrpi-exl3"
    assert measured_stack("sfxnz-v13", t) == "sfxnz-v13"
    assert measured_stack(None, {}) == "vllm-nvfp4"
