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
    rgb = np.round(imread(path)[..., :3] * 255).astype(np.uint32)
    return len(np.unique((rgb[..., 0] << 16) | (rgb[..., 1] << 8) | rgb[..., 2]))


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
    assert [(p.label, p.groups) for p in panels] == [("g0,g2 mamba (2 groups)", (0, 2)), ("g1 (full_attention)", (1,))]
    six = group_panels(
        steps.assign(
            blocks_g3=0, cached_g3=0, blocks_g4=0, cached_g4=0, blocks_g5=0, cached_g5=0, blocks_g6=0, cached_g6=0
        ),
        ["mamba"] * 6 + ["full_attention"],
    )
    assert [p.label for p in six] == ["g0–g5 mamba (6 groups)", "g6 (full_attention)"]
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


# ------------------------------------------------------------ cost cuts that must not change what is shown

from matplotlib.figure import Figure  # noqa: E402

import sim.analysis.plots as plots_module  # noqa: E402
from sim.analysis.figures import axis_ticks  # noqa: E402
from sim.analysis.plots import plot_latency_cdfs, single_outcome, step_change_points  # noqa: E402


@pytest.fixture
def drawn(monkeypatch):
    """The figures the plot functions save, in order (they are still written)."""
    figures: list[Figure] = []
    save = plots_module.save_figure

    def keep(fig, path, **kw):
        figures.append(fig)
        return save(fig, path, **kw)

    monkeypatch.setattr(plots_module, "save_figure", keep)
    return figures


def _all_ok(tables):
    """The hand-made run with every request and admission attempt ``ok`` (one attempt each)."""
    requests = tables["requests"].assign(outcome="ok")
    admissions = tables["admissions"].drop_duplicates("request_id").assign(outcome="ok")
    return dict(tables, requests=requests, admissions=admissions)


def test_outcomes_of_a_run_where_everything_is_ok_are_left_out_with_the_counts(tmp_path, tables):
    result = LoadedResult.from_tables(_all_ok(tables), group_kinds=KINDS)
    assert single_outcome(result) == "all 4 requests and all 4 admission attempts ended `ok` (a single bar)"
    paths = plot_all(result, tmp_path)
    assert "outcomes.png" not in [p.name for p in paths]
    assert "- `outcomes`: all 4 requests and all 4 admission attempts ended `ok`" in (tmp_path / "index.md").read_text()
    assert single_outcome(LoadedResult.from_tables(tables, group_kinds=KINDS)) is None


def test_outcomes_draw_one_panel_when_requests_and_attempts_agree(tmp_path, tables, drawn):
    agree = _all_ok(tables)
    agree["requests"].loc[0, "outcome"] = "recompute"
    agree["admissions"].loc[agree["admissions"]["request_id"] == "r0", "outcome"] = "recompute"
    plot_outcomes(agree, tmp_path / "one.png")
    plot_outcomes(tables, tmp_path / "two.png")
    one, two = drawn
    assert [ax.get_title() for ax in one.axes] == ["requests (final outcome) = admission attempts"]
    assert [ax.get_title() for ax in two.axes] == ["requests (final outcome)", "admission attempts"]
    assert sorted(t.get_text() for t in one.axes[0].texts) == ["1", "3"]  # the bar labels: the counts


def test_step_change_points_draw_the_same_step_function():
    rng = np.random.default_rng(3)
    y = np.repeat(rng.integers(0, 4, 40), rng.integers(1, 6, 40))
    z = np.repeat(rng.integers(0, 3, 30), rng.integers(1, 8, 30))[: len(y)]
    y = y[: len(z)]
    x = np.cumsum(rng.random(len(y)))
    rows = step_change_points(y, z)
    assert rows[0] == 0 and rows[-1] == len(y) - 1 and len(rows) < len(y)
    # A post-step function: the value at any x is that of the last row at or before it.
    probe = np.concatenate([x, (x[:-1] + x[1:]) / 2])
    for series in (y, z):
        full = series[np.searchsorted(x, probe, side="right") - 1]
        kept = series[rows][np.searchsorted(x[rows], probe, side="right") - 1]
        assert np.array_equal(full, kept)
    assert list(step_change_points(np.array([5, 5, 5]))) == [0, 2]
    assert list(step_change_points(np.array([], dtype=int))) == []


def test_only_ticks_in_view_are_drawn(tmp_path, tables, drawn):
    plot_divergence(LoadedResult.from_tables(tables, group_kinds=KINDS), tmp_path / "d.png")
    ax = drawn[0].axes[0]
    for name, axis in (("x", ax.xaxis), ("y", ax.yaxis)):
        lo, hi = sorted(axis.get_view_interval())
        locs, labels = axis_ticks(ax, name)
        assert 2 <= len(locs) <= plots_module.MAX_TICKS + 1
        assert all(lo <= v <= hi for v in locs) and len(labels) == len(locs)
        assert axis.majorTicks == [] == axis.minorTicks  # no matplotlib tick is built (RunAxes)


def _tick_free(monkeypatch):
    """Draw the run figures with matplotlib's own axes, ticks and grid lines (the reference for RunAxes and
    AxisMarks)."""
    from matplotlib.axes import Axes

    monkeypatch.setattr(plots_module, "RunAxes", Axes)
    monkeypatch.setattr(plots_module, "draw_ticks_once", lambda fig: None)
    monkeypatch.setattr(plots_module, "grid", lambda ax, axis="both", alpha=0.3: ax.grid(axis=axis, alpha=alpha))


def test_axis_marks_draw_matplotlib_s_pixels(tmp_path, tables, monkeypatch):
    """Ticks, tick labels, grid lines and axis labels drawn by AxisMarks on RunAxes are matplotlib's on its
    own axes, pixel for pixel: shared x axes (labels on the bottom panel only), a shared y axis,
    categorical bars, the connector's panels, an empty panel, per-axes legends (the compare figures)."""
    monkeypatch.setattr(plots_module, "MIN_REQUESTS_FOR_CDFS", 1)
    steps = tables["steps"].assign(
        conn_tier_bytes=[i * 10**9 for i in range(7)], conn_loads_in_flight=1, conn_stores_in_flight=0
    )
    result = LoadedResult.from_tables(dict(tables, steps=steps), summary={"connector": "offload"}, group_kinds=KINDS)
    runs = {"a": result, "b": LoadedResult.from_tables(tables, group_kinds=KINDS)}

    def draw(out):
        return [
            *plot_all(result, out),
            compare_latency_cdfs(runs, out / "cmp_latency.png"),
            compare_outcomes(runs, out / "cmp_outcomes.png"),
        ]

    ours = draw(tmp_path / "ours")
    _tick_free(monkeypatch)
    theirs = draw(tmp_path / "theirs")
    ours.remove(tmp_path / "ours" / "index.md")
    theirs.remove(tmp_path / "theirs" / "index.md")
    assert [p.name for p in ours] == [p.name for p in theirs] and len(ours) == 8
    for a, b in zip(ours, theirs):
        assert np.array_equal(imread(a), imread(b)), a.name


def test_axes_matplotlib_would_draw_otherwise_keep_their_ticks():
    from sim.analysis.figures import AxisMarks, draw_ticks_once, grid

    fig = Figure()
    plain, logged, styled = fig.subplots(1, 3)
    for ax in (plain, logged, styled):
        ax.plot([1, 10, 100], [1, 2, 3])
        grid(ax)
    logged.set_xscale("log")
    styled.tick_params(axis="y", labelsize=5)
    draw_ticks_once(fig)
    marked = {(fig.axes.index(ax), a.axis_name) for ax in fig.axes for a in ax.artists if isinstance(a, AxisMarks)}
    assert marked == {(0, "x"), (0, "y"), (1, "y"), (2, "x")}
    assert logged.xaxis.get_tick_params()["gridOn"] and styled.yaxis.get_tick_params()["gridOn"]  # grid kept
    assert axis_ticks(plain, "x")[1] and axis_ticks(logged, "x")[1] and axis_ticks(styled, "y")[1]


def test_latency_panels_share_one_labelled_fraction_axis(tmp_path, tables, drawn):
    no_tpot = dict(tables, requests=tables["requests"].assign(output_tokens=1))
    plot_latency_cdfs(no_tpot, tmp_path / "l.png")
    ttft, tpot, e2e = drawn[0].axes
    assert [ax.get_ylabel() for ax in (ttft, tpot, e2e)] == ["fraction of requests", "", ""]
    assert [t.get_text() for t in tpot.texts] == ["no TPOT data"]
    # The empty TPOT panel keeps the shared ticks: the others still read 0 to 1.
    (ttft_y, ttft_labels), (e2e_y, e2e_labels) = axis_ticks(ttft, "y"), axis_ticks(e2e, "y")
    assert ttft_y == e2e_y == axis_ticks(tpot, "y")[0] and ttft_y[-1] == 1.0
    assert ttft_labels[-1] == "1.00" and axis_ticks(tpot, "y")[1] == e2e_labels == []


def test_legends_fit_inside_their_figures(tmp_path, tables, drawn, monkeypatch):
    """No cut legends (issue 34: block_usage's "...peak 152 per 0.996 s at 40% heig"), also with the
    density's three-line eviction label and a crash entry; block_usage has one legend for its panels, clear
    of them, that names what an eviction count counts, and each panel's title gives the count."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from sim.analysis.legend import RunLegend
    from sim.analysis.plots import EVICTION_DEFINITION

    monkeypatch.setattr(plots_module, "MIN_REQUESTS_FOR_CDFS", 1)
    kv = tables["kv_events"]
    many = kv[kv["kind"] == "removed"].iloc[[0]].loc[lambda f: f.index.repeat(400)]
    many = many.assign(seq=np.arange(400) + 100, time_s=np.linspace(0.0, 3.0, 400), block_id=np.arange(400) % 64)
    busy = dict(tables, kv_events=pd.concat([kv, many], ignore_index=True))
    result = LoadedResult.from_tables(busy, summary={"clock": "time"}, group_kinds=KINDS)
    plot_all(result, tmp_path)
    by_title = {}
    for fig in drawn:
        renderer = FigureCanvasAgg(fig).get_renderer()
        legends = [*fig.legends, *(ax.get_legend() for ax in fig.axes if ax.get_legend())]
        legends += [a for a in [*fig.artists, *(a for ax in fig.axes for a in ax.artists)] if isinstance(a, RunLegend)]
        by_title[fig.get_suptitle()] = legends
        for legend in legends:
            box = legend.get_window_extent(renderer)
            assert fig.bbox.x0 <= box.x0 and box.x1 <= fig.bbox.x1, (fig.get_suptitle(), box)
            assert fig.bbox.y0 <= box.y0 and box.y1 <= fig.bbox.y1, (fig.get_suptitle(), box)
            for ax in fig.axes:  # beside the panels, not over them
                mine = legend.axes is ax and not isinstance(legend, RunLegend)  # a legend inside its axes
                assert not box.overlaps(ax.get_window_extent(renderer)) or mine, fig.get_suptitle()
    usage = next(fig for fig in drawn if fig.get_suptitle() == "KV-cache blocks over time")
    (legend,) = by_title["KV-cache blocks over time"]
    texts = [t.get_text() for t in legend.get_texts()]
    assert any(t.startswith(EVICTION_DEFINITION + "\n(bars: per") for t in texts) and "crash" in texts, texts
    assert "cache entries removed, per group" in EVICTION_DEFINITION
    titles = [ax.get_title(loc="left") for ax in usage.axes]
    assert titles[1].startswith("g0 (full_attention): evictions 402, bars peak"), titles
    (raster,) = by_title["Evictions (cache entries removed)"]
    assert [t.get_text() for t in raster.get_texts()][0].startswith("g0 (full_attention):\n402"), raster
    assert sum(len(v) for v in by_title.values()) == 3  # block usage, divergence, raster


def test_png_is_savefig_s_pixels_in_rgb_when_opaque(tmp_path, tables, drawn):
    """save_figure's PNG (its own Agg text path, sim.analysis.agg_text) has the pixels of matplotlib's
    savefig (the stock Agg canvas: the figure's canvas is left as it was)."""
    import io

    from matplotlib.backend_bases import FigureCanvasBase
    from PIL import Image

    from sim.analysis.figures import save_figure

    p = plot_divergence(LoadedResult.from_tables(tables, group_kinds=KINDS), tmp_path / "d.png")
    fig = drawn[0]
    reference = io.BytesIO()
    fig.savefig(reference, format="png", dpi=100)
    want = np.asarray(Image.open(reference))
    assert want.shape[-1] == 4 and (want[..., 3] == 255).all()
    got = Image.open(p)
    assert got.mode == "RGB" and np.array_equal(np.asarray(got), want[..., :3])
    assert fig.get_dpi() == 100 and type(fig.canvas) is FigureCanvasBase  # saving leaves the figure as it was
    fig.set_facecolor((1, 1, 1, 0))  # see-through: the alpha channel stays
    assert Image.open(save_figure(fig, tmp_path / "clear.png")).mode == "RGBA"


def test_short_panels_get_fewer_y_ticks(tmp_path, tables, drawn):
    from sim.analysis.plots import SHORT_AXIS_TICKS, plot_block_usage

    steps = tables["steps"]
    wide = dict(tables, steps=steps.assign(free_blocks=np.linspace(0, 250, len(steps)).round().astype(int)))
    plot_block_usage(LoadedResult.from_tables(wide, group_kinds=KINDS), tmp_path / "b.png")
    plot_divergence(LoadedResult.from_tables(tables, group_kinds=KINDS), tmp_path / "d.png")
    usage, divergence = drawn
    for ax in usage.axes:  # stacked 2-inch panels (the pool's 0-250 would take 50-block steps: 6 ticks)
        assert 2 <= len(axis_ticks(ax, "y")[0]) <= SHORT_AXIS_TICKS + 1, ax.get_title(loc="left")
    assert len(axis_ticks(divergence.axes[0], "y")[0]) > SHORT_AXIS_TICKS + 1  # a tall axis keeps its ticks


def test_text_from_the_shared_cache_is_matplotlib_s(tmp_path, tables, drawn, monkeypatch):
    """Strings and glyphs laid out and rendered once for a set of figures (agg_text.shared_text) give
    savefig's pixels: the figures of a first plot_all, and those of a second drawn from the cache alone
    (horizontal and rotated text, several sizes)."""
    import io

    from matplotlib.backend_bases import FigureCanvasBase
    from PIL import Image

    from sim.analysis.agg_text import shared_text

    monkeypatch.setattr(plots_module, "MIN_REQUESTS_FOR_CDFS", 1)
    result = LoadedResult.from_tables(tables, group_kinds=KINDS)
    with shared_text() as cache:
        first = plot_all(result, tmp_path / "a")[:-1]
        learnt = (len(cache.glyphs), len(cache.layouts))
        second = plot_all(result, tmp_path / "b")[:-1]
        assert (len(cache.glyphs), len(cache.layouts)) == learnt > (100, 10)  # nothing new the second time
    assert len(drawn) == 2 * len(first) == 10
    for fig, path in zip(drawn, first + second):
        assert type(fig.canvas) is FigureCanvasBase  # savefig draws with matplotlib's Agg canvas
        reference = io.BytesIO()
        fig.savefig(reference, format="png", dpi=100)
        assert np.array_equal(np.asarray(Image.open(path)), np.asarray(Image.open(reference))[..., :3]), path


def test_eviction_bars_are_matplotlib_s_stairs(tmp_path, tables, drawn, monkeypatch):
    """block_usage's eviction bars (many evictions: a density) skip ax.stairs' walk over their outline and
    draw the same pixels, with the same data limits."""
    from matplotlib.patches import StepPatch

    from sim.analysis.plots import _bars_at_zero as bars_at_zero
    from sim.analysis.plots import plot_block_usage

    kv = tables["kv_events"]
    many = kv[kv["kind"] == "removed"].iloc[[0]].loc[lambda f: f.index.repeat(400)]
    many = many.assign(seq=np.arange(400) + 100, time_s=np.linspace(0.0, 3.0, 400), block_id=np.arange(400) % 64)
    busy = LoadedResult.from_tables(
        dict(tables, kv_events=pd.concat([kv, many], ignore_index=True)), summary={"clock": "time"}, group_kinds=KINDS
    )
    ours = plot_block_usage(busy, tmp_path / "ours.png")
    monkeypatch.setattr(
        plots_module, "_bars_at_zero", lambda ax, heights, edges, **kw: ax.stairs(heights, edges, fill=True, **kw)
    )
    theirs = plot_block_usage(busy, tmp_path / "theirs.png")
    bars = [p for p in drawn[0].axes[1].patches if isinstance(p, StepPatch)]
    assert len(bars) == 1 and drawn[0].axes[1].dataLim.bounds == drawn[1].axes[1].dataLim.bounds
    assert np.array_equal(imread(ours), imread(theirs))
    # Alone on an axes, the bars set the data and view limits as ax.stairs does.
    alone, stairs = Figure().subplots(1, 2)
    heights, edges = np.array([3.0, 0.0, 7.5, 1.0]), np.array([2.0, 2.5, 3.0, 3.5, 4.0])
    bars_at_zero(alone, heights, edges, facecolor="red")
    stairs.stairs(heights, edges, fill=True, facecolor="red")
    assert alone.dataLim.bounds == stairs.dataLim.bounds and alone.viewLim.bounds == stairs.viewLim.bounds
