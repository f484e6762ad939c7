"""A third engine family in this one file: registered here, with a stack of its own, it passes
settings and drives the rank's container and argv, with no edit anywhere else (what
sparkrig/engines/ promises: settings, serving and fabric ask the stack's engine, never its
family's name)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest
from pyinfra.api.exceptions import DeployError

from sparkrig import engines, topology
from sparkrig.config.inventory import build
from sparkrig.config.rules import not_applied
from sparkrig.engines import ENGINES, engine_of
from sparkrig.engines.base import ServeRequest
from sparkrig.helperunits import watchdog_unit_context
from sparkrig.paths import paths
from sparkrig.render import render
from sparkrig.serving import docker_run_args, rank_serve_args, rank_unit_context, rendezvous_port
from sparkrig.stacks import STACKS
from sparkrig.stacks.base import Pin, Profile, Stack
from tests.unit.conftest import cluster


class FakeFold:
    """An engine that serves with `fakefold run`, meets on its own port and halves the model
    (so it refuses an odd rank count)."""

    family = "fakefold"
    progress_parser = "vllm-metrics"

    def run_flags(self, stack: Stack) -> list[str]:
        return ["--shm-size", "1g", "--entrypoint", "fakefold"]

    def serve_args(self, stack: Stack, profile: str, request: ServeRequest) -> list[str]:
        r = request
        args = ["fakefold", "run", r.model_dir, f"--rank={r.rank}/{r.nnodes}"]
        args += [f"--meet={r.master_addr}:{r.master_port}", *stack.serve_flags]
        if r.rank == 0:
            args += [f"--listen=127.0.0.1:{r.engine_port}", f"--name={r.served_name}"]
        return [*args, *r.extra_args]

    def rendezvous_port(self, stack: Stack, master_port: int) -> int:
        return master_port + 100

    def topology_problem(self, stack: Stack, nnodes: int) -> str | None:
        return None if nnodes % 2 == 0 else f"halves the model: no {nnodes} ranks"

    def ring_refusal(self, stack: Stack) -> str:
        return "fakefold meets on no ring"

    def fabric_env_problems(
        self, stack: Stack, nnodes: int, fabric_env: Sequence[tuple[str, str]]
    ) -> list[str]:
        return []

    def graph_files(self, plan: topology.Plan, rank: int) -> Mapping[str, str]:
        raise ValueError("fakefold meets on no ring")


FAKE = Stack(
    name="fake-fold",
    family="fakefold",
    title="a third engine, in a test",
    image="registry.example/fakefold@sha256:" + "cd" * 32,
    image_note="made up",
    patched=False,
    model=Pin("example/GLM-5.3-Flash-fake", "0" * 40),
    drafter=None,
    env={"FAKEFOLD_QUIET": "1"},
    profiles={"shared": Profile("shared")},
    serve_flags=("--fold", "2"),
    api_auth="front",
)


@pytest.fixture
def fakefold(monkeypatch: pytest.MonkeyPatch) -> FakeFold:
    engine = FakeFold()
    monkeypatch.setitem(ENGINES, engine.family, engine)
    monkeypatch.setitem(STACKS, FAKE.name, FAKE)
    return engine


def fake_pair(n: int = 2):
    return build(cluster(n, stack=FAKE.name, profile=None, base_image=None))


def test_the_fake_engine_is_the_fake_stacks(fakefold: FakeFold) -> None:
    assert engine_of(FAKE) is fakefold
    assert engines.progress_parser(FAKE) == "vllm-metrics"


def test_settings_accept_a_pair_of_the_fake_engine(fakefold: FakeFold) -> None:
    settings = fake_pair()
    head = settings["spark-0"]
    assert head.stack.name == "fake-fold" and head.knobs.profile == "shared"
    assert not_applied(settings) is None


def test_the_rank_runs_the_fake_engines_entrypoint_and_argv(fakefold: FakeFold) -> None:
    settings = fake_pair()
    head, worker = settings["spark-0"], settings["spark-1"]
    port = head.knobs.master_port + 100  # the engine's own rendezvous rule
    assert rendezvous_port(head) == port
    run = docker_run_args(head, head.image_ref)
    assert run[-4:] == ["--shm-size", "1g", "--entrypoint", "fakefold"]
    assert rank_serve_args(head) == [
        "run", paths(head).model_dir, "--rank=0/2", f"--meet=192.168.100.10:{port}",
        "--fold", "2", f"--listen=127.0.0.1:{head.knobs.engine_port}",
        f"--name={head.knobs.served_model_name}",
    ]  # fmt: skip
    assert rank_serve_args(worker)[2:] == ["--rank=1/2", f"--meet=192.168.100.10:{port}",
                                           "--fold", "2"]  # fmt: skip
    unit = render("sparkrig-rank.service.j2", **rank_unit_context(head, head.image_ref, "w"))
    assert "--entrypoint fakefold" in unit and "--meet=192.168.100.10:" in unit
    assert "--progress-parser" not in render(
        "sparkrig-watchdog.service.j2", **watchdog_unit_context(head)
    )  # the engine's parser is the watchdog's default


def test_the_fake_engines_topology_rule_refuses_three_ranks(fakefold: FakeFold) -> None:
    with pytest.raises(DeployError, match="stack: 'fake-fold' halves the model: no 3 ranks"):
        fake_pair(3)
    assert set(fake_pair(4)) == {"spark-0", "spark-1", "spark-2", "spark-3"}


def test_an_unregistered_family_is_named() -> None:
    with pytest.raises(ValueError, match="'fakefold' family, which no engine serves"):
        engine_of(FAKE)


def test_every_declared_stack_has_an_engine() -> None:
    assert {engine_of(s).family for s in STACKS.values()} == {"vllm", "tensorfold"}
