from __future__ import annotations

import pandas as pd
import pytest
from matplotlib.collections import PolyCollection

from sim.sweep.plots import plot_sweep


def _frame() -> pd.DataFrame:
    rows = []
    for blocks in (800, 400):
        for policy in ("pr48425", "max_per_group"):
            for seed in (1, 2):
                div = 1000 // blocks + (seed if policy == "max_per_group" else 0)
                rows.append(
                    {
                        "run_id": f"{blocks}-{policy}-{seed}",
                        "cache.num_blocks": blocks,
                        "scheduler.prefix_policy": policy,
                        "seed": seed,
                        "status": "ok",
                        "error": None,
                        "divergences": div,
                        "fallbacks": 3,
                        "crash.reason": None,
                    }
                )
    rows.append(dict(rows[0], run_id="failed", seed=3, status="failed", error="RuntimeError: x", divergences=1000))
    return pd.DataFrame(rows)


def _lines(ax):
    return {line.get_label(): (list(line.get_xdata()), list(line.get_ydata())) for line in ax.get_lines()}


def test_one_panel_per_metric_one_line_per_hue_mean_over_seeds_and_min_max_band(tmp_path):
    out = tmp_path / "fig" / "p.png"
    fig = plot_sweep(
        _frame(), x="cache.num_blocks", metrics=["divergences", "fallbacks"], hue="scheduler.prefix_policy", out=out
    )
    assert out.read_bytes()[:4] == b"\x89PNG"
    div, fall = [ax for ax in fig.axes if ax.get_visible()]
    assert _lines(div) == {
        "pr48425": ([400.0, 800.0], [2.0, 1.0]),  # failed row (divergences=1000) is left out
        "max_per_group": ([400.0, 800.0], [3.5, 2.5]),
    }
    bands = [c for c in div.collections if isinstance(c, PolyCollection)]
    assert len(bands) == 1  # only max_per_group has a seed spread
    corners = {tuple(v) for v in bands[0].get_paths()[0].vertices.tolist()}
    assert corners == {(400.0, 3.0), (400.0, 4.0), (800.0, 2.0), (800.0, 3.0)}  # min..max per point
    assert not [c for c in fall.collections if isinstance(c, PolyCollection)]
    assert (div.get_title(), div.get_xlabel(), div.get_ylabel()) == ("divergences", "cache.num_blocks", "divergences")
    legend = fig.legends[0]
    assert legend.get_title().get_text() == "scheduler.prefix_policy"
    assert [t.get_text() for t in legend.get_texts()] == ["pr48425", "max_per_group"]
    assert "mean over 2 seeds" in fig._suptitle.get_text()


def test_categorical_x_orders_numbers_with_null_first():
    frame = _frame()
    frame["cache.num_blocks"] = frame["cache.num_blocks"].astype(object)
    frame.loc[frame["cache.num_blocks"] == 800, "cache.num_blocks"] = None
    fig = plot_sweep(frame, x="cache.num_blocks", metrics=["divergences"], hue="scheduler.prefix_policy")
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["null", "400"]
    # Categorical x: grouped bars (pr48425 left of max_per_group at each position), no lines.
    assert [label for label in _lines(ax) if label != "_nolegend_"] == []  # error-bar caps only
    bars = {(round(p.get_x() + p.get_width() / 2, 2), p.get_height()) for p in ax.patches}
    assert bars == {(-0.2, 1.0), (0.8, 2.0), (0.2, 2.5), (1.2, 3.5)}


def test_plot_errors_name_the_problem():
    frame = _frame()
    with pytest.raises(
        ValueError,
        match=r"x 'cache.block_size' is not a column \(grid columns: cache.num_blocks, scheduler.prefix_policy\)",
    ):
        plot_sweep(frame, x="cache.block_size", metrics=["divergences"])
    with pytest.raises(
        ValueError, match=r"metric 'nope' is not a column \(metrics: divergences, fallbacks, crash.reason\)"
    ):
        plot_sweep(frame, x="cache.num_blocks", metrics=["nope"], hue="scheduler.prefix_policy")
    with pytest.raises(ValueError, match="grid column 'scheduler.prefix_policy' also varies"):
        plot_sweep(frame, x="cache.num_blocks", metrics=["divergences"])
    frame["status_text"] = "x"
    with pytest.raises(ValueError, match="metric 'status_text' is not numeric"):
        plot_sweep(frame, x="cache.num_blocks", metrics=["status_text"], hue="scheduler.prefix_policy")


def test_without_hue_after_filtering_draws_a_single_line():
    frame = _frame()
    one = frame[frame["scheduler.prefix_policy"] == "max_per_group"]
    fig = plot_sweep(one, x="cache.num_blocks", metrics=["divergences"])
    assert _lines(fig.axes[0]) == {"all": ([400.0, 800.0], [3.5, 2.5])}
    assert fig.legends == []


def test_sweep_points_titles_rates_and_counts():
    from sim.sweep.plots import is_rate, metric_title, sweep_points

    frame = _frame()
    pts = sweep_points(frame, "scheduler.prefix_policy", "divergences", hue="cache.num_blocks")
    assert pts[["hue", "x", "mean", "min", "max", "count"]].values.tolist() == [
        ["400", "pr48425", 2.0, 2.0, 2.0, 2],
        ["400", "max_per_group", 3.5, 3.0, 4.0, 2],
        ["800", "pr48425", 1.0, 1.0, 1.0, 2],
        ["800", "max_per_group", 2.5, 2.0, 3.0, 2],
    ]
    assert metric_title("cache.hit_rate.g1", ["full_attention", "mamba"]) == "cache hit rate g1 (mamba)"
    assert metric_title("admissions.tokens_recomputed") == "admissions tokens recomputed"
    assert is_rate("cache.hit_rate.g0") and not is_rate("throughput.requests_per_s")
    frame["cache.hit_rate.g1"] = 0.25
    frame["groups"] = '["full_attention", "mamba"]'
    assert sweep_points(frame, "cache.num_blocks", "cache.hit_rate.g1")["mean"].tolist() == [25.0, 25.0]
    fig = plot_sweep(
        frame, x="scheduler.prefix_policy", metrics=["cache.hit_rate.g1", "divergences"], hue="cache.num_blocks"
    )
    rate, div = fig.axes[:2]
    assert rate.get_title() == "cache hit rate g1 (mamba)" and rate.get_ylabel() == "cache hit rate g1 (mamba) (%)"
    assert {p.get_height() for p in rate.patches} == {25.0}
    fig.canvas.draw()
    assert all(float(t) == int(float(t)) for t in div.get_yticks())  # a count axis: integer ticks
