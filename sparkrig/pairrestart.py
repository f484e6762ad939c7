"""Whether the whole pair restarts (in order): one decision for every host of the run, with its
triggers declared here."""

from __future__ import annotations

from typing import Any

from pyinfra.api.operation import OperationMeta
from pyinfra.context import ctx_state

from sparkrig.runscope import once_per_run

RESTART_TRIGGERS = {
    "fabric": "the fabric connection was re-applied (MTU reset, address lost)",
    "env": "a rank's env file changed (NCCL environment; not a GID index that moved alone)",
    "weights": "a rank's weights were fetched or copied",
    "rank_unit": "a rank's unit changed (image, serve flags)",
    "pair_unit": "a stop-together unit changed",
    "api_key": "the API key changed (vLLM reads it at start)",
}


class PairRestart:
    """The run's one decision whether the whole pair restarts (in order): any declared trigger
    (``RESTART_TRIGGERS``) changed on any host. Phases hand it the operations that are triggers;
    the service and verify phases gate on it (``_if=restart``), evaluated when they execute."""

    def __init__(self, state: Any) -> None:
        self.state = state
        self.metas: dict[str, list[OperationMeta]] = {name: [] for name in RESTART_TRIGGERS}

    def trigger(self, name: str, meta: OperationMeta) -> OperationMeta:
        """Declare ``meta`` (on the current host) as trigger ``name``; returns it."""
        if name not in self.metas:
            raise KeyError(f"{name!r} is not a declared pair-restart trigger ({RESTART_TRIGGERS})")
        self.metas[name].append(meta)
        return meta

    def fired(self) -> list[str]:
        """The triggers whose operation changed something on some host, so far."""
        return [
            name
            for name, metas in self.metas.items()
            if any(m.is_complete() and m.did_change() for m in metas)
        ]

    def __call__(self) -> bool:
        """For ``_if=``: does the pair restart?"""
        return bool(self.fired())


def pair_restart() -> PairRestart:
    """The current run's pair-restart decision (one object for every host and phase)."""
    state = ctx_state.get()
    return once_per_run("pair restart", state, lambda: PairRestart(state))
