"""The spill (sim/trace/spill.py): a run's ``steps`` and ``kv_events`` rows leave memory a row group at a time
and come back as the same table, and the bundle's bytes are those of the table written whole."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from support.cli import CRASHING

import sim.trace.schema as schema
from sim.api import RunOptions, run_scenario
from sim.results.metrics import run_summary
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


def _record_events(spill: ArrowSpill | None, logs: int) -> Recorder:
    """``logs`` event logs of 1 to 7 rows: stored, removed (two causes, two groups) and cleared events."""
    rec = Recorder(2, spill=spill)
    for i in range(logs):
        rec.set_clock(i, i * 0.25)
        n = 1 + i % 7
        kinds = [("stored", "removed", "removed", "cleared")[(i + j) % 4] for j in range(n)]
        log = SimpleNamespace(
            kind=kinds,
            group=[(i + j) % 2 for j in range(n)],
            block_id=[i + j for j in range(n)],
            block_hash=[(i * 7919 + j) << 40 for j in range(n)],
            request_id=[f"r{i % 5}"] * n,
            cause=[("evicted", "freed")[(i * j) % 2] if k == "removed" else "" for j, k in enumerate(kinds)],
        )
        rec.record_kv_event_log(_Log(log, n))
    return rec


class _Log:
    def __init__(self, ns: SimpleNamespace, n: int) -> None:
        self.kind, self.group, self.block_id = ns.kind, ns.group, ns.block_id
        self.block_hash, self.request_id, self.cause = ns.block_hash, ns.request_id, ns.cause
        self._n = n

    def __len__(self) -> int:
        return self._n


def test_spilled_kv_events_come_back_as_the_same_table_and_counts() -> None:
    """Groups of 100 rows leave as the log runs cross them (a run split in two keeps its stamp); ``seq``
    goes on from the spilled rows (``len`` is the next seq, as ``lookup_seq`` reads it); the summary's
    eviction counts are the unspilled table's."""
    spilled, whole = _record_events(ArrowSpill(rows=100), 200), _record_events(None, 200)
    events = spilled.kv_events
    assert len(events) == len(whole.kv_events) == 794
    assert (events.spilled, events.held) == (700, 94)
    tables, expected = recorded_tables(spilled), recorded_tables(whole)
    assert tables.num_rows("kv_events") == 794
    assert [t.num_rows for t in tables.batches("kv_events")] == [100] * 7 + [94]
    assert tables.table("kv_events").equals(expected.table("kv_events"))
    groups = ["full_attention", "mamba"]
    assert (
        run_summary(recorded_tables(spilled), group_kinds=groups)["evictions"]
        == run_summary(recorded_tables(whole), group_kinds=groups)["evictions"]
    )
    assert sum(events.removed_spilled.values()) > 0


def test_kv_events_spilled_to_the_last_row_write_no_empty_group(tmp_path: Path) -> None:
    spilled, whole = _record_events(ArrowSpill(rows=794), 200), _record_events(None, 200)
    assert (spilled.kv_events.spilled, spilled.kv_events.held) == (794, 0)
    assert [t.num_rows for t in recorded_tables(spilled).batches("kv_events")] == [794]
    assert recorded_tables(spilled).table("kv_events").equals(recorded_tables(whole).table("kv_events"))


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
    for name in ("kv_events", "admissions", "requests", "summary"):
        suffix = ".json" if name == "summary" else ".parquet"
        assert (tmp_path / "spilled" / f"{name}{suffix}").read_bytes() == (
            tmp_path / "whole" / f"{name}{suffix}"
        ).read_bytes()
    assert (tmp_path / "spilled" / "manifest.json").read_bytes() == (tmp_path / "whole" / "manifest.json").read_bytes()


def _bundle_files(out: Path) -> dict[str, bytes]:
    """Every file of a bundle (the bundle's own path, which ``crash.json`` names, taken out)."""
    own = str(out).encode()
    files = {
        str(p.relative_to(out)): p.read_bytes().replace(own, b"OUT") for p in sorted(out.rglob("*")) if p.is_file()
    }
    manifest = json.loads(files.pop("manifest.json"))  # its hashes of the crash.json files cover that path
    manifest["files"] = {name: sha for name, sha in manifest["files"].items() if "crash.json" not in name}
    files["manifest.json"] = json.dumps(manifest, sort_keys=True).encode()
    return files


@pytest.mark.parametrize(
    ("scenario", "rows"),
    [
        ("repro/pr48425-mamba-deeper-ext16.yaml", 2),
        ("repro/taint-propagation.yaml", 3),
        ("golden-pressure.yaml", 16),
        ("crash", 1),
        ("crash", 2),
    ],
)
def test_a_run_that_spills_every_table_writes_the_same_bundle(
    tmp_path: Path, monkeypatch, scenario: str, rows: int
) -> None:
    """Row groups of a few rows: ``kv_events``, ``admissions`` and ``steps`` spill during the run (a crashing
    run's ``crash.json`` reads the crashing admission back from the spill); every file of the bundle is the
    unspilled run's, byte for byte."""
    monkeypatch.setattr(schema, "ROW_GROUP_ROWS", rows)
    path = SCENARIO.parent / scenario
    if scenario == "crash":
        path = tmp_path / "crash.yaml"
        path.write_text(CRASHING)
    options = RunOptions(write_plots=False)
    spilled_tables: set[str] = set()
    spill = ArrowSpill.spill

    def counting(self: ArrowSpill, table: str, columns: object) -> None:
        before = columns.spilled  # type: ignore[attr-defined]
        spill(self, table, columns)  # type: ignore[arg-type]
        if columns.spilled > before:  # type: ignore[attr-defined]
            spilled_tables.add(table)

    monkeypatch.setattr(ArrowSpill, "spill", counting)
    spilled = run_scenario(path, tmp_path / "spilled", options=options)
    assert spilled_tables == {"kv_events", "admissions", "steps"}
    monkeypatch.setattr(ArrowSpill, "spill", lambda self, table, columns: None)
    whole = run_scenario(path, tmp_path / "whole", options=options)
    assert spilled.summary == whole.summary
    assert spilled.crash_detail == whole.crash_detail
    assert (scenario == "crash") == (spilled.crash_detail is not None and "hits" in spilled.crash_detail)
    assert _bundle_files(tmp_path / "spilled") == _bundle_files(tmp_path / "whole")


def test_the_rows_held_at_the_end_of_a_run_that_spilled_are_flushed_as_its_last_group() -> None:
    """After the run the held ``steps`` rows join the spill as the last group (not held twice, as recorder
    columns and as an Arrow table, while the bundle is written); a table that never spilled stays held."""
    rec = _record_steps(ArrowSpill(rows=1000), 2500)
    for i in range(3):
        rec.set_clock(i, 0.0)
        rec.record_admission(
            request_id=f"r{i}", prompt_tokens=8, hits=[0, 0, 0], local_tokens=0, external_tokens=0,
            hit_diverged=False, fallback=False, policy="p", outcome="ok",
        )  # fmt: skip
    tables = recorded_tables(rec)
    assert (rec.steps.spilled, len(rec.steps)) == (2500, 0)
    assert (rec.admissions.spilled, len(rec.admissions)) == (0, 3)
    assert [t.num_rows for t in tables.batches("steps")] == [1000, 1000, 500]
    assert tables.table("steps").equals(recorded_tables(_record_steps(None, 2500)).table("steps"))
    assert tables.column("steps", "step").to_pylist() == list(range(2500))
    with pytest.raises(AssertionError, match="after the spill was read back"):  # its stream has ended
        for i in range(2500, 3500):
            rec.set_clock(i, i * 0.5)
            rec.record_step(0.1, 0, 0, 0, 0, 0, [0, 0, 0], [0, 0, 0])
