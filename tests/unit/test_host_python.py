"""The host package runs on the ranks' own python3 (DGX OS ships 3.12), and stays >= 3.10: the
control side's floor (pyproject requires-python, 3.11) is not the host's."""

from __future__ import annotations

import ast

import sparkrig.hostpkg

# Standard-library names the host package may not use: newer than 3.10.
NEWER_THAN_310 = {
    "tomllib", "hashlib.file_digest", "datetime.UTC", "enum.StrEnum", "typing.Self",
    "typing.Never", "typing.LiteralString", "typing.assert_never", "asyncio.TaskGroup",
    "ExceptionGroup", "BaseExceptionGroup", "add_note", "wsgiref.types",
}  # fmt: skip


def names_used(tree: ast.AST) -> set[str]:
    """Dotted names the module uses: imports, ``from x import y`` as x.y, attributes a.b."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.update({node.module, *(f"{node.module}.{a.name}" for a in node.names)})
        elif isinstance(node, ast.Attribute):
            if isinstance(node.value, ast.Name):
                out.add(f"{node.value.id}.{node.attr}")
            out.add(node.attr)
        elif isinstance(node, ast.Name):
            out.add(node.id)
    return out


def too_new(source: str, name: str) -> list[str]:
    tree = ast.parse(source, name, feature_version=(3, 10))  # 3.11 syntax is a SyntaxError
    return sorted(names_used(tree) & NEWER_THAN_310)


def test_the_host_package_is_python_3_10():
    for module in sparkrig.hostpkg.modules():
        path = sparkrig.hostpkg.source(module)
        assert too_new(path.read_text(), str(path)) == [], f"{module} needs Python > 3.10"


def test_the_check_sees_3_11_names_and_syntax():
    assert too_new("import tomllib\nimport hashlib\nhashlib.file_digest(f, 'sha256')\n", "x") == [
        "hashlib.file_digest",
        "tomllib",
    ]
    try:
        too_new("try:\n    pass\nexcept* ValueError:\n    pass\n", "x")
    except SyntaxError:
        pass
    else:
        raise AssertionError("except* parsed as 3.10")
