"""group_data/all.py and docs/configuration.md's knob table, made from sparkrig/config/knobs.py,
where each knob is declared once. Each default is written as knobs.py writes it (``0.10`` stays
``0.10``), so both are read from its source: a field of ``Knobs``, the string under it (what the
knob is), the comment lines above it (its section and why). ``python3 -m sparkrig.config
group-data|table [--write]``; tests/unit/test_knob_table.py fails when either file differs."""

from __future__ import annotations

import ast
import io
import tokenize
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparkrig.config import knobs

REPO = Path(__file__).resolve().parents[2]
KNOBS = Path(knobs.__file__)
GROUP_DATA = REPO / "group_data" / "all.py"
DOC = REPO / "docs" / "configuration.md"
BEGIN = (
    "<!-- knob table: python3 -m sparkrig.config table --write writes it, do not edit by hand -->"
)
END = "<!-- end of the knob table -->"
LINE = 100  # ruff's line length: a longer `name = value  # what` is wrapped as ruff wraps it
SECTION = "# ---"
HEADER = '''\
"""Every knob sparkrig has, with its default. Made from sparkrig/config/knobs.py, where each
knob is declared once (type, bounds, default, what and why) and validated before any host: edit
it there, then run `python3 -m sparkrig.config group-data --write`, never here. Override a knob
per group (head.py, worker.py), per host in the inventory, or on the command line with `--data
key=value`. Per-host keys (fabric_interface, fabric_address, roce_device, uplink_interfaces,
fabric_ports, lan_address, the head's api_url) belong in the inventory, not here."""'''


@dataclass(frozen=True)
class Declared:
    """One name of group_data/all.py as knobs.py declares it."""

    name: str
    value: str  # the default as written (lines at the column group_data/all.py has them)
    trailer: str  # what follows the value on its last line (`  # fmt: skip`), else ""
    what: str
    above: tuple[str, ...]  # the comment lines above it: section headers, then why


def _comment_lines(source: str) -> dict[int, str]:
    """line number -> the comment of every line that holds nothing else, unindented."""
    out = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT and not tok.line[: tok.start[1]].strip():
            out[tok.start[0]] = tok.string
    return out


def _written(source: str, node: ast.expr) -> tuple[str, str]:
    """(the default's text, what follows it on its last line): a module constant's (a default of
    several lines, written at the top of knobs.py at group_data/all.py's column), else the
    argument's own, on one line."""
    constant = isinstance(node, ast.Name)
    if isinstance(node, ast.Name):
        name = node.id
        node = next(
            n.value
            for n in ast.parse(source).body
            if isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == name
        )
    text = ast.get_source_segment(source, node) or ""
    if "\n" in text and not constant:
        raise ValueError(f"{text!r}: write a default of several lines as a module constant")
    last = source.splitlines()[(node.end_lineno or node.lineno) - 1]
    return text, last[node.end_col_offset :] if constant else ""


def declared(source: str | None = None) -> list[Declared]:
    """Every name of ``Knobs``' body in order: its fields and the ClassVar ``_sudo``."""
    source = KNOBS.read_text() if source is None else source
    tree = ast.parse(source)
    body = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Knobs").body
    comments = _comment_lines(source)
    out, previous = [], body[0].end_lineno or body[0].lineno
    for stmt, after in zip(body, [*body[1:], None], strict=True):
        if not isinstance(stmt, ast.AnnAssign) or stmt.value is None:
            previous = stmt.end_lineno or stmt.lineno
            continue
        if not (isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)):
            raise ValueError(f"line {stmt.lineno}: no string under it says what the knob is")
        value = stmt.value
        if isinstance(value, ast.Call) and ast.unparse(value.func) in ("_knob", "_cluster"):
            value = value.args[0]
        text, trailer = _written(source, value)
        above = tuple(comments[n] for n in range(previous + 1, stmt.lineno) if n in comments)
        name = ast.unparse(stmt.target)
        out.append(Declared(name, text, trailer, str(after.value.value), above))
        previous = after.end_lineno or after.lineno
    return out


def _assignment(d: Declared) -> list[str]:
    """``name = value  # what``, the comment after the first line of a value of several."""
    first, *rest = d.value.split("\n")
    line = f"{d.name} = {first}  # {d.what}"
    if rest:
        return [line, *rest[:-1], rest[-1] + d.trailer]
    if len(line) > LINE:
        return [f"{d.name} = (", f"    {first}  # {d.what}", ")"]
    return [line + d.trailer]


def group_data(source: str | None = None) -> str:
    """group_data/all.py as knobs.py declares it: one blank line before each section."""
    out = [HEADER]
    for d in declared(source):
        for line in d.above:
            out += ["", line] if line.startswith(SECTION) else [line]
        out += _assignment(d)
    return "\n".join(out) + "\n"


def kind_of(name: str) -> str:
    """The knob's type and bounds as ``Knobs`` declares them."""
    field = knobs.Knobs.model_fields[name]
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


def _cell(text: str) -> str:
    return text.replace("\\|", "|").replace("|", "\\|")


def rows(source: str | None = None) -> list[tuple[str, str, str]]:
    """(name, default as group_data/all.py writes it, on one line, what) of every knob; the
    default of several lines holds the comment after its first line, as written there."""
    out = []
    for d in declared(source):
        if not d.name.startswith("_"):  # pyinfra's own host data, no knob
            first, *rest = d.value.split("\n")
            value = "\n".join([f"{first}  # {d.what}", *rest]) if rest else d.value
            out.append((d.name, " ".join(value.split()), d.what))
    return out


def table(source: str | None = None) -> str:
    lines = ["| knob | default | type | what |", "|---|---|---|---|"]
    for name, default, what in rows(source):
        lines.append(f"| `{name}` | `{_cell(default)}` | {_cell(kind_of(name))} | {_cell(what)} |")
    return "\n".join(lines)


def rewritten(doc: str, source: str | None = None) -> str:
    """The doc with its table replaced (appended at the end the first time)."""
    block = f"{BEGIN}\n{table(source)}\n{END}"
    if BEGIN in doc and END in doc:
        head, rest = doc.split(BEGIN, 1)
        return head + block + rest.split(END, 1)[1]
    return doc.rstrip("\n") + "\n\n## Every knob\n\n" + block + "\n"
