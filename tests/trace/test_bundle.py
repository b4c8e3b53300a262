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
