"""The import budget of the cheap commands, by module set, not by time (docs/speed.md).

``hybridsim --help`` imports no simulator stage and none of the heavy libraries; ``hybridsim validate`` loads
and checks a scenario without the table, plotting or event libraries. A run that writes Parquet needs no
pandas either (tests/trace/test_trace_tables.py).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: Libraries neither command may import.
HEAVY = ("pandas", "pyarrow", "matplotlib", "simpy", "scipy")


#: Simulator stages and the modules that read tables (``sim.trace.atomic``, the stdlib-only folder checks, may load).
STAGES = (
    "sim.core",
    "sim.engine",
    "sim.config",
    "sim.workload",
    "sim.results",
    "sim.analysis",
    "sim.trace.bundle",
    "sim.trace.schema",
    "sim.trace.tables",
    "sim.trace.diff",
)


def _imported(*args: str, code: int = 0) -> set[str]:
    """The modules ``python -m sim ARGS`` imports (from ``-X importtime``, which lists every one)."""
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "sim", *args], cwd=ROOT, capture_output=True, text=True
    )
    assert proc.returncode == code, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("import time:") and "|" in line]
    return {line.rsplit("|", 1)[1].strip() for line in lines}


def _top_level(modules: set[str]) -> set[str]:
    return {m.split(".")[0] for m in modules}


def test_help_imports_no_heavy_library_and_no_simulator_stage():
    modules = _imported("--help")
    assert "typer" in _top_level(modules)  # the parse is real: -X importtime listed the imports
    assert not _top_level(modules) & {*HEAVY, "numpy", "pydantic"}, sorted(_top_level(modules) & {*HEAVY, "numpy"})
    stages = {m for m in modules if m.startswith(STAGES)}
    assert not stages, sorted(stages)


@pytest.mark.parametrize("scenario", ["benchmarks/scenarios/step-fa-1000.yaml", "scenarios/golden-pressure.yaml"])
def test_validate_imports_no_table_plot_or_event_library(scenario):
    modules = _imported("validate", scenario)
    assert "sim.config.scenario" in modules
    assert not _top_level(modules) & set(HEAVY), sorted(_top_level(modules) & set(HEAVY))


def test_a_failing_validate_imports_no_table_plot_or_event_library():
    """A bad input's one-line error needs no library to catch it (the simulator's errors are ValueErrors):
    catching TraceDiffError by name imported sim.trace.diff and pandas, 0.3 s of every failing command."""
    modules = _imported("validate", "no-such-scenario.yaml", code=2)
    assert not _top_level(modules) & set(HEAVY), sorted(_top_level(modules) & set(HEAVY))


def test_trace_diff_default_tables_are_the_diff_modules():
    """The CLI spells ``trace diff``'s default tables out (so --help need not import pandas): the same list."""
    from sim.cli.bundles import DIFF_TABLES
    from sim.trace.diff import DEFAULT_TABLES

    assert DIFF_TABLES == ",".join(DEFAULT_TABLES)


def test_scenario_models_build_no_validator_at_import():
    """Every scenario model defers its validator (``defer_build``): importing the config builds none, loading a
    scenario builds Scenario's (whose schema holds the others), not one per model."""
    probe = (
        "import pydantic, sim.config.scenario as s, sim.workload.spec as w, sim.config.cluster as c\n"
        "models = [v for m in (s, w, c) for v in vars(m).values()\n"
        "          if isinstance(v, type) and issubclass(v, pydantic.BaseModel) and v.__module__ == m.__name__]\n"
        "built = [m.__name__ for m in models if m.__pydantic_complete__]\n"
        "from sim.config import load_scenario\n"
        "load_scenario('benchmarks/scenarios/step-fa-1000.yaml', [])\n"
        "print(len(models) > 40, built, s.Scenario.__pydantic_complete__)\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True)
    assert out.stdout.strip() == "True [] True", out.stdout + out.stderr[-2000:]
