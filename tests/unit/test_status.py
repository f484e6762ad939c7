"""sparkrig.status: the rank report is typed and a cut or garbled one fails its host."""

from __future__ import annotations

import pytest
from pyinfra.api.exceptions import FactProcessError

from sparkrig.factlines import END
from sparkrig.settings import build
from sparkrig.status import RankState, parse_rank_state, problems
from tests.unit.conftest import cluster

GOOD = "unit_ActiveState=active unit_SubState=running image=r:t gid_env=3 gid_live=3 mtu=9000 \
memfree_kb=100 weights_commit=ab weights_verified=5".split()


def test_a_report_parses_typed():
    st = parse_rank_state([*GOOD, END])
    assert st.gid_env == 3 and st.gid_handed is None and st.mtu == 9000 and st.active == "active"


@pytest.mark.parametrize("lines", [GOOD, [*GOOD, "mtu=lots", END], [*GOOD, "gid_live=x", END]])
def test_a_cut_or_garbled_report_fails_its_host(lines):
    with pytest.raises(FactProcessError):
        parse_rank_state(lines)


def test_a_handed_over_gid_that_left_the_table_is_off():
    s = build(cluster(2))["spark-1"]
    k = s.knobs
    fine = RankState("active", "running", "", "img", 3, 3, 3, k.fabric_mtu, 0, k.model_revision)
    assert problems(s, fine, "img") == []
    moved = RankState("active", "running", "", "img", 3, 3, 4, k.fabric_mtu, 0, k.model_revision)
    assert problems(s, moved, "img") == ["GID index: start gate handed over 4, live table 3"]
