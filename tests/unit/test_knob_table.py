"""Every knob is declared once, in sparkrig/config/knobs.py: group_data/all.py and docs/
configuration.md's table of every knob are what sparkrig/config/generate.py makes from it, so a
knob added, removed, re-commented or given another default in only one of them fails."""

from __future__ import annotations

import runpy
from pathlib import Path

from sparkrig.config import generate
from sparkrig.config.__main__ import main
from sparkrig.config.knobs import Knobs

REPO = Path(__file__).resolve().parents[2]
REGENERATE = "edit sparkrig/config/knobs.py, then run python3 -m sparkrig.config group-data --write"


def test_group_data_all_py_is_the_one_the_declarations_make() -> None:
    assert generate.group_data() == (REPO / "group_data" / "all.py").read_text(), REGENERATE


def test_the_docs_table_is_the_one_the_declarations_make() -> None:
    doc = (REPO / "docs" / "configuration.md").read_text()
    assert generate.rewritten(doc) == doc, "run python3 -m sparkrig.config table --write"


def test_group_data_holds_each_declared_default_and_nothing_else() -> None:
    data = runpy.run_path(str(REPO / "group_data" / "all.py"))
    data = {k: v for k, v in data.items() if not k.startswith("__")}
    declared = {n: f.json_schema_extra["default"] for n, f in Knobs.model_fields.items()}  # type: ignore[index]
    assert data == {**declared, "_sudo": True}


def test_a_default_changed_in_the_declaration_lands_in_group_data() -> None:
    source = generate.KNOBS.read_text()
    edited = source.replace("    swappiness: int = _knob(0,", "    swappiness: int = _knob(10,")
    assert edited != source
    assert "\nswappiness = 10  #" in generate.group_data(edited)
    assert generate.group_data(edited) != generate.group_data()


def test_the_table_has_one_row_per_knob_with_its_type_and_what_it_does() -> None:
    rows = generate.rows()
    names = [name for name, _, _ in rows]
    assert len(names) == len(set(names))
    assert set(names) == set(Knobs.model_fields)
    assert all(what for _, _, what in rows), [n for n, _, w in rows if not w]
    table = generate.table()
    assert "float (>= 0, <= 1440)" in table  # soak_minutes' bounds
    assert "| `bench_tolerance` | `0.10` |" in table  # the default as written, not as repr'd


def test_the_command_prints_group_data_and_writes_nothing_without_write(capsys) -> None:
    assert main(["group-data"]) == 0
    assert capsys.readouterr().out == generate.group_data()
    assert main(["table"]) == 0
    assert capsys.readouterr().out == generate.table() + "\n"
