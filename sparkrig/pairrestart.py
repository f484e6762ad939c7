"""Whether the whole pair restarts (in order): one decision for every host of the run, with its
triggers declared here."""

from __future__ import annotations

from pyinfra.api.operation import OperationMeta

from sparkrig.runscope import Watch, watch

RESTART_TRIGGERS = {
    "fabric": "the fabric connection was re-applied (MTU reset, address lost)",
    "roce_device": "the fabric NIC's RoCE device was made again (its queue pairs are gone)",
    "gid_moved": "the GID table renumbered under a running rank (its container has the old index)",
    "peer_down": "a rank ran while a peer's rank was down (a rank never starts alone)",
    "frozen": "a rank's container was frozen (docker pause) and thawed (peers may have timed out)",
    "graph_files": "a ring rank's NCCL graph files changed (the engine reads them at start)",
    "env": "a rank's env file changed (NCCL environment; not a GID index that moved alone)",
    "weights": "a rank's weights were fetched or copied",
    "rank_unit": "a rank's unit changed (image, serve flags)",
    "pair_unit": "a stop-together unit changed",
    "api_key": "the API key changed (vLLM reads it at start)",
}


class PairRestart(Watch):
    """The run's one decision whether the whole pair restarts (in order): any declared trigger
    (``RESTART_TRIGGERS``) changed on any host. Phases hand it the operations that are triggers;
    the service and verify phases gate on it (``_if=restart``), evaluated when they execute."""

    def __init__(self) -> None:
        super().__init__(RESTART_TRIGGERS)

    def trigger(self, name: str, meta: OperationMeta) -> OperationMeta:
        """Declare ``meta`` (on the current host) as trigger ``name``; returns it."""
        if name not in RESTART_TRIGGERS:
            raise KeyError(f"{name!r} is not a declared pair-restart trigger ({RESTART_TRIGGERS})")
        return self.add(name, meta)

    def fired(self) -> list[str]:
        """The triggers whose operation changed something on some host, so far."""
        return self.changed()

    def __call__(self) -> bool:
        """For ``_if=``: does the pair restart?"""
        return bool(self.fired())


def pair_restart() -> PairRestart:
    """The current run's pair-restart decision (one object for every host and phase)."""
    return watch("pair restart", PairRestart)
