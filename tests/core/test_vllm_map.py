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


#: Classes whose methods keep vLLM's order, for a side-by-side read (ours -> vLLM's file and class).
SAME_ORDER = {
    ("sim.core.kv.block_pool", "BlockPool"): ("block_pool.py", "BlockPool"),
    ("sim.core.kv.kv_cache_manager", "KVCacheManager"): ("kv_cache_manager.py", "KVCacheManager"),
    ("sim.core.kv.kv_cache_coordinator", "KVCacheCoordinator"): ("kv_cache_coordinator.py", "KVCacheCoordinator"),
    ("sim.core.kv.kv_cache_coordinator", "HybridKVCacheCoordinator"): (
        "kv_cache_coordinator.py",
        "HybridKVCacheCoordinator",
    ),
    ("sim.core.kv.single_type_kv_cache_manager", "SingleTypeKVCacheManager"): (
        "single_type_kv_cache_manager.py",
        "SingleTypeKVCacheManager",
    ),
    ("sim.core.kv.single_type_kv_cache_manager", "MambaManager"): ("single_type_kv_cache_manager.py", "MambaManager"),
    ("sim.core.scheduler", "Scheduler"): ("sched/scheduler.py", "Scheduler"),
}


def _method_lines(tree: ast.Module, cls: str) -> dict[str, int]:
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
    return {n.name: n.lineno for n in node.body if isinstance(n, ast.FunctionDef)}


def _same_class_rows(module: str, cls: str, vllm_file: str, vllm_cls: str) -> list[tuple[str, str]]:
    """(vLLM method, our method) of the map's rows that pair ``vllm_cls`` with ``cls``, in the map's order."""
    return [
        (theirs.split(".", 1)[1], ours.split(".", 1)[1])
        for file, theirs, mod, ours in _rows()
        if file == vllm_file and mod == module and theirs.startswith(vllm_cls + ".") and ours.startswith(cls + ".")
    ]


@pytest.mark.parametrize("ours", sorted(SAME_ORDER), ids=lambda o: f"{o[0]}:{o[1]}")
def test_our_methods_keep_the_maps_order(ours: tuple[str, str]) -> None:
    module, cls = ours
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin is not None
    lines = _method_lines(ast.parse(Path(spec.origin).read_text(encoding="utf-8")), cls)
    mapped = [mine for _, mine in _same_class_rows(module, cls, *SAME_ORDER[ours])]
    assert len(mapped) >= 3
    order = [lines[name] for name in mapped]
    assert order == sorted(order), f"{module}.{cls}: methods not in the map's (vLLM's) order: {mapped}"


@pytest.mark.parametrize("ours", sorted(SAME_ORDER), ids=lambda o: f"{o[0]}:{o[1]}")
def test_the_maps_order_is_vllms(ours: tuple[str, str]) -> None:
    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:
        pytest.skip("vLLM is not installed (`make vllm-env`)")
    vllm_file, vllm_cls = SAME_ORDER[ours]
    tree = ast.parse((Path(spec.origin).parent / "v1" / "core" / vllm_file).read_text(encoding="utf-8"))
    lines = _method_lines(tree, vllm_cls)
    theirs = [name for name, _ in _same_class_rows(*ours, vllm_file, vllm_cls)]
    order = [lines[name] for name in theirs]
    assert order == sorted(order), f"docs/kv-core.md: the {vllm_cls} rows are not in {vllm_file}'s order: {theirs}"


def _vllm_function(tree: ast.Module, qualname: str) -> ast.FunctionDef | None:
    body: list[ast.stmt] = tree.body
    node: ast.stmt | None = None
    for part in qualname.split("."):
        node = next((n for n in body if isinstance(n, (ast.ClassDef, ast.FunctionDef)) and n.name == part), None)
        if node is None:
            return None
        body = node.body
    return node if isinstance(node, ast.FunctionDef) else None


def test_the_pools_methods_return_nothing_where_vllms_do() -> None:
    """A side-by-side read of the pool: where vLLM's ``block_pool.py`` function returns ``None`` (``touch``,
    ``free_blocks``, ...), ours returns nothing either (no counts handed back for a speed layer)."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:
        pytest.skip("vLLM is not installed (`make vllm-env`)")
    tree = ast.parse((Path(spec.origin).parent / "v1" / "core" / "block_pool.py").read_text(encoding="utf-8"))
    checked, differ = [], []
    for vllm_file, theirs, module, ours in _rows():
        node = _vllm_function(tree, theirs) if vllm_file == "block_pool.py" else None
        if node is None or not (isinstance(node.returns, ast.Constant) and node.returns.value is None):
            continue
        obj: object = importlib.import_module(module)
        for part in ours.split("."):
            obj = getattr(obj, part)
        checked.append(ours)
        if getattr(obj, "__annotations__", {}).get("return") != "None":
            differ.append(ours)
    assert {"BlockPool.touch", "BlockPool.free_blocks"} <= set(checked)
    assert not differ, f"these return a value where vLLM's return None: {differ}"
