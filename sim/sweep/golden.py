"""``hybridsim golden regenerate|check``: run the golden scenarios through the batch driver.

``check`` re-runs every golden scenario (or the named ones) and compares its
trace with the stored one, printing the ``trace diff`` report of each that
differs; it returns 0 when all are identical, 1 when some differ, 2 when a
stored trace is missing. ``regenerate`` prints the same comparison and then
replaces each stored trace folder whole (:func:`sim.trace.atomic.staged_bundle`: a ``manifest.json`` of
kind ``golden`` lists each CSV with its hash; a link, a user's file or an edited CSV there is refused
before anything runs unless ``force``, then kept aside in ``<folder>.old``). Paths come from the arguments (defaults:
``scenarios/`` and ``results/golden/`` under the current directory).
"""

from __future__ import annotations

import os
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
    GOLDEN_KIND,
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
    force: bool = False,
) -> list[str]:
    """Rewrite the golden traces, printing each scenario's diff against the old one. Returns the writer's
    notes (what was kept aside)."""
    from sim.trace.atomic import OutputFolderError, check_output_folder, staged_bundle
    from sim.trace.output import write_file

    out = out or sys.stdout
    scenarios = golden_scenarios(only, scenario_root=scenario_root, golden_root=golden_root)
    for g in scenarios:  # before anything runs
        try:
            check_output_folder(Path(os.path.abspath(g.golden_dir)), force=force)
        except OutputFolderError as exc:
            raise OutputFolderError(f"--golden-dir: {exc}") from None
    notes: list[str] = []
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
            with staged_bundle(g.golden_dir, force=force) as stage:
                stage.kind = GOLDEN_KIND
                for table in sorted(fresh[g.name].iterdir()):
                    write_file(stage.path / table.name, table.read_bytes(), stamped=False)
                stage.finish()
            notes.extend(stage.notes)
    return notes
