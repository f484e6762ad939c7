"""docs/configuration.md's table of every knob, made from group_data/all.py (the one place each
knob is declared with its default and its comment) and sparkrig/settings.py's Knobs (its type
and bounds). `python3 scripts/knob-table.py` rewrites the table between its markers;
tests/unit/test_knob_table.py fails when the table is not what this makes."""

from __future__ import annotations

import ast
import io
import sys
import tokenize
import typing
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
ALL = REPO / "group_data" / "all.py"
DOC = REPO / "docs" / "configuration.md"
BEGIN = "<!-- knob table: scripts/knob-table.py writes it, do not edit by hand -->"
END = "<!-- end of the knob table -->"


def comments(source: str) -> dict[int, str]:
    """line number -> the comment on that line (without '#')."""
    out = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            out[tok.start[0]] = tok.string.lstrip("#").strip()
    return out


def knobs_of(source: str) -> list[tuple[str, str, str]]:
    """(name, default as written, what) per top-level knob of group_data/all.py, in its order;
    what: the comment on its line, else the comment block right above it."""
    said, lines = comments(source), source.splitlines()
    out = []
    for node in ast.parse(source).body:
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1):
            continue
        target = node.targets[0]
        if not isinstance(target, ast.Name) or target.id.startswith("_"):
            continue
        default = " ".join(ast.get_source_segment(source, node.value).split())  # type: ignore[union-attr]
        end = node.end_lineno or node.lineno
        what = next((said[n] for n in range(node.lineno, end + 1) if n in said), "")
        if not what:
            above, n = [], node.lineno - 1
            while n >= 1 and lines[n - 1].lstrip().startswith("#") and n in said:
                if lines[n - 1].lstrip().startswith("# ---"):
                    break
                above.insert(0, said[n])
                n -= 1
            what = " ".join(above)
        out.append((target.id, default, what))
    return out


def kind_of(name: str) -> str:
    """The knob's type and bounds as sparkrig/settings.py's Knobs declares them."""
    sys.path.insert(0, str(REPO))
    from sparkrig.settings import Knobs

    field = Knobs.model_fields.get(name)
    if field is None:
        return "?"
    if typing.get_origin(field.annotation) is typing.Literal:
        kind = r" \| ".join(repr(v) for v in typing.get_args(field.annotation))
    else:
        kind = getattr(field.annotation, "__name__", None) or str(field.annotation)
        kind = kind.replace("typing.", "")
    bounds: list[Any] = []
    for m in field.metadata:
        for key, sign in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
            if getattr(m, key, None) is not None:
                bounds.append(f"{sign} {getattr(m, key)}")
    return kind + (f" ({', '.join(bounds)})" if bounds else "")


def cell(text: str) -> str:
    return text.replace("\\|", "|").replace("|", "\\|")


def table(source: str) -> str:
    rows = [
        "| knob | default | type | what |",
        "|---|---|---|---|",
    ]
    for name, default, what in knobs_of(source):
        rows.append(f"| `{name}` | `{cell(default)}` | {cell(kind_of(name))} | {cell(what)} |")
    return "\n".join(rows)


def rewritten(doc: str, source: str) -> str:
    """The doc with its table replaced (appended at the end the first time)."""
    block = f"{BEGIN}\n{table(source)}\n{END}"
    if BEGIN in doc and END in doc:
        head, rest = doc.split(BEGIN, 1)
        return head + block + rest.split(END, 1)[1]
    return doc.rstrip("\n") + "\n\n## Every knob\n\n" + block + "\n"


def main() -> int:
    doc = DOC.read_text()
    new = rewritten(doc, ALL.read_text())
    if new != doc:
        DOC.write_text(new)
        print(f"{DOC.relative_to(REPO)}: knob table rewritten")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
