import json
import os

import pandas as pd
import pytest

from sim.trace.bundle import LoadedResult, dumps_summary, load_result, write_result
from sim.trace.tables import TABLE_NAMES, tables_from_recorder

SCENARIO = "name: demo\nseed: 7\n"


def _write(path, recorder, fmt="parquet", **kw):
    return write_result(
        path,
        scenario_yaml=SCENARIO,
        summary=kw.pop("summary", {"crash": None, "b": 1.5}),
        tables=tables_from_recorder(recorder),
        tables_format=fmt,
        **kw,
    )


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_round_trip(tmp_path, recorder, fmt):
    _write(tmp_path / "run", recorder, fmt)
    files = sorted(p.name for p in (tmp_path / "run").iterdir())
    assert files == sorted(
        ["manifest.json", "scenario.resolved.yaml", "summary.json"] + [f"{n}.{fmt}" for n in TABLE_NAMES]
    )
    loaded = load_result(tmp_path / "run")
    expected = tables_from_recorder(recorder)
    for name in TABLE_NAMES:
        pd.testing.assert_frame_equal(getattr(loaded, name), expected[name], check_exact=True)
    assert loaded.summary == {"b": 1.5, "crash": None, "partial": False}
    assert loaded.scenario_yaml == SCENARIO and loaded.path == tmp_path / "run"
    assert loaded.partial is False and loaded.num_groups == 2


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_byte_identical_when_written_twice(tmp_path, recorder, fmt):
    _write(tmp_path / "a", recorder, fmt)
    _write(tmp_path / "b", recorder, fmt)
    for name in os.listdir(tmp_path / "a"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


def test_parquet_from_loaded_tables_is_byte_identical(tmp_path, recorder):
    """Re-writing what was read back gives the same bytes (no dtype drift through a round trip)."""
    _write(tmp_path / "a", recorder)
    loaded = load_result(tmp_path / "a")
    write_result(tmp_path / "b", scenario_yaml=SCENARIO, summary={"crash": None, "b": 1.5}, tables=loaded.tables)
    for name in TABLE_NAMES:
        assert (tmp_path / "a" / f"{name}.parquet").read_bytes() == (tmp_path / "b" / f"{name}.parquet").read_bytes()


def test_summary_json_is_deterministic_and_nan_free():
    text = dumps_summary({"z": float("nan"), "a": {"y": float("inf"), "b": (1, 2)}})
    assert text == '{\n  "a": {\n    "b": [\n      1,\n      2\n    ],\n    "y": null\n  },\n  "z": null\n}\n'
    with pytest.raises(ValueError, match="not JSON-able"):
        dumps_summary({"x": object()})


def test_partial_marker(tmp_path, recorder):
    _write(tmp_path / "run", recorder, partial=True)
    assert load_result(tmp_path / "run").partial is True
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["partial"] is True
    with pytest.raises(ValueError, match="contradicts"):
        _write(tmp_path / "run2", recorder, summary={"partial": False}, partial=True)


def test_refuses_to_write_outside(tmp_path, recorder):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    run = tmp_path / "run"
    run.mkdir()
    (run / "summary.json").symlink_to(outside / "summary.json")
    with pytest.raises(ValueError, match="summary.json, which hybridsim did not write"):
        _write(run, recorder)
    assert not (outside / "summary.json").exists()
    _write(run, recorder, force=True)  # the link is kept aside, never written through
    assert not (outside / "summary.json").exists() and (tmp_path / "run.old" / "summary.json").is_symlink()
    with pytest.raises(ValueError, match="unknown tables"):
        write_result(tmp_path / "x", scenario_yaml="", summary={}, tables={"../kv_events": pd.DataFrame()})


def test_format_switch_leaves_one_file_per_table(tmp_path, recorder):
    _write(tmp_path / "run", recorder, "parquet")
    _write(tmp_path / "run", recorder, "csv")
    assert not list((tmp_path / "run").glob("*.parquet"))
    (tmp_path / "run" / "steps.parquet").write_bytes(b"")
    with pytest.raises(ValueError, match="steps.parquet is not listed in manifest.json"):
        load_result(tmp_path / "run")
    with pytest.raises(ValueError, match="both steps.parquet and steps.csv"):
        load_result(tmp_path / "run", verify=False)


def test_load_errors_and_missing_tables(tmp_path, recorder):
    with pytest.raises(ValueError, match="does not exist"):
        load_result(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="summary.json is missing"):
        load_result(tmp_path / "empty")
    write_result(
        tmp_path / "some",
        scenario_yaml="",
        summary={"groups": ["full_attention", "mamba"]},
        tables={"kv_events": tables_from_recorder(recorder)["kv_events"]},
        tables_format="csv",
    )
    loaded = load_result(tmp_path / "some")
    assert len(loaded.kv_events) == 10 and loaded.admissions.empty
    assert loaded.group_kinds == ["full_attention", "mamba"]
    assert list(loaded.steps.columns)[-2:] == ["cached_g0", "cached_g1"]


def test_from_tables_wraps_in_memory_tables(recorder):
    res = LoadedResult.from_tables(tables_from_recorder(recorder), group_kinds=["full_attention", "mamba"])
    assert res.path is None and len(res.kv_events) == 10 and res.group_kinds == ["full_attention", "mamba"]


def test_the_bundle_parquet_writer_writes_the_bytes_of_pyarrow_parquet_s(tmp_path):
    """sim.trace.bundle.parquet_writer opens pyarrow._parquet's writer as pyarrow.parquet.ParquetWriter does with
    the bundle's options (without importing pyarrow.parquet): same file bytes, for every column type a bundle
    holds (with nulls, NaN, empty and repeated strings) and a table written in parts (several row groups)."""
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    from sim.trace.bundle import _PARQUET_OPTIONS, parquet_writer

    schema = pa.schema(
        [
            pa.field("i", pa.int64()),
            pa.field("f", pa.float64()),
            pa.field("b", pa.bool_()),
            pa.field("s", pa.string()),
        ]
    )
    n = 5000
    columns = [
        pa.array([None if k % 7 == 0 else k * 3 - 1000 for k in range(n)], pa.int64()),
        pa.array([None if k % 11 == 0 else (float("nan") if k % 13 == 0 else k / 7) for k in range(n)], pa.float64()),
        pa.array([None if k % 5 == 0 else k % 2 == 0 for k in range(n)], pa.bool_()),
        pa.array([None if k % 17 == 0 else ("" if k % 3 == 0 else f"req-{k % 40}") for k in range(n)], pa.string()),
    ]
    table = pa.Table.from_arrays(columns, schema=schema)
    parts = [table.slice(0, 1200), table.slice(1200, 3000), table.slice(4200)]

    def ours(pieces: list[pa.Table]) -> bytes:
        buf = io.BytesIO()
        writer = parquet_writer(buf, schema)
        for piece in pieces:
            writer.write_table(piece, row_group_size=1000)
        writer.close()
        return buf.getvalue()

    def pyarrows(pieces: list[pa.Table]) -> bytes:
        buf = io.BytesIO()
        with pq.ParquetWriter(buf, schema, **_PARQUET_OPTIONS) as writer:
            for piece in pieces:
                writer.write_table(piece, row_group_size=1000)
        return buf.getvalue()

    for pieces in ([table], parts, [table.slice(0, 0)]):
        assert ours(pieces) == pyarrows(pieces)
    back = pq.read_table(io.BytesIO(ours(parts)))
    assert back.num_rows == n and back.schema.equals(schema)
    assert back.column("s").to_pylist() == columns[3].to_pylist()
