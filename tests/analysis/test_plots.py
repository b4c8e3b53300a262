import numpy as np
import pandas as pd
import pytest
from matplotlib.image import imread

from sim.analysis.plots import (
    compare_latency_cdfs,
    compare_outcomes,
    plot_all,
    plot_divergence,
    plot_outcomes,
)
from sim.trace.bundle import LoadedResult
from sim.trace.tables import empty_table

KINDS = ["full_attention", "mamba"]


def _distinct_colours(path) -> int:
    rgba = np.round(imread(path) * 255).astype(np.uint8)
    assert rgba.shape[-1] == 4
    return len(np.unique(np.ascontiguousarray(rgba).view(np.uint32)))


def _check_png(path, min_colours=20):
    img = imread(path)
    assert img.shape[0] >= 300 and img.shape[1] >= 500, path
    assert _distinct_colours(path) > min_colours, path


def test_plot_all_writes_nonblank_pngs_and_an_index(tmp_path, tables, monkeypatch):
    import sim.analysis.plots as plots

    monkeypatch.setattr(plots, "MIN_REQUESTS_FOR_CDFS", 1)
    result = LoadedResult.from_tables(tables, group_kinds=KINDS)
    paths = plot_all(result, tmp_path / "plots")
    assert [p.name for p in paths] == [
        "block_usage.png",
        "divergence.png",
        "eviction_raster.png",
        "latency_cdfs.png",
        "outcomes.png",
        "index.md",
    ]
    for p in paths[:-1]:
        _check_png(p)
    index = paths[-1].read_text()
    assert "- `latency_cdfs.png`: TTFT" in index and "Left out:\n\n- `connector`" in index


def test_a_tiny_run_leaves_the_latency_cdfs_out_and_says_why(tmp_path, tables):
    result = LoadedResult.from_tables(tables, group_kinds=KINDS)
    finished = int(tables["requests"]["finished_s"].notna().sum())
    assert 0 < finished < 20
    paths = plot_all(result, tmp_path / "plots")
    assert "latency_cdfs.png" not in [p.name for p in paths]
    assert not (tmp_path / "plots" / "latency_cdfs.png").exists()
    index = (tmp_path / "plots" / "index.md").read_text()
    assert f"- `latency_cdfs`: {finished} finished requests (fewer than 20)" in index


def test_png_and_svg_are_deterministic(tmp_path, tables):
    result = LoadedResult.from_tables(tables, group_kinds=KINDS)
    for suffix in ("png", "svg"):
        a = plot_divergence(result, tmp_path / f"a.{suffix}")
        b = plot_divergence(result, tmp_path / f"b.{suffix}")
        assert a.read_bytes() == b.read_bytes()
    svg = (tmp_path / "a.svg").read_text()
    assert svg.startswith("<?xml") and "<dc:date>" not in svg


def test_empty_result_gives_message_plots(tmp_path):
    result = LoadedResult.from_tables(
        {n: empty_table(n, 2) for n in ("kv_events", "admissions", "requests", "schedule", "steps")}, group_kinds=KINDS
    )
    for p in plot_all(result, tmp_path, fmt="svg"):
        assert p.stat().st_size > (100 if p.suffix == ".md" else 1000)
    p = plot_outcomes(result, tmp_path / "outcomes.png")
    # text only on a white canvas: few colours, but not blank
    assert 2 < _distinct_colours(p) < 300


def test_compare_overlays(tmp_path, tables):
    other = dict(tables)
    other["requests"] = tables["requests"].assign(first_token_s=tables["requests"]["first_token_s"] + 0.5)
    runs = {
        "reconciled": LoadedResult.from_tables(tables, group_kinds=KINDS),
        "pr48425": LoadedResult.from_tables(other, group_kinds=KINDS),
    }
    _check_png(compare_latency_cdfs(runs, tmp_path / "cdf.png"))
    _check_png(compare_outcomes(runs, tmp_path / "outcomes.png"))


def test_bad_arguments(tmp_path, tables):
    with pytest.raises(ValueError, match=r"must end in one of \.png, \.svg"):
        plot_outcomes(tables, tmp_path / "x.jpg")
    with pytest.raises(ValueError, match="group_kinds"):
        plot_divergence(tables, tmp_path / "x.png", group_kinds=["mamba"])
    with pytest.raises(ValueError, match="plot format"):
        plot_all(tables, tmp_path, fmt="pdf")


# ------------------------------------------------------------ plot data

from sim.analysis.plots import (  # noqa: E402
    MAX_EVICTION_TICKS,
    connector_columns,
    crash_positions,
    eviction_marks,
    group_panels,
    latency_unit,
    outcome_counts,
    plot_connector,
    series_band,
)


def test_groups_of_one_kind_share_a_panel(tables):
    steps = tables["steps"].assign(blocks_g2=tables["steps"]["blocks_g1"], cached_g2=tables["steps"]["cached_g1"] + 1)
    panels = group_panels(steps, ["mamba", "full_attention", "mamba"])
    assert [(p.label, p.groups) for p in panels] == [("g0,g2 mamba ×2", (0, 2)), ("g1 (full_attention)", (1,))]
    six = group_panels(
        steps.assign(
            blocks_g3=0, cached_g3=0, blocks_g4=0, cached_g4=0, blocks_g5=0, cached_g5=0, blocks_g6=0, cached_g6=0
        ),
        ["mamba"] * 6 + ["full_attention"],
    )
    assert [p.label for p in six] == ["g0-g5 mamba ×6", "g6 (full_attention)"]
    assert [p.groups for p in group_panels(steps, [])] == [(0,), (1,), (2,)]
    lo, hi = series_band(steps, "cached_g", (1, 2))
    assert list(lo) == list(steps["cached_g1"]) and list(hi) == list(steps["cached_g1"] + 1)


def test_many_evictions_become_a_density():
    few = eviction_marks(pd.Series([1.0, 2.0, 2.0]), (0.0, 10.0))
    assert few[0] == "ticks" and list(few[1]) == [1.0, 2.0, 2.0]
    many = eviction_marks(pd.Series(np.arange(MAX_EVICTION_TICKS + 1) % 10, dtype=float), (0.0, 10.0), bins=10)
    assert many[0] == "density" and list(many[1]) == list(np.linspace(0, 10, 11))
    assert int(many[2].sum()) == MAX_EVICTION_TICKS + 1 and many[2][0] == 16


def test_crashes_are_located_on_the_axis(tables):
    result = LoadedResult.from_tables(tables, group_kinds=KINDS)
    assert crash_positions(result, "step") == [6.0]
    assert crash_positions(result, "time_s") == [3.0]
    no_rows = dict(tables, admissions=tables["admissions"][tables["admissions"]["outcome"] != "crash"])
    summary_only = LoadedResult.from_tables(no_rows, summary={"crash": {"step": 9, "time_s": 4.5}}, group_kinds=KINDS)
    assert crash_positions(summary_only, "time_s") == [4.5]


def test_outcomes_count_each_request_once_and_attempts_apart(tables):
    final, attempts = outcome_counts(tables)
    assert final.to_dict() == {"ok": 2, "corrupt": 1, "failed": 1}
    assert list(final.index) == ["ok", "corrupt", "failed"]
    assert attempts.to_dict() == {"ok": 3, "corrupt": 1, "crash": 1, "not_admitted": 1}


def test_step_clock_latencies_are_in_steps(tables):
    assert latency_unit(LoadedResult.from_tables(tables, summary={"clock": "steps"})) == "steps"
    assert latency_unit(LoadedResult.from_tables(tables, summary={"clock": "time"})) == "s"


def test_connector_panel_only_with_connector_columns(tmp_path, tables):
    assert connector_columns(tables["steps"]) == []
    assert [p.name for p in plot_all(LoadedResult.from_tables(tables, group_kinds=KINDS), tmp_path)][-2:] == [
        "outcomes.png",
        "index.md",
    ]
    steps = tables["steps"].assign(
        conn_tier_bytes=[i * 10**9 for i in range(7)], conn_loads_in_flight=1, conn_stores_in_flight=0
    )
    with_conn = LoadedResult.from_tables(dict(tables, steps=steps), summary={"connector": "offload"}, group_kinds=KINDS)
    assert connector_columns(steps) == ["conn_tier_bytes", "conn_loads_in_flight", "conn_stores_in_flight"]
    assert plot_all(with_conn, tmp_path)[-2].name == "connector.png"
    _check_png(plot_connector(with_conn, tmp_path / "c.png"))
