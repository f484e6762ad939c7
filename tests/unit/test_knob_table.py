"""docs/configuration.md's table of every knob is what scripts/knob-table.py makes from
group_data/all.py and Knobs: a knob added, removed or re-commented without the table fails."""

from __future__ import annotations

import runpy
from pathlib import Path

from sparkrig.settings import Knobs

REPO = Path(__file__).resolve().parents[2]
TABLE = runpy.run_path(str(REPO / "scripts" / "knob-table.py"))


def test_the_docs_table_is_the_one_group_data_makes() -> None:
    doc = (REPO / "docs" / "configuration.md").read_text()
    source = (REPO / "group_data" / "all.py").read_text()
    assert TABLE["rewritten"](doc, source) == doc, "run python3 scripts/knob-table.py"


def test_the_table_has_one_row_per_knob_with_its_type_and_what_it_does() -> None:
    source = (REPO / "group_data" / "all.py").read_text()
    rows = TABLE["knobs_of"](source)
    names = [name for name, _, _ in rows]
    assert len(names) == len(set(names))
    assert set(names) == set(Knobs.model_fields)
    assert all(what for _, _, what in rows), [n for n, _, w in rows if not w]
    assert "float (>= 0, <= 1440)" in TABLE["table"](source)  # soak_minutes' bounds
