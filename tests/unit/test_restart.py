"""The pair-restart decision: one object per run, declared triggers only, fired by any host."""

from __future__ import annotations

import pytest

from sparkrig.pairrestart import RESTART_TRIGGERS, PairRestart


class Meta:
    def __init__(self, complete: bool, changed: bool) -> None:
        self.complete, self.changed = complete, changed

    def is_complete(self) -> bool:
        return self.complete

    def did_change(self) -> bool:
        return self.changed


def test_any_declared_trigger_that_changed_on_any_host_restarts_the_pair():
    restart = PairRestart()
    restart.trigger("fabric", Meta(True, False))  # head: fabric right
    restart.trigger("env", Meta(False, True))  # not run yet: not a decision
    assert not restart() and restart.fired() == []
    restart.trigger("env", Meta(True, True))  # worker: env file rewritten
    assert restart() and restart.fired() == ["env"]


def test_an_undeclared_trigger_is_refused():
    with pytest.raises(KeyError, match="not a declared pair-restart trigger"):
        PairRestart().trigger("rank-unit", Meta(True, True))
    assert set(RESTART_TRIGGERS) == {
        "fabric",
        "roce_device",
        "gid_moved",
        "peer_down",
        "frozen",
        "env",
        "weights",
        "rank_unit",
        "pair_unit",
        "api_key",
        "graph_files",
    }
