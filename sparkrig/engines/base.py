"""What an engine family gives the deploy: one shape for every family, so that the layers above
(settings, serving, fabric) ask the stack's engine and never test ``Stack.family`` themselves.

An engine is a value with these attributes and methods (``Engine``); ``sparkrig.engines`` keeps
them by family name (``ENGINES``) and finds a stack's (``engine_of``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from sparkrig import topology
from sparkrig.stacks.base import Stack


@dataclass(frozen=True)
class ServeRequest:
    """What a rank's serve argv is made of, whatever the engine: rank ``rank`` of ``nnodes``
    meeting at ``master_addr:master_port``, rank 0's API on loopback ``engine_port``."""

    rank: int
    nnodes: int
    master_addr: str
    master_port: int
    model_dir: str
    engine_port: int
    served_name: str
    drafter_dir: str | None
    extra_args: Sequence[str]
    thinking: bool | None

    def fields(self) -> dict[str, Any]:
        """The request as keyword arguments (the engines' module-level ``serve_args``)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


class Engine(Protocol):
    """One engine family: what its ranks run, how it meets, where it refuses to run."""

    @property
    def family(self) -> str:
        """The ``Stack.family`` value it serves."""
        ...

    @property
    def progress_parser(self) -> str:
        """The watchdog's progress reader (a key of the host package's ``wedge.PARSERS``) for a
        stack that declares none."""
        ...

    def run_flags(self, stack: Stack) -> list[str]:
        """The ``docker run`` options that end a rank's run options: the stack's own, if the
        family passes them, and ``--entrypoint <the engine's program>``."""
        ...

    def serve_args(self, stack: Stack, profile: str, request: ServeRequest) -> list[str]:
        """One rank's argv, the entrypoint's program first (``ServeRequest`` says which rank,
        where the ranks meet and where rank 0's API listens)."""
        ...

    def rendezvous_port(self, stack: Stack, master_port: int) -> int:
        """The port the ranks meet on at the head's fabric address, given the knob master_port."""
        ...

    def topology_problem(self, stack: Stack, nnodes: int) -> str | None:
        """Why the engine cannot split the model over ``nnodes`` ranks whatever the stack
        declares (one sentence after ``stack: '<name>'``), or None."""
        ...

    def ring_refusal(self, stack: Stack) -> str:
        """Why the stack does not run on a triangle or a switchless ring (fabric_layout "ports",
        three ranks and more), for a stack that declares no such run."""
        ...

    def fabric_env_problems(
        self, stack: Stack, nnodes: int, fabric_env: Sequence[tuple[str, str]]
    ) -> list[str]:
        """What a rank's fabric env (``topology.fabric_env``) lacks for the stack on ``nnodes``
        ranks (``Stack.fabric_env_needs``); [] when it fits."""
        ...

    def graph_files(self, plan: topology.Plan, rank: int) -> Mapping[str, str]:
        """A ring rank's NCCL graph files by container path, for a plan that relays."""
        ...
