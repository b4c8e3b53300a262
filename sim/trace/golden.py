"""Golden traces: checked-in ``kv_events.csv`` / ``admissions.csv`` of a fixed set of scenarios.

``python -m sim.trace.golden regenerate [--scenario NAME]`` re-runs each golden
scenario, prints what changed against the stored trace (the ``trace diff``
report, one per scenario) and overwrites ``results/golden/<name>/``;
``check`` re-runs and compares without writing, exiting 1 on any difference
(2 when a golden directory is missing or a scenario cannot be run).

A golden trace pins the *decisions* of a run (every cache event and every
admission), so any change to eviction order, hit lengths, policies or
outcomes shows up as a diff a reviewer must accept by regenerating. The
golden set is fixed here (not globbed) so that adding a scenario never
silently adds an unreviewed golden trace.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from sim.trace.bundle import write_table
from sim.trace.diff import DiffReport, diff_traces
from sim.trace.tables import normalize_table

REPO_ROOT = Path(__file__).resolve().parents[2]
SCENARIO_ROOT = REPO_ROOT / "scenarios"
GOLDEN_ROOT = REPO_ROOT / "results" / "golden"

#: The tables a golden trace stores (the run's decisions, not its timings' derived metrics).
GOLDEN_TABLES: tuple[str, ...] = ("kv_events", "admissions")

#: Scenario files (relative to ``scenarios/``) whose traces are golden.
GOLDEN_SCENARIOS: tuple[str, ...] = (
    "repro/divergence-fa-deeper.yaml",
    "repro/divergence-mamba-deeper.yaml",
    "repro/pr48425-fa-deeper-ext0.yaml",
    "repro/pr48425-mamba-deeper-ext0.yaml",
    "repro/pr48425-mamba-deeper-ext16.yaml",
    "repro/taint-propagation.yaml",
    "golden-pressure.yaml",
)


@dataclass(frozen=True)
class GoldenScenario:
    """One golden scenario: its name (the golden directory's name) and its YAML file."""

    name: str
    path: Path

    @property
    def golden_dir(self) -> Path:
        return GOLDEN_ROOT / self.name


def golden_scenarios(only: Sequence[str] = ()) -> list[GoldenScenario]:
    """The golden set (or the named members of it); ``ValueError`` for an unknown name."""
    all_ = [GoldenScenario(Path(rel).stem, SCENARIO_ROOT / rel) for rel in GOLDEN_SCENARIOS]
    if not only:
        return all_
    names = {g.name for g in all_}
    unknown = [n for n in only if n not in names]
    if unknown:
        raise ValueError(f"unknown golden scenario(s) {unknown}; golden scenarios: {', '.join(sorted(names))}")
    return [g for g in all_ if g.name in only]


def write_trace(scenario: GoldenScenario, out_dir: Path) -> Path:
    """Run ``scenario`` (no bundle, no plots) and write its golden tables as CSV into ``out_dir``."""
    from sim.api import run_scenario

    result = run_scenario(scenario.path)
    out_dir.mkdir(parents=True, exist_ok=True)
    for table in GOLDEN_TABLES:
        write_table(normalize_table(table, result.tables[table]), out_dir / f"{table}.csv", "csv")
    return out_dir


def check_scenario(scenario: GoldenScenario) -> DiffReport:
    """Re-run ``scenario`` and compare its trace with the stored golden one (stored = A, fresh = B)."""
    with tempfile.TemporaryDirectory(prefix=f"golden-{scenario.name}-") as tmp:
        fresh = write_trace(scenario, Path(tmp))
        return diff_traces(scenario.golden_dir, fresh, tables=GOLDEN_TABLES)


def regenerate(only: Sequence[str] = (), out=sys.stdout) -> int:
    """Rewrite the golden traces, printing each scenario's diff against the old one. Returns 0."""
    for scenario in golden_scenarios(only):
        if all((scenario.golden_dir / f"{t}.csv").is_file() for t in GOLDEN_TABLES):
            report = check_scenario(scenario)
            verdict = "unchanged" if report.identical else "CHANGED"
            out.write(f"== {scenario.name}: {verdict}\n")
            if not report.identical:
                out.write(report.format())
        else:
            out.write(f"== {scenario.name}: new\n")
        write_trace(scenario, scenario.golden_dir)
    return 0


def check(only: Sequence[str] = (), out=sys.stdout) -> int:
    """Compare every golden scenario with its stored trace; 0 all identical, 1 some differ, 2 missing."""
    worst = 0
    for scenario in golden_scenarios(only):
        if not scenario.golden_dir.is_dir():
            out.write(f"== {scenario.name}: no golden trace in {scenario.golden_dir} (run `regenerate`)\n")
            worst = max(worst, 2)
            continue
        report = check_scenario(scenario)
        out.write(f"== {scenario.name}: {'identical' if report.identical else 'DIFFERENT'}\n")
        if not report.identical:
            out.write(report.format())
            worst = max(worst, 1)
    return worst


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m sim.trace.golden regenerate|check [--scenario NAME ...]``."""
    parser = argparse.ArgumentParser(prog="python -m sim.trace.golden", description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=("regenerate", "check"))
    parser.add_argument("--scenario", action="append", default=[],
                        help="only this golden scenario (repeatable); default: all")
    args = parser.parse_args(argv)
    try:
        if args.command == "regenerate":
            return regenerate(args.scenario)
        return check(args.scenario)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
