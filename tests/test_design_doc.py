"""docs/design.md states the two user contracts: the result tables' columns (§6) and the scenario keys (§7).

Both directions are checked: every column the table schema declares and every key the scenario schema
accepts is on the page, and the page names no column or key the code does not have. Column order is part
of the contract, so the page lists each table's columns in the schema's order.
"""

from __future__ import annotations

import re
import typing
from collections import deque
from pathlib import Path

from pydantic import BaseModel

from sim.config.scenario import Scenario
from sim.trace.tables import TABLE_NAMES, contract_columns

DOC = Path(__file__).resolve().parents[1] / "docs" / "design.md"
TEXT = DOC.read_text(encoding="utf-8")
_PER_GROUP = re.compile(r"^(hit_g|blocks_g|cached_g)0$")


def _section(title_prefix: str) -> str:
    """The text of the ``## <title_prefix>...`` section, up to the next ``## `` heading."""
    match = re.search(rf"^## {re.escape(title_prefix)}.*?$(.*?)(?=^## |\Z)", TEXT, re.M | re.S)
    assert match, f"docs/design.md has no section '## {title_prefix}'"
    return match.group(1)


def _first_cells(block: str) -> list[str]:
    """The backticked name in the first cell of each table row of ``block`` (header and rule skipped)."""
    return re.findall(r"^\| `([^`]+)` \|", block, re.M)


def _documented_columns() -> dict[str, list[str]]:
    tables = _section("6.")
    parts = re.split(r"^### `(\w+)`\s*$", tables, flags=re.M)
    return {name: _first_cells(body) for name, body in zip(parts[1::2], parts[2::2])}


def _declared_columns(table: str) -> list[str]:
    """The schema's columns with the per-group ones written as ``hit_g<i>`` (one group suffices)."""
    return [_PER_GROUP.sub(r"\1<i>", c) for c in contract_columns(table, 1)]


def test_every_table_is_documented_and_no_other():
    assert sorted(_documented_columns()) == sorted(TABLE_NAMES)


def test_each_tables_columns_match_the_schema_in_order():
    documented = _documented_columns()
    for table in TABLE_NAMES:
        declared = _declared_columns(table)
        missing = [c for c in declared if c not in documented[table]]
        unknown = [c for c in documented[table] if c not in declared]
        assert not missing, f"docs/design.md §6 `{table}` lacks declared columns {missing}"
        assert not unknown, f"docs/design.md §6 `{table}` names columns the schema lacks: {unknown}"
        assert documented[table] == declared, f"docs/design.md §6 `{table}`: columns out of the schema's order"


def _models_in(annotation: object) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]


def schema_sections() -> dict[str, set[str]]:
    """Key path -> keys accepted there, walking the scenario models breadth first.

    A list's items are keyed under the list's path; the members of a union at one path are merged; a
    model reached again at a deeper path (the distribution model under every length and time) is listed
    once, at the first path.
    """
    sections: dict[str, set[str]] = {}
    seen: set[type[BaseModel]] = {Scenario}
    queue: deque[tuple[str, list[type[BaseModel]]]] = deque([("", [Scenario])])
    while queue:
        path, models = queue.popleft()
        keys = sections.setdefault(path, set())
        children: dict[str, list[type[BaseModel]]] = {}
        for model in models:
            for name, field in model.model_fields.items():
                key = field.alias or name
                keys.add(key)
                fresh = [m for m in _models_in(field.annotation) if m not in seen]
                if fresh:
                    children.setdefault(f"{path}.{key}" if path else key, []).extend(fresh)
        for child, child_models in children.items():
            seen.update(child_models)
            queue.append((child, list(dict.fromkeys(child_models))))
    return {path: keys for path, keys in sections.items() if keys}


def documented_sections() -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for label, keys in re.findall(r"^\| (\(top level\)|`[\w.]+`) \| (`.*`) \|$", _section("7."), re.M):
        path = "" if label == "(top level)" else label.strip("`")
        assert path not in out, f"docs/design.md §7 lists section {label} twice"
        out[path] = set(re.findall(r"`(\w+)`", keys))
    return out


def test_every_scenario_key_is_documented_and_no_other():
    schema, documented = schema_sections(), documented_sections()
    assert set(schema) == set(documented), (
        f"docs/design.md §7 sections: missing {sorted(set(schema) - set(documented))}, "
        f"unknown {sorted(set(documented) - set(schema))}"
    )
    for path, keys in schema.items():
        label = path or "(top level)"
        assert keys <= documented[path], f"docs/design.md §7 {label} lacks keys {sorted(keys - documented[path])}"
        assert documented[path] <= keys, (
            f"docs/design.md §7 {label} names unknown keys {sorted(documented[path] - keys)}"
        )


def test_the_checks_see_a_real_page():
    """Guard against a parser that silently matches nothing."""
    assert len(documented_sections()) >= 20
    assert sum(len(c) for c in _documented_columns().values()) >= 50


def test_nothing_in_the_repository_cites_a_design_file_outside_it():
    root = DOC.parents[1]
    files = [root / name for name in ("README.md", "pyproject.toml", "Makefile")] + [
        path
        for folder in ("sim", "tests", "docs", "benchmarks", "scenarios")
        for path in sorted((root / folder).rglob("*"))
        if path.suffix in (".py", ".md", ".pyi", ".c", ".yaml") and path.is_file()
    ]
    cites = [
        f"{path.relative_to(root)}:{n}"
        for path in files
        for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1)
        if "DESIGN.md" in line and path != Path(__file__).resolve()
    ]
    assert not cites, f"cite docs/design.md instead of DESIGN.md: {cites}"
