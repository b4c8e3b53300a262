"""The import contract of docs/architecture.md: stages import only downward, and the core stays pure.

Layers, lowest first (a module may import its own layer and the layers below):

    trace < core < accel, workload < config < connector < engine < results < analysis < api < sweep, verify < cli < entry

The core (tokens, request, kv, policy, scheduler, interfaces, admission_truth,
registry) additionally imports nothing outside the core (in particular nothing of the speed
layer ``sim.accel``, which sits above it), and no simpy, pandas
or matplotlib. Checked twice: statically over every ``import`` in the source
(function-level imports included), and by importing the core in a fresh
interpreter and reading ``sys.modules``.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

SIM = Path(__file__).resolve().parents[1] / "sim"

#: Top-level unit of ``sim`` -> layer. A new package or module must be given a layer here and in the layer table
#: of docs/architecture.md (checked below).
LAYERS: dict[str, int] = {
    "sim.trace": 0,
    "sim.limits": 0,
    "sim.inputfile": 0,
    "sim.interrupts": 0,
    "sim.startup": 0,
    "sim.core": 1,
    "sim.accel": 2,
    "sim.workload": 2,
    "sim.config": 3,
    "sim.connector": 4,
    "sim.engine": 5,
    "sim.cluster": 5,
    "sim.results": 6,
    "sim.timing": 6,
    "sim.analysis": 7,
    "sim.api": 8,
    "sim.sweep": 9,
    "sim.verify": 9,
    "sim.shrink": 9,
    "sim.export": 9,
    "sim.docs_figures": 9,
    "sim.cli": 10,
    "sim.e2e": 10,
    "sim": 10,
    "sim.entry": 11,
    "sim.__main__": 11,
}
CORE = {unit for unit, layer in LAYERS.items() if layer == 1}
CORE_FORBIDDEN_THIRD_PARTY = ("simpy", "pandas", "matplotlib")


def _module_name(path: Path) -> str:
    parts = path.relative_to(SIM.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _unit(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 else module


def _imports(path: Path) -> list[str]:
    out: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            out.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                raise AssertionError(f"{path}: relative import (use absolute sim.* imports)")
            if node.module:
                out.append(node.module)
    return out


SOURCES = sorted(SIM.rglob("*.py"))


ARCHITECTURE = SIM.parent / "docs" / "architecture.md"


def documented_layers() -> dict[str, int]:
    """Unit -> layer as the layer table of docs/architecture.md states it (the ``sim`` names of each row)."""
    text = ARCHITECTURE.read_text(encoding="utf-8")
    table = text[text.index("| layer | units | what it is |") :].split("\n\n", 1)[0]
    out: dict[str, int] = {}
    for layer, units in re.findall(r"^\| (\d+) \| (.*?) \|", table, re.M):
        for unit in re.findall(r"`(sim(?:\.\w+)?)`", units):
            assert unit not in out, f"docs/architecture.md gives {unit} two layers"
            out[unit] = int(layer)
    return out


def test_the_architecture_layer_table_is_the_contract() -> None:
    documented = documented_layers()
    assert len(documented) >= 10, "docs/architecture.md: the layer table was not found"
    missing = sorted(set(LAYERS) - set(documented))
    extra = sorted(set(documented) - set(LAYERS))
    differ = sorted(
        f"{u}: doc {documented[u]}, test {LAYERS[u]}"
        for u in set(LAYERS) & set(documented)
        if documented[u] != LAYERS[u]
    )
    assert not missing, f"docs/architecture.md's layer table lacks {missing}"
    assert not extra, f"docs/architecture.md's layer table names units the contract does not: {extra}"
    assert not differ, f"docs/architecture.md and the contract disagree: {differ}"


def test_every_unit_has_a_layer() -> None:
    missing = sorted({_unit(_module_name(p)) for p in SOURCES} - set(LAYERS))
    assert not missing, f"give these a layer in tests/test_import_contract.py and docs/architecture.md: {missing}"


@pytest.mark.parametrize("path", SOURCES, ids=[str(p.relative_to(SIM.parent)) for p in SOURCES])
def test_no_upward_import(path: Path) -> None:
    unit = _unit(_module_name(path))
    layer = LAYERS.get(unit)
    if layer is None:
        pytest.skip(f"{unit} has no layer (test_every_unit_has_a_layer reports it)")
    upward = [m for m in _imports(path) if m.startswith("sim.") and LAYERS.get(_unit(m), 99) > layer]
    assert not upward, f"{path.name} ({unit}, layer {layer}) imports upward: {upward}"


@pytest.mark.parametrize(
    "path",
    [p for p in SOURCES if _unit(_module_name(p)) in CORE],
    ids=lambda p: str(p.relative_to(SIM.parent)),
)
def test_core_imports_only_the_core_and_no_heavy_libraries(path: Path) -> None:
    bad = []
    for module in _imports(path):
        if module.startswith("sim.") and _unit(module) not in CORE:
            bad.append(module)
        if module.split(".")[0] in CORE_FORBIDDEN_THIRD_PARTY:
            bad.append(module)
    assert not bad, f"{path.relative_to(SIM.parent)} (core) imports {bad}"


def test_importing_the_core_loads_no_edge_and_no_heavy_library() -> None:
    core_modules = sorted(_module_name(p) for p in SOURCES if _unit(_module_name(p)) in CORE)
    code = (
        "import importlib, json, sys\n"
        f"for m in {core_modules!r}: importlib.import_module(m)\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=SIM.parent)
    loaded = json.loads(done.stdout)
    edges = sorted(m for m in loaded if m.startswith("sim.") and _unit(m) not in CORE)
    heavy = sorted(m for m in loaded if m.split(".")[0] in CORE_FORBIDDEN_THIRD_PARTY)
    assert not edges, f"importing the core loaded edge modules: {edges}"
    assert not heavy, f"importing the core loaded: {heavy}"


def test_importing_the_sweep_driver_loads_no_pandas_or_matplotlib() -> None:
    """Only the sweep's table and plot modules (and what reads bundles) need them, and they load on use."""
    code = "import json, sys, sim.sweep, sim.sweep.batch\nprint(json.dumps(sorted(sys.modules)))\n"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=SIM.parent)
    loaded = json.loads(done.stdout)
    assert not [m for m in loaded if m.split(".")[0] in ("pandas", "matplotlib")]


#: "Analysis never runs the engine": it reads results and renders them, so it imports nothing that builds or
#: runs a scenario (a command that must rebuild part of a run, like ``explain``, does so in ``sim.api``).
ANALYSIS_MAY_NOT_IMPORT = ("sim.engine", "sim.connector", "sim.workload", "sim.config.load", "sim.config.scenario")


@pytest.mark.parametrize(
    "path",
    [p for p in SOURCES if _unit(_module_name(p)) == "sim.analysis"],
    ids=lambda p: str(p.relative_to(SIM.parent)),
)
def test_analysis_builds_and_runs_nothing(path: Path) -> None:
    bad = [m for m in _imports(path) if m.startswith(ANALYSIS_MAY_NOT_IMPORT)]
    assert not bad, f"{path.relative_to(SIM.parent)} (analysis: reads results only) imports {bad}"
