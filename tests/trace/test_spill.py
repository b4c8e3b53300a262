"""The ``steps`` spill (sim/trace/spill.py): a run's ``steps`` rows leave memory a row group at a time and
come back as the same table, and the bundle's bytes are those of the table written whole."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

import sim.trace.schema as schema
from sim.api import RunOptions, run_scenario
from sim.trace.recorder import Recorder
from sim.trace.schema import recorded_tables
from sim.trace.spill import ArrowSpill

SCENARIO = Path(__file__).resolve().parents[2] / "scenarios" / "demo-pressure.yaml"


def _record_steps(spill: ArrowSpill | None, rows: int, extra: bool = False) -> Recorder:
    rec = Recorder(3, spill=spill)
    for i in range(rows):
        rec.set_clock(i, i * 0.5)
        hits, cached = [i, i + 1, i + 2], [3, 4, i]
        rec.record_step(0.1 * i, i % 7, i % 5, i, i + 1, 1000 - i % 100, hits, cached, {"x_tier": i} if extra else None)
    return rec


def test_spilled_steps_come_back_as_the_same_table() -> None:
    spilled, whole = _record_steps(ArrowSpill(rows=1000), 2500), _record_steps(None, 2500)
    assert (spilled.steps.spilled, len(spilled.steps)) == (2000, 500)  # two groups out, the rest held
    tables, expected = recorded_tables(spilled), recorded_tables(whole)
    assert tables.num_rows("steps") == 2500
    assert [t.num_rows for t in tables.batches("steps")] == [1000, 1000, 500]
    assert tables.table("steps").equals(expected.table("steps"))


def test_a_table_with_extension_columns_is_not_spilled() -> None:
    """A connector's columns infer their dtype from all values: such a ``steps`` table stays whole."""
    rec = _record_steps(ArrowSpill(rows=100), 250, extra=True)
    assert (rec.steps.spilled, len(rec.steps)) == (0, 250)
    with pytest.raises(ValueError, match="after 200 rows were spilled"):
        _record_steps(ArrowSpill(rows=100), 250).steps.add_column("late", None)


def _steps_bytes(out: Path) -> str:
    return hashlib.sha256((out / "steps.parquet").read_bytes()).hexdigest()


def test_a_run_spills_its_steps_and_writes_the_same_bundle(tmp_path: Path, monkeypatch) -> None:
    """With row groups of 64 rows the demo's ~1k steps spill; the bundle is byte for byte the unspilled one's
    (the same row groups, each spilled group read back as its own)."""
    monkeypatch.setattr(schema, "ROW_GROUP_ROWS", 64)
    options = RunOptions(write_plots=False)
    spilled = run_scenario(SCENARIO, tmp_path / "spilled", options=options)
    assert spilled.summary["num_steps"] > 3 * 64
    monkeypatch.setattr(ArrowSpill, "spill", lambda self, table, columns: None)
    whole = run_scenario(SCENARIO, tmp_path / "whole", options=options)
    assert spilled.summary == whole.summary
    assert _steps_bytes(tmp_path / "spilled") == _steps_bytes(tmp_path / "whole")
    assert (tmp_path / "spilled" / "manifest.json").read_bytes() == (tmp_path / "whole" / "manifest.json").read_bytes()
