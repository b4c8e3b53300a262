"""``sim.trace.recorder``: every hot row lands in its own column, whatever path appended it."""

from __future__ import annotations

import pytest

from sim.core.kv.block_pool import KVEvent, KVEventLog
from sim.trace.recorder import Recorder, admission_columns, step_columns
from tests.support.kv import event_log


def _rows(cols) -> list[dict]:
    n = len(cols)
    assert all(len(values) == n for values in cols.data.values()), {k: len(v) for k, v in cols.data.items()}
    return [{name: cols.data[name][i] for name in cols.names} for i in range(n)]


STEP = dict(duration_s=0.25, running=3, waiting=4, prefill_tokens=5, decode_tokens=6, free_blocks=7)


def test_step_rows_fill_each_column_with_its_own_value():
    rec = Recorder(num_groups=2)
    rec.set_clock(9, 1.5)
    rec.record_step(**STEP, blocks_per_group=(10, 11), cached_per_group=(20, 21))
    assert rec.steps.names == step_columns(2)
    assert _rows(rec.steps) == [
        {"step": 9, "time_s": 1.5, **STEP, "blocks_g0": 10, "blocks_g1": 11, "cached_g0": 20, "cached_g1": 21}
    ]


def test_a_step_row_must_fill_every_extension_column():
    rec = Recorder(num_groups=1)
    rec.record_step(**STEP, blocks_per_group=(1,), cached_per_group=(2,), extra={"offload_bytes": 8})
    rec.record_step(**STEP, blocks_per_group=(1,), cached_per_group=(2,), extra={"offload_bytes": 9})
    assert rec.steps.data["offload_bytes"] == [8, 9]
    with pytest.raises(KeyError, match="missing.*offload_bytes"):
        rec.record_step(**STEP, blocks_per_group=(1,), cached_per_group=(2,))
    rec.steps.add_column("late", None)  # added by someone else: the next row must fill it too
    with pytest.raises(KeyError, match="missing.*late"):
        rec.record_step(**STEP, blocks_per_group=(1,), cached_per_group=(2,), extra={"offload_bytes": 1})


def test_admission_rows_fill_each_column_with_its_own_value():
    rec = Recorder(num_groups=2)
    rec.set_clock(3, 0.5)
    values = dict(
        request_id="r",
        prompt_tokens=100,
        local_tokens=32,
        external_tokens=16,
        hit_diverged=1,
        fallback=0,
        policy="pr48425",
        outcome="ok",
        crash_reason="cr",
        kind="after_preemption",
        reason="why",
        num_computed_tokens=48,
        tokens_lost=2,
        taint_origin="t",
        lookup_seq=17,
        connector_asked_at=32,
        connector_answer=16,
    )
    rec.record_admission(hits=(64, 32), **values)
    assert rec.admissions.names == admission_columns(2)
    expected = {
        "step": 3,
        "time_s": 0.5,
        "hit_g0": 64,
        "hit_g1": 32,
        **values,
        "hit_diverged": True,
        "fallback": False,
        "claimed_boundary": 48,
    }
    assert _rows(rec.admissions) == [expected]
    with pytest.raises(ValueError, match="expected 2 per-group hits"):
        rec.record_admission(hits=(1,), **values)


def test_an_event_log_becomes_rows_stamped_with_the_clock_in_order():
    events = [KVEvent("stored", 0, 3, 99, "r0", "cache"), KVEvent("removed", 1, 4, 98, "r1", "evict_lru")]
    rec = Recorder(num_groups=2)
    rec.set_clock(2, 0.75)
    rec.record_kv_event_log(event_log(*events))
    rec.set_clock(3, 1.0)
    rec.record_kv_event_log(event_log(events[0]))
    rec.record_kv_event_log(KVEventLog())  # an empty log adds no row
    stamps = [(0, 2, 0.75), (1, 2, 0.75), (2, 3, 1.0)]
    assert _rows(rec.kv_events) == [
        {"seq": seq, "step": step, "time_s": t, **ev._asdict()}
        for (seq, step, t), ev in zip(stamps, [*events, events[0]])
    ]
    assert [(r["seq"], r["step"], r["kind"]) for r in _rows(rec.kv_events)] == [
        (0, 2, "stored"),
        (1, 2, "removed"),
        (2, 3, "stored"),
    ]


def test_positional_step_rows_equal_keyword_ones():
    by_name, by_position = Recorder(num_groups=2), Recorder(num_groups=2)
    by_name.record_step(**STEP, blocks_per_group=(10, 11), cached_per_group=(20, 21), extra={"offload_bytes": 3})
    by_position.record_step(*STEP.values(), (10, 11), (20, 21), {"offload_bytes": 3})
    assert _rows(by_name.steps) == _rows(by_position.steps)


def test_kv_events_are_packed_and_any_value_still_fits():
    """A long run records ~35 events per request, so the event fields are packed (int32 ids, uint64
    hashes, a byte-code per kind and cause); a value a packed column cannot hold (a missing hash, an id
    beyond int32, a 257th cause) is kept exactly, and the Arrow table is the same as from plain lists."""
    from array import array

    from sim.trace.schema import arrow_table, table_from_recorded

    rec = Recorder(num_groups=1)
    packed = [KVEvent("stored", 0, 3, 2**64 - 1, "r0", "cache"), KVEvent("removed", -1, -1, 0, "r1", "evict_lru")]
    rec.record_kv_event_log(event_log(*packed))
    table = rec.kv_events
    assert type(table.block_hash) is array and table.block_hash.itemsize == 8
    assert type(table.block_id) is array and table.block_id.itemsize == 4 and table.kind.codes.itemsize == 1
    exotic = [KVEvent("stored", 0, 2**40, None, "r2", f"cause{i}") for i in range(300)]  # type: ignore[arg-type]
    rec.record_kv_event_log(event_log(*exotic))
    assert type(table.block_hash) is list and type(table.block_id) is list and table.cause.codes.itemsize == 4
    rows = _rows(table)
    assert [{k: r[k] for k in KVEvent._fields} for r in rows] == [ev._asdict() for ev in packed + exotic]
    assert table_from_recorded("kv_events", table).equals(arrow_table("kv_events", table.data))


def test_kv_events_written_a_row_group_at_a_time_are_the_bytes_of_the_whole_table(tmp_path, monkeypatch):
    """The bundle writer takes ``kv_events`` from the packed recorder a row group at a time (a 1M-request run
    has 35M rows, about 3.5 GB as one Arrow table); the parts joined are the whole table, and the file is
    the same bytes as the whole table written at once."""
    import pyarrow as pa

    import sim.trace.schema as schema
    from sim.trace.bundle import write_table

    rec = Recorder(num_groups=2)
    for step in range(7):  # runs of 1..7 rows, so parts start and end inside runs
        rec.set_clock(step, step / 4)
        rec.record_kv_event_log(
            event_log(
                *[KVEvent("stored", i % 2, step * 10 + i, 2**63 + i, f"r{step}", "cache") for i in range(step + 1)]
            )
        )
    whole = schema.table_from_recorded("kv_events", rec.kv_events)
    parts = list(schema.kv_event_batches(rec.kv_events, rows=4))
    assert [p.num_rows for p in parts] == [4] * 7 and pa.concat_tables(parts).equals(whole)
    monkeypatch.setattr(schema, "ROW_GROUP_ROWS", 4)
    write_table(whole, tmp_path / "whole.parquet", "parquet")
    write_table(iter(parts), tmp_path / "parts.parquet", "parquet")
    write_table(iter(parts), tmp_path / "parts.csv", "csv")
    write_table(whole, tmp_path / "whole.csv", "csv")
    assert (tmp_path / "whole.parquet").read_bytes() == (tmp_path / "parts.parquet").read_bytes()
    assert (tmp_path / "whole.csv").read_bytes() == (tmp_path / "parts.csv").read_bytes()
    tables = schema.recorded_tables(rec)
    assert tables.recorded_kv_events is rec.kv_events and tables.num_rows("kv_events") == 28
    assert list(tables) == list(schema.TABLE_NAMES) and tables.arrow["kv_events"].equals(whole)
    assert tables.recorded_kv_events is None  # made whole once asked for, and kept
