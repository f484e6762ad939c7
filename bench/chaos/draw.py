"""Seed -> fault sequence. Everything a campaign picks comes from one ``random.Random(seed)``
drawn in a fixed order, so ``--seed S`` replays a campaign exactly (same faults, same nodes, same
byte offsets, same kill moments), whatever machine or Python hash seed runs it.

The kinds come in rounds: each round is a shuffle of every kind allowed (``--only``), so 50 faults
from the 25-kind catalogue hit each kind twice, and a short sample still mixes kinds."""

from __future__ import annotations

import os
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from bench.chaos.catalogue import BY_KIND, CATALOGUE, WORK, Fault

KILL_AFTER_S = (5, 240)  # a SIGKILL moment, from the run's start (a lab run with work: 78-275 s)
CUT_AFTER_S = (5, 180)  # when a node's SSH is cut, from the run's start
CUT_FOR_S = (20, 90)  # how long the node's sshd stays away


@dataclass(frozen=True)
class Draw:
    index: int  # 1-based position in the campaign
    kind: str
    node: str  # "head" or "worker"
    params: dict[str, str] = field(default_factory=dict)

    @property
    def fault(self) -> Fault:
        return BY_KIND[self.kind]

    def describe(self) -> str:
        extra = " ".join(f"{k}={v}" for k, v in sorted(self.params.items()))
        return f"{self.index:>3}. {self.kind} on the {self.node}" + (f" ({extra})" if extra else "")


def new_seed() -> int:
    """A fresh seed, printed by the campaign so the run can be replayed."""
    return int.from_bytes(os.urandom(4), "big")


def kinds_allowed(only: Sequence[str] = ()) -> list[str]:
    """Catalogue order, filtered by ``--only`` (unknown kinds are an error)."""
    unknown = sorted(set(only) - set(BY_KIND))
    if unknown:
        raise ValueError(f"no such fault kind: {', '.join(unknown)} (see --list)")
    return [f.kind for f in CATALOGUE if not only or f.kind in only]


def plan(seed: int, faults: int, only: Sequence[str] = ()) -> list[Draw]:
    """The campaign's sequence for ``seed``: ``faults`` draws."""
    rng = random.Random(seed)
    kinds = kinds_allowed(only)
    draws: list[Draw] = []
    round_: list[str] = []
    while len(draws) < faults:
        if not round_:  # shuffled when needed, so N faults are the start of N+1 faults
            round_ = list(kinds)
            rng.shuffle(round_)
        draws.append(_draw(rng, len(draws) + 1, round_.pop(0)))
    return draws


def _draw(rng: random.Random, index: int, kind: str) -> Draw:
    fault = BY_KIND[kind]
    # every draw consumes the same number of values, so one kind's parameters never shift the
    # next draw's (a catalogue edit to one kind leaves the others' picks as they were)
    node_pick, frac, work_pick = rng.random(), rng.random(), rng.random()
    kill_after, cut_after, cut_for = rng.random(), rng.random(), rng.random()
    node = fault.target if fault.target != "any" else ("head" if node_pick < 0.5 else "worker")
    params: dict[str, str] = {}
    if "frac" in fault.params:
        params["frac"] = f"{0.02 + 0.96 * frac:.3f}"
    if "work" in fault.params:
        params["work"] = WORK[int(work_pick * len(WORK))]
    if "kill_after_s" in fault.params:
        params["kill_after_s"] = str(_within(KILL_AFTER_S, kill_after))
    if "cut_after_s" in fault.params:
        params["cut_after_s"] = str(_within(CUT_AFTER_S, cut_after))
    if "cut_for_s" in fault.params:
        params["cut_for_s"] = str(_within(CUT_FOR_S, cut_for))
    return Draw(index, kind, node, params)


# A run given the same work again lasts about as long as the one before it, give or take the
# lab's timing (seed 6031's fault 33: 160 s, then 143 s, so a cut moved to 148 s missed it).
RUN_AGAIN_SPAN = 0.8  # the part of the first run's length a moment is moved into


def moment_within(at: float, bounds: tuple[int, int], run_s: float) -> float:
    """The drawn moment ``at`` (seconds, within ``bounds``) moved into a run that lasted
    ``run_s``: the same point of that run's first ``RUN_AGAIN_SPAN`` as ``at`` is of the bounds'
    span from 0, so a run again that is somewhat quicker still has it."""
    return run_s * RUN_AGAIN_SPAN * at / (bounds[1] + 1)


def _within(bounds: tuple[int, int], x: float) -> int:
    low, high = bounds
    return low + int(x * (high - low + 1))
