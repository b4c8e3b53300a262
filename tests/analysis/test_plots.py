import numpy as np
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


def test_plot_all_writes_nonblank_pngs(tmp_path, tables):
    result = LoadedResult.from_tables(tables, group_kinds=KINDS)
    paths = plot_all(result, tmp_path / "plots")
    assert [p.name for p in paths] == ["block_usage.png", "divergence.png", "eviction_raster.png",
                                       "latency_cdfs.png", "outcomes.png"]
    for p in paths:
        _check_png(p)


def test_png_and_svg_are_deterministic(tmp_path, tables):
    result = LoadedResult.from_tables(tables, group_kinds=KINDS)
    for suffix in ("png", "svg"):
        a = plot_divergence(result, tmp_path / f"a.{suffix}")
        b = plot_divergence(result, tmp_path / f"b.{suffix}")
        assert a.read_bytes() == b.read_bytes()
    svg = (tmp_path / "a.svg").read_text()
    assert svg.startswith("<?xml") and "<dc:date>" not in svg


def test_empty_result_gives_message_plots(tmp_path):
    result = LoadedResult.from_tables({n: empty_table(n, 2) for n in
                                       ("kv_events", "admissions", "requests", "schedule", "steps")},
                                      group_kinds=KINDS)
    for p in plot_all(result, tmp_path, fmt="svg"):
        assert p.stat().st_size > 1000
    p = plot_outcomes(result, tmp_path / "outcomes.png")
    # text only on a white canvas: few colours, but not blank
    assert 2 < _distinct_colours(p) < 300


def test_compare_overlays(tmp_path, tables):
    other = dict(tables)
    other["requests"] = tables["requests"].assign(first_token_s=tables["requests"]["first_token_s"] + 0.5)
    runs = {"reconciled": LoadedResult.from_tables(tables, group_kinds=KINDS),
            "pr48425": LoadedResult.from_tables(other, group_kinds=KINDS)}
    _check_png(compare_latency_cdfs(runs, tmp_path / "cdf.png"))
    _check_png(compare_outcomes(runs, tmp_path / "outcomes.png"))


def test_bad_arguments(tmp_path, tables):
    with pytest.raises(ValueError, match=r"must end in one of \.png, \.svg"):
        plot_outcomes(tables, tmp_path / "x.jpg")
    with pytest.raises(ValueError, match="group_kinds"):
        plot_divergence(tables, tmp_path / "x.png", group_kinds=["mamba"])
    with pytest.raises(ValueError, match="plot format"):
        plot_all(tables, tmp_path, fmt="pdf")
