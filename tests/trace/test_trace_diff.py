import pandas as pd
import pytest

from sim.trace.bundle import write_result
from sim.trace.diff import TraceDiffError, diff_traces, main
from sim.trace.tables import tables_from_recorder


def _bundle(path, tables, fmt="parquet"):
    write_result(path, scenario_yaml="", summary={}, tables=tables, tables_format=fmt)
    return path


def test_identical_across_formats(tmp_path, recorder):
    t = tables_from_recorder(recorder)
    a = _bundle(tmp_path / "a", t, "parquet")
    b = _bundle(tmp_path / "b", t, "csv")
    report = diff_traces(a, b, tables=("kv_events", "admissions", "requests", "schedule", "steps"))
    assert report.identical
    assert all(d.first_row is None for d in report.tables)
    assert "traces are identical" in report.format()
    assert main([str(a), str(b)]) == 0


def test_changed_kv_event_reports_first_difference_with_context(tmp_path, recorder, capsys):
    t = tables_from_recorder(recorder)
    a = _bundle(tmp_path / "a", t)
    changed = dict(t)
    kv = t["kv_events"].copy()
    kv.loc[kv["seq"] == 5, "block_id"] = 99
    kv.loc[kv["seq"] == 7, "cause"] = "evict_lru"  # a later difference must not hide the first
    changed["kv_events"] = kv
    b = _bundle(tmp_path / "b", changed)
    report = diff_traces(a, b, context=2)
    kvd, admd = report.tables
    assert admd.identical and not report.identical
    assert kvd.first_row == 5 and kvd.key == {"seq": 5, "step": 2} and kvd.columns == ["block_id"]
    assert kvd.context_a["seq"].tolist() == [3, 4, 5, 6, 7]
    assert kvd.context_b["block_id"].tolist() == [21, 12, 99, 13, 23]
    text = report.format()
    assert "first difference at row 5 (seq=5, step=2); columns differ: block_id" in text
    assert ">-        5" in text and ">+        5" in text
    assert main([str(a), str(b), "--context", "1"]) == 1
    assert "kv_events: DIFFERENT" in capsys.readouterr().out


def test_extra_rows_and_extra_columns(tmp_path, recorder):
    t = tables_from_recorder(recorder)
    a = _bundle(tmp_path / "a", t)
    shorter = dict(t)
    shorter["kv_events"] = t["kv_events"].iloc[:8]
    adm = t["admissions"].copy()
    adm["score"] = 1.0
    shorter["admissions"] = adm
    b = _bundle(tmp_path / "b", shorter)
    kvd, admd = diff_traces(a, b).tables
    assert (kvd.rows_a, kvd.rows_b, kvd.first_row, kvd.columns) == (10, 8, 8, [])
    assert kvd.key == {"seq": 8, "step": 4}
    assert admd.only_in_b == ["score"] and admd.first_row is None and not admd.identical


def test_golden_dir_with_some_csvs(tmp_path, recorder):
    t = tables_from_recorder(recorder)
    run = _bundle(tmp_path / "run", t)
    golden = tmp_path / "golden"
    golden.mkdir()
    t["kv_events"].to_csv(golden / "kv_events.csv", index=False, lineterminator="\n")
    assert diff_traces(run, golden, tables=("kv_events",)).identical
    assert main([str(run), str(golden), "--tables", "kv_events"]) == 0
    with pytest.raises(TraceDiffError, match="table 'admissions' not found"):
        diff_traces(run, golden)
    assert main([str(run), str(golden)]) == 2


def test_errors_exit_2(tmp_path, recorder, capsys):
    run = _bundle(tmp_path / "run", tables_from_recorder(recorder))
    assert main([str(run), str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main([str(run), str(run), "--tables", "events"]) == 2
    (tmp_path / "bad").mkdir()
    pd.DataFrame({"seq": ["x"]}).to_csv(tmp_path / "bad" / "kv_events.csv", index=False)
    assert main([str(run), str(tmp_path / "bad"), "--tables", "kv_events"]) == 2
