"""The stack layer's core (sparkrig/stacks): the registry, a declaration's profiles, and the vLLM
family adapter's argv built from a declaration."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest

from sparkrig.config.checks import PIN_KEYS
from sparkrig.engines import vllm
from sparkrig.stacks import DEFAULT_STACK, STACKS, get
from sparkrig.stacks.base import Profile
from sparkrig.stacks.vllm_nvfp4 import STACK as NVFP4

RANK = dict(nnodes=2, master_addr="192.168.100.10", master_port=29521, model_dir="/m")


def test_the_default_stack_is_declared_and_an_unknown_name_lists_the_declared_ones():
    assert DEFAULT_STACK == "vllm-nvfp4" and get(DEFAULT_STACK) is NVFP4
    assert all(name == stack.name for name, stack in STACKS.items())
    with pytest.raises(ValueError, match="unknown stack 'nope'; choose one of .*vllm-nvfp4"):
        get("nope")


def test_an_image_note_names_only_pin_keys_the_settings_take():
    """A note that tells the operator to set ``stack_pins[...]['image']`` sends them to a key the
    settings refuse (PIN_KEYS: base_image, ...)."""
    for stack in STACKS.values():
        named = re.findall(r"stack_pins\[[^]]+\]\[['\"](\w+)['\"]\]", stack.image_note)
        assert set(named) <= set(PIN_KEYS), (stack.name, named)


def test_the_default_stacks_image_and_pins_are_pinned():
    assert NVFP4.image and "@sha256:" in NVFP4.image and NVFP4.patched
    assert len(NVFP4.model.revision) == 40 and NVFP4.drafter is not None
    assert set(NVFP4.profiles) == {"single", "shared", "guard", "long"}
    assert all(f.source and f.profile in NVFP4.profiles for f in NVFP4.figures)


def test_the_family_puts_the_stacks_flags_where_they_belong():
    stack = replace(
        NVFP4,
        serve_flags=("--stack-flag", "1"),
        head_flags=("--chat-template", "/t.jinja"),
    )
    head = vllm.serve_args(stack, "shared", rank=0, **RANK)
    worker = vllm.serve_args(stack, "shared", rank=1, **RANK)
    for argv in (head, worker):
        # after the distributed flags, before the profile's numbers
        assert (
            argv.index("--master-port") < argv.index("--stack-flag") < argv.index("--max-model-len")
        )
    assert head.index("--chat-template") < head.index("--host")  # rank 0 alone
    assert "--chat-template" not in worker and worker[-1] == "--headless"


def test_a_profile_that_declares_only_its_speculation_adds_no_numbers():
    """A recipe whose limits live in its serve_flags declares the profile's speculation only."""
    single = Profile("single", speculative="dflash", num_speculative_tokens=7)
    stack = replace(
        NVFP4,
        profiles={"single": single},
        default_profile="",
        serve_flags=("--max-model-len", "327680"),
    )
    argv = vllm.serve_args(stack, "single", rank=0, drafter_dir="/d", **RANK)
    assert argv.count("--max-model-len") == 1 and "--max-num-seqs" not in argv
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    assert spec == {"method": "dflash", "model": "/d", "num_speculative_tokens": 7}
    assert stack.needs_drafter("single")
    with pytest.raises(ValueError, match="unknown profile 'shared' for stack 'vllm-nvfp4'"):
        vllm.serve_args(stack, "shared", rank=0, **RANK)


def test_the_vllm_adapter_refuses_another_family():
    with pytest.raises(ValueError, match="tensorfold family, not vllm"):
        vllm.serve_args(replace(NVFP4, family="tensorfold"), "shared", rank=0, **RANK)


def test_each_stack_stops_in_its_recipes_order() -> None:
    """vllm-nvfp4 keeps sparkrig's one-step stop; Entrpi ("always head down first") and sfxnz
    (stop.sh: the head's container, then the worker's) stop the head first."""
    from sparkrig.stacks import STACKS

    orders = {"vllm-nvfp4": "together", "entrpi-exl3": "head-first", "sfxnz-v13": "head-first"}
    assert {n: STACKS[n].stop_order for n in orders} == orders
