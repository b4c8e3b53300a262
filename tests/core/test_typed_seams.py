"""The core is typed without ``Any`` (docs/design.md: typed seams).

Every parameter, return and attribute of ``sim/core`` has a precise type or a narrow Protocol; options
from scenario files are :data:`sim.core.registry.OptionValue` (JSON-like) and a connector's
``kv_transfer_params`` are :data:`sim.core.interfaces.KVTransferParams`. Scanned in the syntax tree, so
comments and docstrings may still say the word.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

CORE = Path(__file__).resolve().parents[2] / "sim" / "core"
SOURCES = sorted(CORE.rglob("*.py"))


def any_uses(source: str, filename: str) -> list[int]:
    """Lines that name ``typing.Any``: imported, referred to by name, as an attribute, or in a quoted annotation."""
    lines: list[int] = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.ImportFrom) and any(alias.name == "Any" for alias in node.names):
            lines.append(node.lineno)
        elif isinstance(node, ast.Name) and node.id == "Any":
            lines.append(node.lineno)
        elif isinstance(node, ast.Attribute) and node.attr == "Any":
            lines.append(node.lineno)
        for quoted in _quoted_annotations(node):
            if "Any" in _names_in(quoted):
                lines.append(node.lineno)
    return sorted(set(lines))


def _quoted_annotations(node: ast.AST) -> list[str]:
    """The string type expressions ``node`` holds: quoted annotations, and a quoted alias's value."""
    annotations: list[ast.expr | None] = []
    if isinstance(node, ast.arg):
        annotations.append(node.annotation)
    elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        annotations.append(node.returns)
    elif isinstance(node, ast.AnnAssign):
        annotations += [node.annotation, node.value]
    return [a.value for a in annotations if isinstance(a, ast.Constant) and isinstance(a.value, str)]


def _names_in(expression: str) -> set[str]:
    try:
        tree = ast.parse(expression, mode="eval")
    except SyntaxError:
        return set()
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}


def test_the_scan_finds_each_spelling() -> None:
    assert any_uses("from typing import Any\n", "x") == [1]
    assert any_uses("import typing\ndef f(x: typing.Any) -> None: ...\n", "x") == [2]
    assert any_uses("def f(x: 'dict[str, Any]') -> 'Any': ...\n", "x") == [1]
    assert any_uses('X: TypeAlias = "list[Any] | None"\n', "x") == [1]
    assert any_uses('"""Any other policy."""\n# Any\n', "x") == []


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(CORE.parent.parent)))
def test_no_any_in_the_core(path: Path) -> None:
    lines = any_uses(path.read_text(encoding="utf-8"), str(path))
    assert not lines, f"{path.relative_to(CORE.parent.parent)}: `Any` on lines {lines}; give a precise type"
