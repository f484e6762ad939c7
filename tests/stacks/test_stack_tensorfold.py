"""The `tensorfold` stack (issue 34): its declaration, every rank's `tensorfold serve` argv checked
against TensorFold's own flag list (lab/tensorfold-flags.txt, kept with its source), what reaches
the rank's container and unit, and what settings refuse."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pyinfra.api.exceptions import DeployError

from sparkrig.config.checks import COMMIT_RE, DIGEST_REF_RE
from sparkrig.config.inventory import build
from sparkrig.engines import tensorfold as family
from sparkrig.stacks import get
from tests.unit.conftest import cluster

REPO = Path(__file__).resolve().parents[2]
FLAGS_FILE = REPO / "lab" / "tensorfold-flags.txt"
RESEARCH_DIGEST = "bc34d7d63f978cf601f42863b284bc95a567c50c10e9adb0866a635be568bf5f"
STACK = get("tensorfold")
HEAD_IP = "192.168.100.10"


def known_flags() -> dict[str, int]:
    out: dict[str, int] = {}
    for line in FLAGS_FILE.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            flag, nargs = line.split()
            out[flag] = int(nargs)
    return out


KNOWN = known_flags()
CHOICES = {"--tp": {"1", "2"}, "--rank": {"0", "1"}}  # cli_args@0b3f3bbb, upstream choices


def argv(profile: str, rank: int, **kw) -> list[str]:
    drafter = "/w/drafter" if STACK.needs_drafter(profile) else None
    return family.serve_args(
        STACK, profile, rank=rank, nnodes=2, master_addr=HEAD_IP, model_dir="/w/model",
        drafter_dir=drafter, **kw,
    )  # fmt: skip


def value(args: list[str], flag: str) -> str | None:
    return args[args.index(flag) + 1] if flag in args else None


# --- the flag list ---------------------------------------------------------------------------


def test_the_flag_list_names_its_source_and_holds_the_serve_flags_the_recipe_uses() -> None:
    text = FLAGS_FILE.read_text()
    assert "cli_args.py@0b3f3bbb080a1ab5e90216c2fedb1288ef996717" in text
    used = ("--tp", "--rank", "--master", "--master-port", "--drafter", "--context", "--parallel",
            "--max-tokens", "--host", "--port", "--name", "--vision")  # fmt: skip
    for flag in used:
        assert flag in KNOWN, flag
    assert "--api-key" not in KNOWN  # TensorFold 0.6.0 has no key: the front holds it


# --- every rank's argv -----------------------------------------------------------------------


@pytest.mark.parametrize("profile", ["shared", "single"])
@pytest.mark.parametrize("rank", [0, 1])
def test_every_ranks_argv_uses_only_tensorfold_serves_own_flags(profile: str, rank: int) -> None:
    args = argv(profile, rank)
    assert args[:3] == ["tensorfold", "serve", "/w/model"]
    assert family.unknown_flags(args, KNOWN) == []
    for flag, allowed in CHOICES.items():
        assert value(args, flag) in allowed
    assert value(args, "--tp") == "2" and value(args, "--rank") == str(rank)
    assert value(args, "--master") == HEAD_IP and value(args, "--master-port") == "29551"


def test_unknown_flags_are_refused_as_argparse_would() -> None:
    # argparse's "unrecognized arguments: --api-key k": the value is not a known option's
    assert family.unknown_flags(argv("shared", 0, extra_args=["--api-key", "k"]), KNOWN) == [
        "--api-key",
        "k",
    ]
    # a vLLM flag by habit, and a stray second positional
    assert family.unknown_flags(argv("single", 1, extra_args=["--max-model-len=8"]), KNOWN) == [
        "--max-model-len"
    ]
    assert family.unknown_flags(["tensorfold", "serve", "/m", "/n"], KNOWN) == ["/n"]
    # values of known options are not mistaken for options
    assert family.unknown_flags(["serve", "/m", "--drafter", "none", "--port", "1"], KNOWN) == []


def test_rank_0_alone_binds_http_on_loopback_the_workers_never() -> None:
    head, worker = argv("shared", 0, engine_port=8123), argv("shared", 1, engine_port=8123)
    assert value(head, "--host") == "127.0.0.1" and value(head, "--port") == "8123"
    assert value(head, "--name") == "glm-5.3-flash"
    assert not set(family.HTTP_FLAGS) & set(worker)


def test_profiles_shared_loads_dflash2_single_is_mtp_one_request_at_a_time() -> None:
    shared, single = argv("shared", 1), argv("single", 1)
    assert value(shared, "--drafter") == "/w/drafter" and value(shared, "--parallel") == "4"
    assert value(single, "--drafter") == "none" and value(single, "--parallel") == "1"
    assert value(shared, "--context") == value(single, "--context") == "1048576"
    with pytest.raises(ValueError, match="needs the drafter directory"):
        family.serve_args(STACK, "shared", rank=0, nnodes=2, master_addr=HEAD_IP, model_dir="/m")


def test_the_adapter_refuses_what_tensorfold_would() -> None:
    with pytest.raises(ValueError, match="not tensorfold"):
        family.serve_args(get("vllm-nvfp4"), "shared", rank=0, nnodes=2, master_addr=HEAD_IP,
                          model_dir="/m")  # fmt: skip
    with pytest.raises(ValueError, match="IPv4"):
        family.serve_args(STACK, "single", rank=0, nnodes=2, master_addr="head", model_dir="/m")
    with pytest.raises(ValueError, match="rank must be"):
        family.serve_args(STACK, "single", rank=2, nnodes=2, master_addr=HEAD_IP, model_dir="/m")


# --- the declaration -------------------------------------------------------------------------


def test_the_declaration_pins_the_v1_10_image_and_the_recipes_weights() -> None:
    assert STACK.family == "tensorfold" and STACK.nodes == (2,)
    assert STACK.image is not None and DIGEST_REF_RE.match(STACK.image)
    assert STACK.image.endswith("@sha256:" + RESEARCH_DIGEST)
    assert "v0.6.0-a1897d591f70" in STACK.image_note and not STACK.patched
    for pin in (STACK.model, STACK.drafter):
        assert pin is not None and COMMIT_RE.match(pin.revision) and pin.why
    assert STACK.model.revision == "078455ffe6472f9a52fbc1139f58b9db2881b25c"
    assert STACK.drafter is not None
    assert STACK.drafter.revision == "bf582e4eacc1810f76656d1811693ff6c6737d2a"
    assert "CC BY-NC-ND" in STACK.drafter.license_note


def test_every_commit_and_digest_is_written_down_in_docs_stacks() -> None:
    docs = (REPO / "docs" / "stacks.md").read_text()
    source = Path(__file__).resolve().parents[2] / "sparkrig" / "stacks" / "tensorfold.py"
    named = set(re.findall(r"\b[0-9a-f]{40}\b|\b[0-9a-f]{64}\b", source.read_text()))
    assert named and not sorted(h for h in named if h not in docs)


def test_the_rank_env_health_memory_stop_and_figures() -> None:
    env = STACK.env
    assert env["TENSORFOLD_NO_UPDATE_CHECK"] == "1"
    assert env["NCCL_MIN_NCHANNELS"] == env["NCCL_MAX_NCHANNELS"] == "4"
    assert STACK.api_auth == "front" and STACK.master_port == 29551
    assert (STACK.progress_parser, STACK.progress_path) == ("tensorfold-health", "/health")
    assert (STACK.memory.measure, STACK.memory.floor_gib) == ("available", 110.0)
    assert STACK.stop_order == "together" and STACK.run_flags == ("--shm-size", "16g")
    assert list(STACK.caches) == ["/cache"]
    figures = {(f.name, f.protocol): f.value for f in STACK.figures}
    assert figures == {
        ("single_stream_tok_s", "miaai"): 60.4,
        ("decode_tok_s.4", "miaai"): 108.8,
        ("prefill_tok_s", "miaai"): 1952.0,
        ("prose_decode_tok_s", "seed004"): 35.8,
        ("prose_prefill_tok_s", "seed004"): 1342.0,
        ("code_low_decode_tok_s", "seed004"): 36.3,
        ("code_max_decode_tok_s", "seed004"): 44.6,
        ("code_prefill_tok_s", "seed004"): 1364.0,
        ("max_model_len", "seed004"): 1048576,
    }
    assert all(f.source in STACK.sources for f in STACK.figures)


# --- through settings: the rank's container, unit and refusals ------------------------------


def tf_cluster(n: int = 2, **knobs):
    return cluster(n, stack="tensorfold", base_image=None, **knobs)


def test_the_drafters_licence_needs_the_same_acceptance_and_single_needs_none() -> None:
    with pytest.raises(DeployError) as err:
        build(tf_cluster(profile=None))
    assert "incoai/GLM-5.3-Flash-DFlash2" in str(err.value)
    assert "drafter_license_accepted = True" in str(err.value)
    s = build(tf_cluster(profile=None, drafter_license_accepted=True))["spark-1"]
    assert s.knobs.profile == "shared" and s.needs_drafter
    single = build(tf_cluster(profile="single"))["spark-1"]
    assert not single.needs_drafter
    assert [a[0] for a in single.locked_artifacts] == ["model"]


def test_the_stack_serves_two_sparks_only() -> None:
    with pytest.raises(DeployError, match="'tensorfold' serves on 2 Sparks; the inventory has 3"):
        build(tf_cluster(3, profile="single"))


def test_the_ranks_container_gets_the_recipes_run_flags_and_no_vllm_key() -> None:
    from sparkrig.serving import docker_run_args, memory_gate_args, rank_serve_args

    settings = build(tf_cluster(profile="single"))
    head, worker = settings["spark-0"], settings["spark-1"]
    run = docker_run_args(head, head.image_ref)
    assert run[-2:] == ["--entrypoint", "tensorfold"]
    assert run[run.index("--shm-size") + 1] == "16g"
    assert "memlock=-1:-1" in run and "stack=67108864" in run
    assert not any("api_key" in a or "api-key" in a for a in run)  # the front holds the key
    volumes = [run[i + 1] for i, a in enumerate(run) if a == "--volume"]
    cache = [v for v in volumes if v.endswith(":/cache")]
    assert len(cache) == 1 and "miaai-lab" in cache[0]  # per image, on persistent disk
    for s in (head, worker):
        args = ["tensorfold", *rank_serve_args(s)]
        assert family.unknown_flags(args, KNOWN) == []
        assert value(args, "--master") == "192.168.100.10"
    assert "--host" in rank_serve_args(head) and "--host" not in rank_serve_args(worker)
    assert "--memfree-min-gib 110 --memory-measure available" in memory_gate_args(worker)


def test_the_watchdog_reads_tensorfolds_health_on_the_engines_loopback_port() -> None:
    from sparkrig.helperunits import watchdog_unit_context
    from sparkrig.render import render

    ctx = watchdog_unit_context(build(tf_cluster(profile="single"))["spark-0"])
    assert ctx["metrics_url"] == "http://127.0.0.1:8001/health"
    unit = render("sparkrig-watchdog.service.j2", **ctx)
    assert "--metrics-url http://127.0.0.1:8001/health --progress-parser tensorfold-health" in unit
    vllm_unit = render(
        "sparkrig-watchdog.service.j2", **watchdog_unit_context(build(cluster(2))["spark-0"])
    )
    assert "--progress-parser" not in vllm_unit  # the default stack's unit is unchanged


def test_preflight_memory_refusal_says_the_figures_and_spares_what_fits() -> None:
    from sparkrig.node import NodeReport
    from sparkrig.preflight import memory_problem

    s = build(tf_cluster(profile="single"))["spark-1"]
    small, spark = NodeReport(memtotal_kb=100 * 1024**2), NodeReport(memtotal_kb=119 * 1024**2)
    said = memory_problem(s, small)
    assert said is not None and "MemAvailable >= 110 GiB" in said and "100.0 GiB" in said
    assert memory_problem(s, spark) is None  # a DGX Spark's 128 GB holds it
    assert memory_problem(s, NodeReport()) is None  # MemTotal not read: nothing to say
    # the default stack's floor is derived from MemTotal: it always fits
    assert memory_problem(build(cluster(2))["spark-1"], small) is None
