"""The `tensorfold-ring` stack (issue 36, item 3): TensorFold's N-rank build on a triangle of three
and a switchless ring of four, at the declaration and plan level (the deploy's application:
tests/plan/test_rings_engine.py). Every rank's argv against TensorFold's flag list with the
N-rank build's choices, the start and stop order, the env by rank count, the engine's needs
against the fabric layer's env, the ring's graph files against MiaAI's generator's output, the
bench's figures by rank count, and what settings refuse (vLLM on three ranks among them)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkrig import fabricenv, topology
from sparkrig.bench import published
from sparkrig.config.checks import DIGEST_REF_RE
from sparkrig.config.inventory import build
from sparkrig.config.rules import not_applied
from sparkrig.engines import tensorfold as family
from sparkrig.serving import rank_serve_args
from sparkrig.stacks import STACKS, get
from tests.stacks.test_stack_tensorfold import CHOICES, HEAD_IP, KNOWN, value
from tests.unit.test_rings import ports_cluster, problems

RING = get("tensorfold-ring")
PAIR = get("tensorfold")
GRAPHS = Path(__file__).parent / "data" / "tensorfold-ring-graphs"
# shared/research/tensorfold.md section 1: the tp4 branch's image (config.sh@336811f8)
TP4_DIGEST = "eb17e092fa56ea23ca385c3aba0a4250d0cb46c705b9455f2e4c29d1ca4847e8"
# The N-rank build's `--tp`/`--rank` choices: upstream's cli_args@0b3f3bbb takes --tp 1 or 2
# (CHOICES); MiaAI's patches 0066-0068 allow 3 and 4 (shared/research/tensorfold.md "`tensorfold
# serve` CLI"; the recipe's nodes.sh@14a5e91c check_workers: "TP is 2, 3 or 4"). The patches
# themselves are not in the stored sources.
N_RANK_CHOICES = {"--tp": {"1", "2", "3", "4"}, "--rank": {"0", "1", "2", "3"}}


def argv(profile: str, rank: int, nnodes: int, stack=RING) -> list[str]:
    drafter = "/w/drafter" if stack.needs_drafter(profile) else None
    return family.serve_args(
        stack, profile, rank=rank, nnodes=nnodes, master_addr=HEAD_IP, model_dir="/w/model",
        drafter_dir=drafter,
    )  # fmt: skip


def plan(n: int) -> topology.Plan:
    ports = [{i: topology.dgx_os_default(i) for i in topology.PORTS} for _ in range(n)]
    return topology.derive(ports, "198.18.0.0/21")


def ring_cluster(n: int, **knobs):
    return ports_cluster(n, stack="tensorfold-ring", base_image=None, profile="single", **knobs)


# --- the declaration -------------------------------------------------------------------------


def test_the_ring_stack_pins_the_tp4_build_and_the_pairs_weights() -> None:
    assert RING.family == "tensorfold" and RING.nodes == (3, 4) and not RING.patched
    assert RING.image is not None and DIGEST_REF_RE.match(RING.image)
    assert RING.image.endswith("@sha256:" + TP4_DIGEST)
    assert "v0.6.0-7a37454d3238" in RING.image_note and "106 patches" in RING.image_note
    assert (RING.model, RING.drafter) == (PAIR.model, PAIR.drafter)  # one pair of lockfiles
    # the pair's stack is untouched: the released v1.10 image, two Sparks
    assert PAIR.nodes == (2,) and PAIR.image is not None and TP4_DIGEST not in PAIR.image
    assert RING.fabric_layouts == ("ports",) and PAIR.fabric_layouts == ()


def test_every_commit_and_digest_is_written_down_in_docs_stacks() -> None:
    docs = (Path(__file__).resolve().parents[2] / "docs" / "stacks.md").read_text()
    assert TP4_DIGEST in docs and "tensorfold-ring" in docs


# --- every rank's argv -----------------------------------------------------------------------


@pytest.mark.parametrize("profile", ["shared", "single"])
@pytest.mark.parametrize("nnodes", [3, 4])
def test_every_ranks_argv_uses_only_tensorfold_serves_flags_with_the_n_rank_choices(
    profile: str, nnodes: int
) -> None:
    for rank in range(nnodes):
        args = argv(profile, rank, nnodes)
        assert args[:3] == ["tensorfold", "serve", "/w/model"]
        assert family.unknown_flags(args, KNOWN) == []
        for flag, allowed in N_RANK_CHOICES.items():
            assert value(args, flag) in allowed
        assert value(args, "--tp") == str(nnodes) and value(args, "--rank") == str(rank)
        assert value(args, "--tp") not in CHOICES["--tp"]  # what upstream's CLI would refuse
        assert ("--host" in args) == (rank == 0)  # rank 0 alone opens HTTP
    assert value(argv("shared", 1, nnodes), "--parallel") == "8"  # CONFIG: 8 at TP != 2


def test_each_build_gets_only_the_tp_its_cli_takes() -> None:
    with pytest.raises(ValueError, match=r"'tensorfold' runs --tp 2 \(its build's CLI\), not 3"):
        argv("single", 0, 3, stack=PAIR)
    with pytest.raises(ValueError, match=r"'tensorfold-ring' runs --tp 3 or 4 .*, not 2"):
        argv("single", 0, 2)
    assert value(argv("single", 1, 2, stack=PAIR), "--tp") == "2"


# --- order and env by rank count -------------------------------------------------------------


def test_ranks_start_last_to_first_and_stop_together() -> None:
    assert RING.start_waves(4) == ((3,), (2,), (1,), (0,))
    assert RING.start_waves(3) == ((2,), (1,), (0,))
    assert RING.stop_order == "together"
    # every other stack keeps sparkrig's ordered start: the workers together, then rank 0
    assert PAIR.start_waves(2) == ((1,), (0,))
    assert get("vllm-nvfp4").start_waves(4) == ((1, 2, 3), (0,))


def test_the_env_by_rank_count() -> None:
    three, four = RING.at(3).env, RING.at(4).env
    assert three["TF_GLM_COMM"] == "nccl" and four["TF_GLM_COMM"] == "roce"
    for key in ("TF_GLM_PROMPT_OWN_FRONT", "TF_GLM_PROMPT_MICROBATCH", "TF_GLM_SIDE"):
        assert four[key] == "1" and key not in three
    assert three["TF_GLM_CACHE_GIB"] == four["TF_GLM_CACHE_GIB"] == "32"
    assert three["TENSORFOLD_NO_UPDATE_CHECK"] == "1"
    assert "NCCL_IB_GID_INDEX" not in three and "NCCL_IB_GID_INDEX" not in four
    assert all(s.at(2) is s for s in STACKS.values())  # no other stack changes by rank count


# --- the engine's fabric env, the ring's graph files ----------------------------------------


@pytest.mark.parametrize("nnodes", [3, 4])
def test_the_fabric_layers_env_holds_what_the_engine_needs_on_every_rank(nnodes: int) -> None:
    p = plan(nnodes)
    for rank in range(nnodes):
        env = fabricenv.fabric_env(p, rank)
        assert family.fabric_env_problems(RING, nnodes, env) == []
        d = dict(env)
        assert family.hca_devices(d["TF_ROCE_HCA"]) == list(p.ranks[rank].rdma_devices)
        assert family.hca_devices(d["NCCL_IB_HCA"]) == family.hca_devices(d["TF_ROCE_HCA"])
        for key in ("NCCL_CROSS_NIC", "NCCL_IB_SUBNET_AWARE_ROUTING", "NCCL_P2P_DISABLE",
                    "NCCL_SHM_DISABLE"):  # fmt: skip
            assert d[key] == "1"
        assert d["NCCL_MIN_NCHANNELS"] == d["NCCL_MAX_NCHANNELS"] == "4"
        assert "NCCL_IB_GID_INDEX" not in d
        ring = {"NCCL_ALGO": "Ring", "NCCL_IB_MERGE_NICS": "0", "TF_NCCL_RING": "1",
                "TF_ROCE_RING": "1"}  # fmt: skip
        assert all(d.get(k) == v for k, v in ring.items()) == (nnodes == 4)


def test_what_the_engine_cannot_run_on_is_named() -> None:
    env = fabricenv.fabric_env(plan(4), 1)
    pinned = [*env, ("NCCL_IB_GID_INDEX", "3")]
    assert family.fabric_env_problems(RING, 4, pinned) == [
        "NCCL_IB_GID_INDEX is pinned; the GID is chosen by value per device"
    ]
    other = [(k, "rocep1s0f0" if k == "TF_ROCE_HCA" else v) for k, v in env]
    assert "TF_ROCE_HCA 'rocep1s0f0' is not NCCL_IB_HCA's devices" in "".join(
        family.fabric_env_problems(RING, 4, other)
    )
    no_ring = [(k, v) for k, v in env if k != "NCCL_ALGO"]
    assert family.fabric_env_problems(RING, 4, no_ring) == [
        "NCCL_ALGO=Ring needed, the fabric env has None"
    ]
    # a triangle's env is no ring's
    triangle = fabricenv.fabric_env(plan(3), 1)
    assert "NCCL_GRAPH_FILE=/nccl-graph.xml needed" in "".join(
        family.fabric_env_problems(RING, 4, triangle)
    )


def test_the_rings_graph_files_are_what_miaais_generator_writes() -> None:
    p = plan(4)
    for rank in range(4):
        files = family.ring_graph_files(p, rank)
        assert list(files) == [fabricenv.GRAPH_FILE, *fabricenv.RING_GRAPHS]
        for path, name in zip(files, ("", "-link-prev", "-link-next"), strict=True):
            assert files[path] == (GRAPHS / f"rank{rank}{name}.xml").read_text(), (rank, path)
    with pytest.raises(ValueError, match="no ring"):
        family.ring_graph_files(plan(3), 0)


# --- the bench's figures by rank count --------------------------------------------------------


def test_the_bench_takes_the_figures_of_the_rank_count_measured() -> None:
    def figures(**result) -> dict[str, float]:
        found = published.figures_for({"stack": "tensorfold-ring", "profile": "shared", **result})
        return {f.figure: f.low for f in found}

    assert figures(nnodes=3) == {
        "single_stream_tok_s": 77.6, "decode_tok_s.4": 146.2, "decode_tok_s.8": 166.0,
        "prefill_tok_s": 2001.0,
    }  # fmt: skip
    assert figures(nnodes=4) == {
        "single_stream_tok_s": 95.2, "decode_tok_s.4": 163.3, "decode_tok_s.8": 222.4,
        "prefill_tok_s": 2569.0,
    }  # fmt: skip
    assert figures() == {}  # a result that says no rank count is judged by none of them
    assert all(f.source in RING.sources and f.nodes in (3, 4) for f in RING.figures)
    # the pair's figures name no rank count: a result on two ranks still gets them
    pair = published.figures_for({"stack": "tensorfold", "profile": "shared", "nnodes": 2})
    assert {f.figure: f.low for f in pair}["single_stream_tok_s"] == 60.4


# --- through settings -------------------------------------------------------------------------


@pytest.mark.parametrize("nnodes", [3, 4])
def test_settings_take_a_triangle_and_a_ring_and_the_deploy_applies_them(nnodes: int) -> None:
    settings = build(ring_cluster(nnodes))
    s = settings["spark-1"]
    assert s.stack.name == "tensorfold-ring" and s.image_ref.endswith(TP4_DIGEST)
    assert s.stack.env["TF_GLM_COMM"] == ("nccl" if nnodes == 3 else "roce")
    assert not_applied(settings) is None
    # every rank meets the head's rendezvous at its LAN address (TensorFold's TP>2 rule)
    for each in settings.values():
        args = " ".join(rank_serve_args(each))
        assert "--master 192.168.1.10 --master-port 29551" in args, args


def test_the_ring_stack_is_refused_on_two_sparks_and_off_the_ports_layout() -> None:
    text = problems(ports_cluster(2, stack="tensorfold-ring", base_image=None, profile="single"))
    assert "'tensorfold-ring' serves on 3 or 4 Sparks; the inventory has 2" in text
    from tests.unit.conftest import cluster

    text = problems(cluster(3, stack="tensorfold-ring", base_image=None, profile="single"))
    assert "fabric_layout: stack 'tensorfold-ring' runs on fabric_layout 'ports', not 'single'" in (
        text
    )
    text = problems(ports_cluster(3, stack="tensorfold", base_image=None, profile="single"))
    assert "'tensorfold' serves on 2 Sparks; the inventory has 3 (stack 'tensorfold-ring'" in text


@pytest.mark.parametrize("stack", sorted(n for n, s in STACKS.items() if s.family == "vllm"))
def test_every_vllm_stack_is_refused_on_three_ranks_naming_itself_and_the_heads(
    stack: str,
) -> None:
    text = problems(ports_cluster(3, stack=stack, drafter_license_accepted=True))
    assert (
        f"spark-0: stack: {stack!r} is vLLM tensor parallel over every rank, and GLM-5.3-Flash's "
        "64 attention heads are not divisible by 3"
    ) in text
    assert 'docs/rings.md "vLLM on three Sparks"' in text


def test_settings_refuse_a_rank_env_the_engine_cannot_run_with() -> None:
    # the whole plan's env fits (build took it above); the knob nccl_env over it does not
    text = problems(ring_cluster(3, nccl_env={"NCCL_P2P_DISABLE": "0"}))
    assert (
        "spark-2: rank 2's env for stack 'tensorfold-ring': NCCL_P2P_DISABLE=1 needed, the fabric "
        "env has '0' (set by the knob nccl_env)"
    ) in text
    assert text.count("NCCL_P2P_DISABLE=1 needed") == 3  # every rank, each named
