"""CSV cells never start a spreadsheet formula, and read back exactly (sim.trace.csvcell)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from hypothesis import given
from hypothesis import strategies as st

from sim.trace.csvcell import TRIGGERS, neutralise, restore


@given(st.text())
def test_round_trip_and_no_formula(text: str) -> None:
    cell = neutralise(text)
    assert restore(cell) == text
    assert not cell.startswith(("=", "+", "-", "@", "\t", "\r"))


def test_examples() -> None:
    assert neutralise("=HYPERLINK(1)") == "'=HYPERLINK(1)"
    assert neutralise("+cmd|' /C calc'!A0") == "'+cmd|' /C calc'!A0"
    assert neutralise("'quoted") == "''quoted"
    assert neutralise("r0") == "r0"
    assert set(TRIGGERS) >= {"=", "+", "-", "@"}


def test_a_bundle_csv_table_neutralises_ids_and_reads_them_back(tmp_path: Path) -> None:
    from sim.trace.bundle import read_table, write_table
    from sim.trace.tables import empty_table

    ids = ['=HYPERLINK("http://x")', "+cmd|' /C calc'!A0", "-2+3", "@SUM(A1)", "'q", "plain", "\tTAB"]
    frame = empty_table("requests", 1).reindex(range(len(ids)))
    frame = frame.assign(
        **{c: 0 for c in frame.columns if frame[c].dtype.kind in "iuf" or str(frame[c].dtype) == "Int64"}
    )
    frame["request_id"] = ids
    frame["outcome"] = "ok"
    frame["arrival_s"] = -1.5  # a number: written as a number, never quoted
    path = tmp_path / "requests.csv"
    write_table(frame, path, "csv")
    raw = pd.read_csv(path, dtype=str, keep_default_na=False)
    assert not raw["request_id"].str.match(r"^[=+\-@\t\r]").any()
    assert "\n-1.5," in path.read_text() or ",-1.5," in path.read_text()
    back = read_table("requests", path)
    assert sorted(back["request_id"]) == sorted(ids)
    assert (back["arrival_s"] == -1.5).all()
