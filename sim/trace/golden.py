"""Golden traces: checked-in ``kv_events.csv`` / ``admissions.csv`` of a fixed set of scenarios.

This module defines the golden set and how a trace is stored and compared;
it runs nothing. ``hybridsim golden regenerate|check`` (:mod:`sim.sweep.golden`)
runs the scenarios through the batch driver and uses these pieces.

A golden trace pins the *decisions* of a run (every cache event and every
admission), so any change to eviction order, hit lengths, policies or
outcomes shows up as a diff a reviewer must accept by regenerating. The
golden set is fixed here (not globbed) so that adding a scenario never
silently adds an unreviewed golden trace.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import pandas as pd

from sim.trace.bundle import write_table
from sim.trace.diff import DiffReport, diff_traces
from sim.trace.tables import normalize_table

#: Default roots, relative to the current directory (the repository's root in a checkout).
DEFAULT_SCENARIO_ROOT = Path("scenarios")
DEFAULT_GOLDEN_ROOT = Path("results") / "golden"

#: The ``kind`` of a golden folder's ``manifest.json`` (tables only: no summary).
GOLDEN_KIND = "golden"

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
    """One golden scenario: its name, its YAML file and the directory of its stored trace."""

    name: str
    path: Path
    golden_dir: Path

    def has_trace(self) -> bool:
        """Whether every golden table is stored."""
        return all((self.golden_dir / f"{t}.csv").is_file() for t in GOLDEN_TABLES)


def golden_scenarios(
    only: Sequence[str] = (),
    *,
    scenario_root: Path = DEFAULT_SCENARIO_ROOT,
    golden_root: Path = DEFAULT_GOLDEN_ROOT,
) -> list[GoldenScenario]:
    """The golden set (or the named members of it); ``ValueError`` for an unknown name."""
    all_ = [
        GoldenScenario(Path(rel).stem, Path(scenario_root) / rel, Path(golden_root) / Path(rel).stem)
        for rel in GOLDEN_SCENARIOS
    ]
    if not only:
        return all_
    names = {g.name for g in all_}
    unknown = [n for n in only if n not in names]
    if unknown:
        raise ValueError(f"unknown golden scenario(s) {unknown}; golden scenarios: {', '.join(sorted(names))}")
    return [g for g in all_ if g.name in only]


def write_golden_tables(tables: Mapping[str, pd.DataFrame], out_dir: Path) -> Path:
    """Write the golden tables of a run's ``tables`` as normalized CSV into ``out_dir`` (a new folder, or a
    stage of :func:`sim.trace.atomic.staged_bundle`)."""
    out_dir = Path(out_dir)
    for table in GOLDEN_TABLES:
        write_table(normalize_table(table, tables[table]), out_dir / f"{table}.csv", "csv")
    return out_dir


def compare(stored: Path, fresh: Path) -> DiffReport:
    """The golden tables of ``stored`` (A) against ``fresh`` (B)."""
    return diff_traces(stored, fresh, tables=GOLDEN_TABLES)
