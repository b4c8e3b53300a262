"""``hybridsim golden regenerate|check``: run the golden scenarios through the batch driver.

``check`` re-runs every golden scenario (or the named ones) and compares its
trace with the stored one, printing the ``trace diff`` report of each that
differs; it returns 0 when all are identical, 1 when some differ, 2 when a
stored trace is missing. ``regenerate`` prints the same comparison and then
overwrites the stored traces. Paths come from the arguments (defaults:
``scenarios/`` and ``results/golden/`` under the current directory).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Sequence, TextIO

from sim.sweep.batch import BatchRun, run_batch
from sim.sweep.executors import Executor
from sim.trace.bundle import load_result
from sim.trace.golden import (
    DEFAULT_GOLDEN_ROOT,
    DEFAULT_SCENARIO_ROOT,
    GoldenScenario,
    compare,
    golden_scenarios,
    write_golden_tables,
)

#: Golden runs need their tables only.
RUN_OVERRIDES: tuple[str, ...] = ("outputs.plots=false",)


def fresh_traces(
    scenarios: Sequence[GoldenScenario], work_dir: Path, *, executor: str | Executor = "serial", jobs: int | None = None
) -> dict[str, Path]:
    """Run ``scenarios`` and write each one's golden tables into ``work_dir/<name>/golden``; name -> that dir."""
    bundles = run_batch(
        [BatchRun(g.name, g.path, RUN_OVERRIDES) for g in scenarios], Path(work_dir), executor=executor, jobs=jobs
    )
    return {name: write_golden_tables(load_result(path).tables, path / "golden") for name, path in bundles.items()}


def check(
    only: Sequence[str] = (),
    *,
    scenario_root: Path = DEFAULT_SCENARIO_ROOT,
    golden_root: Path = DEFAULT_GOLDEN_ROOT,
    executor: str | Executor = "serial",
    jobs: int | None = None,
    out: TextIO | None = None,
) -> int:
    """Compare every golden scenario with its stored trace; 0 all identical, 1 some differ, 2 missing."""
    out = out or sys.stdout
    scenarios = golden_scenarios(only, scenario_root=scenario_root, golden_root=golden_root)
    worst = 0
    present = []
    for g in scenarios:
        if g.golden_dir.is_dir():
            present.append(g)
        else:
            out.write(f"== {g.name}: no golden trace in {g.golden_dir} (run `hybridsim golden regenerate`)\n")
            worst = 2
    with tempfile.TemporaryDirectory(prefix="golden-check-") as tmp:
        fresh = fresh_traces(present, Path(tmp), executor=executor, jobs=jobs)
        for g in present:
            report = compare(g.golden_dir, fresh[g.name])
            out.write(f"== {g.name}: {'identical' if report.identical else 'DIFFERENT'}\n")
            if not report.identical:
                out.write(report.format())
                worst = max(worst, 1)
    return worst


def regenerate(
    only: Sequence[str] = (),
    *,
    scenario_root: Path = DEFAULT_SCENARIO_ROOT,
    golden_root: Path = DEFAULT_GOLDEN_ROOT,
    executor: str | Executor = "serial",
    jobs: int | None = None,
    out: TextIO | None = None,
) -> int:
    """Rewrite the golden traces, printing each scenario's diff against the old one. Returns 0."""
    out = out or sys.stdout
    scenarios = golden_scenarios(only, scenario_root=scenario_root, golden_root=golden_root)
    with tempfile.TemporaryDirectory(prefix="golden-regenerate-") as tmp:
        fresh = fresh_traces(scenarios, Path(tmp), executor=executor, jobs=jobs)
        for g in scenarios:
            if g.has_trace():
                report = compare(g.golden_dir, fresh[g.name])
                out.write(f"== {g.name}: {'unchanged' if report.identical else 'CHANGED'}\n")
                if not report.identical:
                    out.write(report.format())
            else:
                out.write(f"== {g.name}: new\n")
            g.golden_dir.mkdir(parents=True, exist_ok=True)
            for table in fresh[g.name].iterdir():
                (g.golden_dir / table.name).write_bytes(table.read_bytes())
    return 0
