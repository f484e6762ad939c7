"""fabric_layout "ports" and the rank count through the real CLI against strict @fake hosts
(issue 36, docs/rings.md): what the inventory cannot serve or the deploy cannot converge yet is
refused before any command reaches a host (a pair's two functions are applied:
tests/plan/test_rings_pair.py; a triangle and a ring with stack tensorfold-ring:
tests/plan/test_rings_engine.py)."""

from __future__ import annotations

import pytest

from tests.plan.harness import run


@pytest.mark.parametrize(
    ("inventory", "message"),
    [
        (
            "tests/plan/inventory_three.py",
            "spark-a: stack: 'vllm-nvfp4' is vLLM tensor parallel over every rank, and "
            "GLM-5.3-Flash's 64 attention heads are not divisible by 3",
        ),
        (
            "tests/plan/rings/ring_four.py",
            "fabric_layout 'ports' with 4 ranks: stack 'vllm-nvfp4' does not run on a "
            "triangle or a switchless ring: stock NCCL dies in ncclTransportTreeConnect "
            "('unhandled system error') on a switchless ring of four and needs NCCL_ALGO=Ring "
            "with a patched NCCL (NCCL_SKIP_TREE_CONNECT), which no vLLM stack here ships "
            "(docs/rings.md; research rings.md [I2, S13]); use stack 'tensorfold-ring'",
        ),
        (
            "tests/plan/rings/ring_like_port_names.py",
            "inventory: fabric_layout 'ports': rank 2: netdev enP2p1s0f0np0, enp1s0f0np0 named "
            "twice",
        ),
    ],
)
def test_what_cannot_serve_or_converge_sends_no_command_to_any_host(
    monkeypatch, inventory, message
):
    r = run(["-y", inventory, "deploy.py"], monkeypatch)
    assert r.exit_code != 0
    assert message in str(r.exception) + r.output
    assert all(cmds == [] for cmds in r.commands.values()), r.commands
