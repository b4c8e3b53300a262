"""The vLLM ↔ hybridsim map of docs/kv-core.md names real functions on both sides.

Every row of the table under "## vLLM functions we mirror" is
``| `<vLLM file>: <qualname>` | `<our module>: <qualname>` | <differences> |``.
Our side is imported and resolved attribute by attribute (always). The vLLM
side is looked up in the installed vLLM's source with ``ast`` (no vLLM import:
it takes seconds); where vLLM is not installed only that test is skipped.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import os
import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "kv-core.md"
ROW = re.compile(r"^\| `([\w/]+\.py): ([\w.]+)` \| `([\w.]+): ([\w.]+)` \|", re.M)


def _rows() -> list[tuple[str, str, str, str]]:
    text = DOC.read_text(encoding="utf-8")
    section = text.split("## vLLM functions we mirror", 1)[1].split("\n## ", 1)[0]
    return ROW.findall(section)


def test_the_map_is_there_and_every_row_parses() -> None:
    rows = _rows()
    assert len(rows) >= 90
    text = DOC.read_text(encoding="utf-8").split("## vLLM functions we mirror", 1)[1].split("\n## ", 1)[0]
    table_lines = [line for line in text.splitlines() if line.startswith("| `")]
    assert len(table_lines) == len(rows), "a row of the map does not have the `file: name` | `module: name` form"


@pytest.mark.parametrize("row", _rows(), ids=lambda r: f"{r[2]}:{r[3]}")
def test_our_symbol_exists(row: tuple[str, str, str, str]) -> None:
    _, _, module, qualname = row
    obj: object = importlib.import_module(module)
    for part in qualname.split("."):
        assert hasattr(obj, part), f"docs/kv-core.md names {module}: {qualname}, which does not exist"
        obj = getattr(obj, part)


def _defined(tree: ast.Module, qualname: str) -> bool:
    body: list[ast.stmt] = tree.body
    for part in qualname.split("."):
        found = next(
            (n for n in body if isinstance(n, (ast.ClassDef, ast.FunctionDef)) and n.name == part),
            None,
        )
        if found is None:
            return False
        body = found.body
    return True


def test_every_vllm_symbol_exists_in_the_installed_vllm() -> None:
    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:
        if os.environ.get("HYBRIDSIM_REQUIRE_VLLM") == "1":
            pytest.fail("HYBRIDSIM_REQUIRE_VLLM=1 but vLLM is not installed")
        pytest.skip("vLLM is not installed (`make vllm-env`)")
    core = Path(spec.origin).parent / "v1" / "core"
    trees: dict[str, ast.Module] = {}
    missing = []
    for vllm_file, qualname, _, _ in _rows():
        if vllm_file not in trees:
            trees[vllm_file] = ast.parse((core / vllm_file).read_text(encoding="utf-8"))
        if not _defined(trees[vllm_file], qualname):
            missing.append(f"{vllm_file}: {qualname}")
    assert not missing, f"docs/kv-core.md names vLLM functions the installed vLLM lacks: {missing}"
