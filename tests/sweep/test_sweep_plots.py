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
    fig = plot_sweep(_frame(), x="cache.num_blocks", metrics=["divergences", "fallbacks"], hue="scheduler.prefix_policy", out=out)
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
    assert _lines(ax)["pr48425"] == ([0, 1], [1.0, 2.0])


def test_plot_errors_name_the_problem():
    frame = _frame()
    with pytest.raises(ValueError, match=r"x 'cache.block_size' is not a column \(grid columns: cache.num_blocks, scheduler.prefix_policy\)"):
        plot_sweep(frame, x="cache.block_size", metrics=["divergences"])
    with pytest.raises(ValueError, match=r"metric 'nope' is not a column \(metrics: divergences, fallbacks, crash.reason\)"):
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
