"""The cross-run comparison (sim.analysis.compare): layout, differences, ratios and every output format."""

from __future__ import annotations

import csv
import io
import json

import pytest
from rich.console import Console
from rich.table import Table
from rich.text import Text

from sim.analysis.compare import compare, table_rows, to_csv, to_json, to_markdown

NEMOTRON = ["mamba"] * 6 + ["full_attention"]


def _summary(ttft: float = 0.05, fa: float = 0.5, **extra):
    base = {
        "status": "complete",
        "clock": "time",
        "policy": "pr48425",
        "groups": NEMOTRON,
        "requests": {"finished": 3, "total": 3, "by_outcome": {"ok": 3}, "preemptions": 0},
        "latency_s": {
            "ttft": {"p50": ttft, "p95": 2 * ttft, "p99": 3 * ttft},
            "tpot": {"p50": 0.01, "p95": 0.02, "p99": 0.03},
            "e2e": {"p50": 1.0, "p95": 2.0, "p99": 3.0},
            "queueing": {"p50": 0.0, "p95": 0.001, "p99": 0.002},
        },
        "cache": {"hit_rate": {**{f"g{i}": 0.25 for i in range(6)}, "g6": fa}, "local_rate": 0.25},
        "admissions": {"by_outcome": {"ok": 3}, "divergences": {"mamba_deeper": 1, "fa_deeper": 2}},
        "crash": None,
    }
    base.update(extra)
    return base


def _row(comparison, metric):
    return next(r for r in comparison.rows if r.metric == metric)


def test_metrics_are_rows_and_runs_are_columns_with_every_percentile():
    c = compare({"a": _summary(), "b": _summary(), "c": _summary()})
    assert c.runs == ("a", "b", "c")
    metrics = [r.metric for r in c.rows]
    for name in ("TTFT", "TPOT", "E2E", "queueing"):
        for p in ("p50", "p95", "p99"):
            assert f"{name} {p}" in metrics
    assert {"hit rate FA", "hit rate Mamba", "requests ok", "divergences mamba-deeper"} <= set(metrics)
    assert "hit rate SWA" not in metrics  # no run has a sliding-window group
    assert all(len(r.cells) == 3 for r in c.rows)


def test_only_differences_beyond_the_tolerance_are_marked_with_the_ratio_to_the_first_run():
    c = compare({"base": _summary(ttft=0.1), "near": _summary(ttft=0.101), "far": _summary(ttft=0.2)})
    row = _row(c, "TTFT p50")
    assert row.differs
    assert row.ratios == pytest.approx((1.0, 1.01, 2.0))
    header, rows = table_rows(c)
    cells = next(r for r in rows if r[0] == "TTFT p50")
    assert cells == ["TTFT p50", "100.0 ms", "101.0 ms ×1.01", "200.0 ms ×2", "*"]
    assert not _row(c, "TPOT p50").differs
    loose = compare({"base": _summary(ttft=0.1), "near": _summary(ttft=0.101)}, tolerance=0.05)
    assert not _row(loose, "TTFT p50").differs


def test_a_zero_baseline_differs_from_any_non_zero_value_without_a_ratio():
    c = compare({"a": _summary(), "b": _summary(requests={"finished": 3, "total": 3, "preemptions": 4})})
    row = _row(c, "preemptions")
    assert row.differs and row.ratios == (None, None)
    assert _row(c, "requests finished").differs is False


def test_text_metrics_differ_by_text_and_a_missing_value_shows_a_dash():
    crashed = _summary(crash={"reason": "AssertionError: num_new_tokens > 0"}, policy="max_per_group")
    c = compare({"a": _summary(), "b": crashed})
    assert _row(c, "prefix policy").differs
    crash = _row(c, "crash")
    assert crash.cells == ("-", "AssertionError: num_new_tokens > 0") and crash.differs


def test_four_runs_fit_in_100_columns_without_cutting_a_cell():
    runs = {
        name: _summary(ttft=0.05 * (i + 1)) for i, name in enumerate(["pr48425", "max_per_group", "reconciled", "trim"])
    }
    header, rows = table_rows(compare(runs))
    table = Table()
    for h in header:
        table.add_column(Text(h))
    for row in rows:
        table.add_row(*(Text(cell) for cell in row))
    buf = io.StringIO()
    Console(file=buf, width=100, color_system=None).print(table)
    text = buf.getvalue()
    assert max(len(line) for line in text.splitlines()) <= 100
    for row in rows:
        for cell in row:
            assert cell in text, cell
    assert "…" not in text


def test_markdown_escapes_pipes_and_csv_json_carry_raw_values():
    c = compare({"a|b": _summary(ttft=0.1), "c": _summary(ttft=0.3)})
    md = to_markdown(c)
    assert md.splitlines()[0] == "| metric | a\\|b | c | Δ |"
    assert "| TTFT p50 | 100.0 ms | 300.0 ms ×3 | * |" in md
    parsed = list(csv.reader(io.StringIO(to_csv(c))))
    assert parsed[0] == ["metric", "a|b", "c", "differs"]
    ttft = next(r for r in parsed if r[0] == "TTFT p50")
    assert float(ttft[1]) == 0.1 and float(ttft[2]) == pytest.approx(0.3) and ttft[3] == "true"
    doc = json.loads(to_json(c))
    entry = next(m for m in doc["metrics"] if m["metric"] == "TTFT p50")
    assert entry["values"] == {"a|b": 0.1, "c": pytest.approx(0.3)} and entry["ratio"]["c"] == pytest.approx(3.0)


def test_a_bad_tolerance_is_refused():
    with pytest.raises(ValueError, match="tolerance"):
        compare({"a": _summary(), "b": _summary()}, tolerance=float("nan"))


def test_a_group_without_a_hit_rate_is_left_out_of_its_kind_mean():
    """A run that looked nothing up has ``hit_rate: {g0: None}``: the kind's mean is over the groups that have
    a rate, or missing (compare raised a TypeError on such a bundle)."""
    empty = _summary(cache={"hit_rate": {f"g{i}": None for i in range(7)}, "local_rate": None})
    half = _summary(cache={"hit_rate": {**{f"g{i}": None for i in range(6)}, "g6": 0.5}, "local_rate": 0.5})
    c = compare({"a": _summary(), "b": empty, "c": half})
    assert _row(c, "hit rate FA").values[1:] == (None, 0.5)
    assert _row(c, "hit rate Mamba").values[1:] == (None, None)
