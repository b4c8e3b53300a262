"""Matplotlib figures of a run (and overlays of several runs).

Every function takes a result — a :class:`~sim.trace.bundle.LoadedResult`, or
any object with a ``.tables`` mapping (or a plain mapping of table name to
DataFrame) — and an output path whose suffix picks the format (``.png`` or
``.svg``), writes one figure and returns the path. Group kinds (attention type
per KV-cache group) come from ``group_kinds=`` or the result's
``group_kinds`` / ``summary["groups"]``; without them groups are named
``g<i>`` and the divergence plot compares group 0 with group 1.

Figures are built on :class:`matplotlib.figure.Figure` directly, so importing
this module neither selects a backend nor touches pyplot state; PNG goes
through Agg. Output is deterministic: no software/date metadata, a fixed SVG
hash salt, no random jitter. Empty data gives a figure that says so instead of
an error.

The time axis is simulated seconds under ``clock: time`` and the engine step
under ``clock: steps`` (from ``summary["clock"]``; without it, seconds when
``time_s`` varies and differs from ``step``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import StepPatch
from matplotlib.ticker import MaxNLocator

from sim.analysis.agg_text import shared_text
from sim.analysis.figures import PLOT_FORMATS, RunAxes, draw_ticks_once, grid, save_figure
from sim.analysis.legend import RunLegend
from sim.results.metrics import FULL_ATTENTION, NOT_ADMITTED, request_metrics
from sim.trace.bundle import LoadedResult, ResultSource, summary_of, tables_of
from sim.trace.output import write_file
from sim.trace.tables import infer_num_groups

#: Fixed colours for the outcomes docs/design.md §3/§6 name; others cycle through tab10.
OUTCOME_COLOURS = {
    "ok": "#2ca02c",
    "recompute": "#ff7f0e",
    "corrupt": "#d62728",
    "crash": "#000000",
    NOT_ADMITTED: "#9e9e9e",
}
OUTCOME_ORDER = ("ok", "recompute", "corrupt", "crash", NOT_ADMITTED)

_LATENCIES = (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("e2e_s", "E2E latency"))


# ---------------------------------------------------------------- plumbing


def _kinds(result: ResultSource, group_kinds: Sequence[str] | None, num_groups: int) -> list[str]:
    if group_kinds is None:
        group_kinds = (result.group_kinds if isinstance(result, LoadedResult) else None) or summary_of(result).get(
            "groups"
        )
    kinds = list(group_kinds or [])
    if kinds and len(kinds) != num_groups:
        raise ValueError(f"group_kinds {kinds} has {len(kinds)} entries, the tables have {num_groups} groups")
    return kinds


def _group_label(i: int, kinds: Sequence[str]) -> str:
    return f"g{i} ({kinds[i]})" if kinds else f"g{i}"


def _outcome_colour(outcome: str, others: list[str]) -> str | tuple[float, float, float, float]:
    if outcome in OUTCOME_COLOURS:
        return OUTCOME_COLOURS[outcome]
    return matplotlib.colormaps["tab10"](others.index(outcome) % 10)


def _ordered_outcomes(values: Sequence[str]) -> list[str]:
    present = set(values)
    return [o for o in OUTCOME_ORDER if o in present] + sorted(present - set(OUTCOME_ORDER))


def _time_axis(result: ResultSource, steps: pd.DataFrame) -> tuple[str, str]:
    """``time_s`` under ``clock: time``, ``step`` under ``clock: steps`` (where time counts steps)."""
    clock = summary_of(result).get("clock")
    if clock == "time" or (
        clock is None and not steps["time_s"].equals(steps["step"].astype(float)) and steps["time_s"].nunique() > 1
    ):
        return "time_s", "simulated time (s)"
    return "step", "engine step"


def _empty(ax: Axes, message: str, *, shared_y: bool = False) -> None:
    """``message`` in the middle of ``ax``, without ticks (``shared_y``: the y ticks belong to the panels
    sharing the axis and stay)."""
    ax.text(0.5, 0.5, message, ha="center", va="center", fontsize=13, color="#555555", transform=ax.transAxes)
    ax.set_xticks([])
    if not shared_y:
        ax.set_yticks([])


def _save(fig: Figure, path: str | Path, **kw: Any) -> Path:
    """:func:`save_figure` with the figure's ticks drawn as :class:`~sim.analysis.figures.AxisMarks`
    (:func:`draw_ticks_once`: the same ticks for about a third of the drawing time)."""
    draw_ticks_once(fig)
    return save_figure(fig, path, **kw)


#: Major tick intervals per numeric axis, at most. Matplotlib's automatic count (9-10 on these axes) made
#: building and drawing ticks (five artists each: two marks, a grid line, two labels) the largest part of
#: the plotting time; five intervals with grid lines still read off a step plot or a CDF.
MAX_TICKS = 5


class _InViewLocator(MaxNLocator):
    """:class:`MaxNLocator` giving only the ticks inside the axis' view interval. Matplotlib builds a tick
    (five artists) for every location a locator returns and then draws only those in view; MaxNLocator
    returns one beyond each edge, so about a quarter of the ticks built were never drawn. The drawn
    ticks are the same (matplotlib's own in-view test, relative tolerance 1e-10)."""

    def __call__(self) -> Sequence[float]:
        locs = super().__call__()
        if self.axis is None:
            return locs
        lo, hi = sorted(self.axis.get_view_interval())
        slack = 1e-10 * (hi - lo)
        return [x for x in locs if lo - slack <= x <= hi + slack]


def _locator(integer: bool = False, intervals: int = MAX_TICKS) -> MaxNLocator:
    """A major-tick locator with at most ``intervals`` intervals (``integer``: whole numbers only),
    building only the ticks that are drawn."""
    return _InViewLocator(nbins=intervals, integer=integer)


#: A y axis shorter than this (inches: the stacked 2-inch panels of the block-usage and eviction figures)
#: gets at most :data:`SHORT_AXIS_TICKS` intervals: five labelled ticks on 1.5 inches sit a quarter inch
#: apart, and every tick is five artists to build and draw.
SHORT_AXIS_INCHES = 2.0
SHORT_AXIS_TICKS = 3


def _y_locator(ax: Axes, integer: bool = False) -> MaxNLocator:
    """:func:`_locator` for ``ax``'s y axis: :data:`SHORT_AXIS_TICKS` intervals on a short axis."""
    fig = ax.get_figure(root=True)
    assert fig is not None  # every axes here is made by _figure
    inches = ax.get_position().height * fig.get_figheight()
    return _locator(integer, SHORT_AXIS_TICKS if inches < SHORT_AXIS_INCHES else MAX_TICKS)


def _figure(
    nrows: int = 1,
    ncols: int = 1,
    *,
    width: float = 9.0,
    height: float = 4.5,
    legend_right: float = 0.0,
    categorical_x: bool = False,
    **kw,
) -> tuple[Figure, np.ndarray]:
    """A figure with fixed margins in inches (``legend_right``: room for legends right of the axes) and
    at most :data:`MAX_TICKS` tick intervals per numeric axis (``categorical_x``: x keeps one tick per
    category).

    Fixed margins instead of a layout engine: constrained or tight layout (or a
    tight bounding box) draws every figure twice, which doubled plotting time.
    """
    fig = Figure(figsize=(width, height))
    # A fixed title height: matplotlib's automatic one measures every tick label at draw time.
    with matplotlib.rc_context({"axes.titley": 1.0}):
        axes = fig.subplots(nrows, ncols, squeeze=False, subplot_kw={"axes_class": RunAxes}, **kw)
    fig.subplots_adjust(
        left=0.85 / width,
        right=1 - (0.25 + legend_right) / width,
        bottom=0.65 / height,
        top=1 - 0.65 / height,
        hspace=0.55 * nrows / max(height - 1.3, 1.0),
        wspace=0.28,
    )
    for ax in axes.flat:
        if ax.get_facecolor() == fig.get_facecolor():
            ax.patch.set_visible(False)  # the same colour as the figure behind it: nothing to draw
        ax.yaxis.set_major_locator(_y_locator(ax))
        if not categorical_x:
            ax.xaxis.set_major_locator(_locator())
    return fig, axes


# ---------------------------------------------------------------- single run


@dataclass(frozen=True)
class GroupPanel:
    """One panel for one or more KV-cache groups of one kind."""

    label: str
    groups: tuple[int, ...]


def group_panels(steps: pd.DataFrame, kinds: Sequence[str]) -> list[GroupPanel]:
    """Groups merged into panels by kind (e.g. Nemotron-H's six Mamba groups: one ``"g0–g5 mamba (6 groups)"``
    panel, as the summary names them). Groups of one kind share the pool and the scheduler's decisions, so their blocks in use
    agree; their cached counts and evictions may differ, which a merged panel draws as a band and a sum.
    Without kinds every group is its own panel."""
    n = max(infer_num_groups(steps.columns), len(kinds))
    merged: list[tuple[tuple, list[int]]] = []
    for g in range(n):
        key = (kinds[g],) if kinds else (g,)
        for k, members in merged:
            if k == key:
                members.append(g)
                break
        else:
            merged.append((key, [g]))
    panels = []
    for _, members in merged:
        if len(members) == 1:
            panels.append(GroupPanel(_group_label(members[0], kinds), (members[0],)))
            continue
        contiguous = members == list(range(members[0], members[-1] + 1))
        names = f"g{members[0]}–g{members[-1]}" if contiguous else ",".join(f"g{m}" for m in members)
        panels.append(GroupPanel(f"{names} {kinds[members[0]]} ({len(members)} groups)", tuple(members)))
    return panels


#: Up to this many evictions in a panel are drawn one tick each; more as a density.
MAX_EVICTION_TICKS = 150


def eviction_marks(times: pd.Series, span: tuple[float, float], bins: int = 80) -> tuple[str, np.ndarray, np.ndarray]:
    """How to draw a panel's evictions: ``("ticks", x, [])`` when few, else ``("density", bin
    edges, evictions per bin)`` over ``span``."""
    x = times.to_numpy(dtype=float)
    if len(x) <= MAX_EVICTION_TICKS:
        return "ticks", x, np.array([])
    lo, hi = span
    edges = np.linspace(lo, hi if hi > lo else lo + 1, bins + 1)
    counts, _ = np.histogram(x, bins=edges)
    return "density", edges, counts


def eviction_count(removed: pd.DataFrame, groups: Sequence[int]) -> str:
    """The one definition of a panel's eviction count, shared by the block-usage and raster plots: cache
    entries removed *per group*. A merged panel says ``233 per group`` when its groups agree (they usually
    do: they share the pool and the scheduler), else the range ``230-235 per group``."""
    per_group = [int((removed["group"] == g).sum()) for g in groups]
    if len(per_group) == 1:
        return str(per_group[0])
    lo, hi = min(per_group), max(per_group)
    return f"{lo} per group" if lo == hi else f"{lo}-{hi} per group"


def crash_positions(result: ResultSource, xcol: str) -> list[float]:
    """Where the run's crashes are on the x axis (crashed admission rows; else ``summary["crash"]``)."""
    adm = tables_of(result)["admissions"]
    rows = adm[adm["outcome"] == "crash"]
    if len(rows):
        return sorted(float(v) for v in rows[xcol])
    crash = summary_of(result).get("crash")
    if crash:
        return [float(crash["step" if xcol == "step" else "time_s"])]
    return []


def _mark_crashes(ax: Axes, xs: Sequence[float], label: bool) -> None:
    for i, x in enumerate(xs):
        ax.axvline(x, color="#000000", linewidth=1.5, linestyle="-.", label="crash" if label and i == 0 else None)


def series_band(steps: pd.DataFrame, prefix: str, groups: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """Per step, the min and max of ``<prefix><g>`` over ``groups`` (equal arrays when they agree)."""
    values = steps[[f"{prefix}{g}" for g in groups]].to_numpy()
    return values.min(axis=1), values.max(axis=1)


def step_change_points(*ys: np.ndarray) -> np.ndarray:
    """The rows a post-step plot of ``ys`` (equal lengths) needs: the first, every row where one of them
    differs from the row before, and the last (where the drawn line ends). The rows left out only extend
    a horizontal segment, so the plot draws the same lines from about a tenth of a run's steps."""
    n = len(ys[0])
    keep = np.zeros(n, dtype=bool)
    if n:
        keep[0] = keep[-1] = True
        for y in ys:
            keep[1:] |= y[1:] != y[:-1]
    return np.flatnonzero(keep)


def _step(ax: Axes, x: np.ndarray, y: np.ndarray, **kw: Any) -> None:
    """``ax.step(x, y, where="post")`` drawn from the change points only (:func:`step_change_points`)."""
    rows = step_change_points(y)
    ax.step(x[rows], y[rows], where="post", **kw)


def _series(
    ax: Axes, steps: pd.DataFrame, xcol: str, prefix: str, groups: Sequence[int], label: str, colour: str, style: str
) -> None:
    lo, hi = series_band(steps, prefix, groups)
    x = steps[xcol].to_numpy()
    if np.array_equal(lo, hi):
        _step(ax, x, lo, label=label, color=colour, linestyle=style)
        return
    # The line first: a shared legend lists it before the band.
    _step(ax, x, hi, color=colour, linestyle=style, linewidth=0.8, label=label)
    rows = step_change_points(lo, hi)
    ax.fill_between(
        x[rows],
        lo[rows],
        hi[rows],
        step="post",
        color=colour,
        alpha=0.35,
        label=f"{label} (min-max of {len(groups)})",
        linewidth=0,
    )


#: What an eviction count counts, named in block_usage's legend (the raster's and the summary's count too).
EVICTION_DEFINITION = "evictions: cache entries removed, per group"


def plot_block_usage(result: ResultSource, path: str | Path, *, group_kinds: Sequence[str] | None = None) -> Path:
    """Free blocks of the shared pool, then per group panel (groups of one kind merged) blocks in use
    and cached blocks per step; evictions as ticks (few) or a density (many), their count in the panel's
    title; crashes marked. One legend for the figure, right of the panels, naming what an eviction count
    counts (:data:`EVICTION_DEFINITION`)."""
    t = tables_of(result)
    steps, kv = t["steps"], t["kv_events"]
    n = infer_num_groups(steps.columns)
    kinds = _kinds(result, group_kinds, n)
    panels = group_panels(steps, kinds) if not steps.empty else []
    fig, axes = _figure(
        len(panels) + 1, 1, width=11.0, height=2.0 * (len(panels) + 1) + 0.8, sharex=True, legend_right=3.0
    )
    fig.suptitle("KV-cache blocks over time")
    if steps.empty:
        _empty(axes[0, 0], "no steps recorded")
        return _save(fig, path)
    fig.supylabel("blocks", x=0.25 / fig.get_figwidth(), fontsize=10)  # every panel's unit, said once
    xcol, xlabel = _time_axis(result, steps)
    crashes = crash_positions(result, xcol)
    span = (float(steps[xcol].min()), float(steps[xcol].max()))
    ax = axes[0, 0]
    _step(ax, steps[xcol].to_numpy(), steps["free_blocks"].to_numpy(), color="#7f7f7f", label="free blocks (pool)")
    _mark_crashes(ax, crashes, True)
    ax.set_title("shared block pool", loc="left", fontsize=10)
    _usage_axes(ax)
    removed = kv[kv["kind"] == "removed"]
    unit = "steps" if xcol == "step" else "s"
    for panel, ax in zip(panels, axes[1:, 0]):
        _series(ax, steps, xcol, "blocks_g", panel.groups, "blocks in use", "#1f77b4", "-")
        _series(ax, steps, xcol, "cached_g", panel.groups, "cached blocks", "#9467bd", "--")
        # Marks per group, like the count: the first group's evictions (a merged panel's groups agree).
        ev = removed[removed["group"] == panel.groups[0]]
        title = f"{panel.label}: evictions {eviction_count(removed, panel.groups)}"
        kind, xs, counts = eviction_marks(ev[xcol], span)
        if kind == "ticks" and len(xs):
            ax.plot(
                xs,
                np.zeros(len(xs)),
                linestyle="none",
                marker="|",
                markersize=12,
                color="#d62728",
                label=f"{EVICTION_DEFINITION}\n(one tick each)",
            )
        elif kind == "density":
            # Scaled into the panel (no second y axis, which cost a third of this figure's time).
            top = max(
                float(series_band(steps, "blocks_g", panel.groups)[1].max()),
                float(series_band(steps, "cached_g", panel.groups)[1].max()),
                1.0,
            )
            peak = int(counts.max())
            _bars_at_zero(
                ax,
                counts * (0.4 * top / max(peak, 1)),
                xs,
                facecolor="#d62728",
                alpha=0.3,
                label=f"{EVICTION_DEFINITION}\n(bars: per {(xs[1] - xs[0]):.3g} {unit}, peak at 40% height)",
            )
            title += f", bars peak {peak}"
        _mark_crashes(ax, crashes, False)
        ax.set_title(title, loc="left", fontsize=10)
        _usage_axes(ax)
    axes[-1, 0].set_xlabel(xlabel)
    _figure_legend(fig, axes[0, 0])
    return _save(fig, path)


def _bars_at_zero(ax: Axes, heights: np.ndarray, edges: np.ndarray, **kw: Any) -> None:
    """``ax.stairs(heights, edges, fill=True, **kw)`` (filled, no outline) for ``heights`` >= 0, with the data limits taken from the
    bars' extent (``edges[0]``..``edges[-1]`` by 0..the tallest) instead of matplotlib walking the outline
    segment by segment (1.6 -> 0.1 ms for 80 bars): the same limits, the same pixels."""
    patch = StepPatch(heights, edges, baseline=0, fill=True, linewidth=0, **kw)
    ax.add_artist(patch)  # in ax.patches all the same (legend, drawing order); add_patch would walk it
    patch.sticky_edges.y.append(0)
    ax.update_datalim([(edges[0], 0.0), (edges[-1], max(float(heights.max()), 0.0))])
    ax.autoscale_view()


def _usage_axes(ax: Axes) -> None:
    ax.yaxis.set_major_locator(_y_locator(ax, integer=True))
    grid(ax)


def _figure_legend(fig: Figure, top: Axes) -> None:
    """One legend for every panel of ``fig`` (each label once, in drawing order), right of the panels and
    level with the top of ``top``."""
    handles: dict[str, Any] = {}
    for ax in fig.axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    if handles:
        box = top.get_position()
        anchor = (box.x1 + 0.1 / fig.get_figwidth(), box.y1)
        fig.add_artist(RunLegend([(h, label) for label, h in handles.items()], anchor, fig.transFigure))


def _beside(ax: Axes, title: str, **kw: Any) -> None:
    """A :class:`~sim.analysis.legend.RunLegend` of ``ax``'s labelled artists right of it, level with its top."""
    entries = list(zip(*ax.get_legend_handles_labels()))
    ax.add_artist(RunLegend(entries, (1.01, 1.0), ax.transAxes, title=title, **kw))


def _finish_panel(ax: Axes) -> None:
    ax.set_ylabel("blocks")
    ax.yaxis.set_major_locator(_y_locator(ax, integer=True))
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    grid(ax)


def _divergence_groups(kinds: Sequence[str], n: int) -> tuple[int, int] | None:
    if n < 2:
        return None
    if not kinds:
        return 0, 1
    fa = next((i for i, k in enumerate(kinds) if k == FULL_ATTENTION), 0)
    other = next((i for i, k in enumerate(kinds) if "mamba" in k), None)
    if other is None:
        other = next(i for i in range(n) if i != fa)
    return fa, other


def plot_divergence(result: ResultSource, path: str | Path, *, group_kinds: Sequence[str] | None = None) -> Path:
    """Per admitted row: full-attention hit vs Mamba hit, coloured by outcome, y = x marked.

    Equal points are merged into one marker whose area grows with the count.
    """
    t = tables_of(result)
    adm = t["admissions"]
    n = infer_num_groups(adm.columns)
    kinds = _kinds(result, group_kinds, n)
    fig, axes = _figure(width=8.5, height=6.0, legend_right=1.7)
    ax = axes[0, 0]
    fig.suptitle("Per-group prefix hits at admission")
    pair = _divergence_groups(kinds, n)
    admitted = adm[adm["outcome"] != NOT_ADMITTED]
    if pair is None or admitted.empty:
        _empty(ax, "fewer than two KV-cache groups" if pair is None else "no admissions")
        return _save(fig, path)
    gx, gy = pair
    xc, yc = f"hit_g{gx}", f"hit_g{gy}"
    counts = admitted.groupby([xc, yc, "outcome"], sort=True).size().reset_index(name="n")
    outcomes = _ordered_outcomes(counts["outcome"].tolist())
    others = [o for o in outcomes if o not in OUTCOME_COLOURS]
    for o in outcomes:
        rows = counts[counts["outcome"] == o]
        ax.scatter(
            rows[xc],
            rows[yc],
            s=30 + 20 * np.sqrt(rows["n"]),
            color=_outcome_colour(o, others),
            alpha=0.75,
            edgecolors="white",
            linewidths=0.5,
            label=f"{o} ({int(rows['n'].sum())})",
        )
    top = float(max(admitted[xc].max(), admitted[yc].max(), 1))
    ax.plot([0, top], [0, top], linestyle="--", color="#555555", linewidth=1, label="equal hits")
    ax.set_xlim(-0.03 * top, 1.05 * top)
    ax.set_ylim(-0.03 * top, 1.05 * top)
    ax.set_xlabel(f"{_group_label(gx, kinds)} hit (tokens)")
    ax.set_ylabel(f"{_group_label(gy, kinds)} hit (tokens)")
    ax.set_title(
        f"above the diagonal: g{gy} deeper; below: g{gx} deeper ({len(admitted)} admissions)",
        fontsize=9,
        color="#555555",
    )
    _beside(ax, "outcome (area ∝ count)", title_fontsize=10)
    grid(ax)
    return _save(fig, path)


def plot_eviction_raster(result: ResultSource, path: str | Path, *, group_kinds: Sequence[str] | None = None) -> Path:
    """One dot per evicted cache entry: time (or step) × block id, one colour per group panel (groups of
    one kind merged, the first one drawn) in one axes (the groups share the pool's block ids), each
    panel's count in the legend; crashes marked."""
    t = tables_of(result)
    kv, steps = t["kv_events"], t["steps"]
    n = max(infer_num_groups(t["admissions"].columns), infer_num_groups(steps.columns))
    kinds = _kinds(result, group_kinds, n)
    removed = kv[kv["kind"] == "removed"]
    panels = group_panels(steps, kinds) if n else []
    fig, axes = _figure(width=10.0, height=4.2, legend_right=2.9)
    ax = axes[0, 0]
    fig.suptitle("Evictions (cache entries removed)")
    if removed.empty or n == 0:
        _empty(ax, "no evictions")
        return _save(fig, path)
    xcol, xlabel = _time_axis(result, steps) if not steps.empty else ("step", "engine step")
    for panel in panels:
        g = panel.groups[0]
        ev = removed[removed["group"] == g]
        shown = f" (g{g} shown)" if len(panel.groups) > 1 else ""
        ax.scatter(
            ev[xcol],
            ev["block_id"].astype(float),
            s=6,
            marker="s",
            color=f"C{g % 10}",
            linewidths=0,
            rasterized=len(ev) > 2000,
            label=f"{panel.label}:\n{eviction_count(removed, panel.groups)}{shown}",
        )
    _mark_crashes(ax, crash_positions(result, xcol), True)
    ax.set_ylabel("block id")
    ax.yaxis.set_major_locator(_y_locator(ax, integer=True))
    grid(ax)
    if not steps.empty:
        ax.set_xlim(steps[xcol].min(), steps[xcol].max() + (steps["duration_s"].iloc[-1] if xcol == "time_s" else 1))
    ax.set_xlabel(xlabel)
    _beside(ax, "evictions per group", title_fontsize=9, markerscale=2.5)
    return _save(fig, path)


_LINESTYLES = ("-", "--", ":", "-.")


def _ecdf(ax: Axes, values: pd.Series, label: str | None = None, index: int = 0) -> bool:
    """Step ECDF; runs after the first get other line styles so that equal curves stay visible."""
    v = np.sort(values.dropna().to_numpy(dtype=float))
    if len(v) == 0:
        return False
    ax.step(
        np.concatenate([[v[0]], v]),
        np.concatenate([[0.0], np.arange(1, len(v) + 1) / len(v)]),
        where="post",
        label=label,
        color=f"C{index % 10}",
        linestyle=_LINESTYLES[index % len(_LINESTYLES)],
    )
    return True


def latency_unit(result: ResultSource) -> str:
    """``"steps"`` on the step clock (latencies count engine steps there), else ``"s"``."""
    return "steps" if summary_of(result).get("clock") == "steps" else "s"


def plot_latency_cdfs(result: ResultSource, path: str | Path) -> Path:
    """Empirical CDFs of TTFT, TPOT and E2E latency over finished requests (in steps on the step clock)."""
    per_req = request_metrics(tables_of(result)["requests"])
    done = per_req[per_req["finished"]]
    # One shared fraction axis, labelled on the left panel only (fewer tick labels to draw).
    fig, axes = _figure(1, 3, width=12.0, height=4.0, sharey=True)
    fig.suptitle(f"Latency CDFs ({len(done)} finished requests)")
    axes[0, 0].set_ylabel("fraction of requests")
    axes[0, 0].set_ylim(0, 1.02)
    for ax, (col, name) in zip(axes[0], _LATENCIES):
        # The unit in the title: no x label repeating it (a text fewer to draw per panel).
        ax.set_title(f"{name} ({latency_unit(result)})")
        if not _ecdf(ax, done[col]):
            _empty(ax, f"no {name} data", shared_y=True)
            continue
        grid(ax)
    return _save(fig, path)


def _bars(ax: Axes, table: pd.DataFrame, ylabel: str, xlabel: str) -> None:
    """Grouped bars: one cluster per row of ``table``, one bar per column (an outcome)."""
    outcomes = list(table.columns)
    others = [o for o in outcomes if o not in OUTCOME_COLOURS]
    width = 0.8 / max(len(outcomes), 1)
    x = np.arange(len(table.index))
    for j, o in enumerate(outcomes):
        bars = ax.bar(
            x + (j - (len(outcomes) - 1) / 2) * width, table[o], width, label=o, color=_outcome_colour(o, others)
        )
        ax.bar_label(bars, fontsize=7)
    ax.set_xticks(x, [str(i) for i in table.index])
    ax.yaxis.set_major_locator(_y_locator(ax, integer=True))
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.legend(title="outcome", fontsize=8)
    grid(ax, "y")


def _outcome_table(adm: pd.DataFrame, by: str | pd.Series) -> pd.DataFrame:
    table = adm.groupby([by, "outcome"]).size().unstack(fill_value=0)
    return table[_ordered_outcomes(list(table.columns))]


def outcome_counts(result: ResultSource) -> tuple[pd.Series, pd.Series]:
    """(requests by final outcome, each request once; admission attempts by outcome), in outcome order."""
    t = tables_of(result)
    final = t["requests"]["outcome"].value_counts()
    attempts = t["admissions"]["outcome"].value_counts()
    return (
        final.reindex(_ordered_outcomes(list(final.index))).astype(int),
        attempts.reindex(_ordered_outcomes(list(attempts.index))).astype(int),
    )


def plot_outcomes(result: ResultSource, path: str | Path) -> Path:
    """Requests by final outcome (each once), and admission attempts by outcome in a second panel; one
    panel saying so when the two give the same counts (every request admitted once)."""
    final, attempts = outcome_counts(result)
    same = not final.empty and final.equals(attempts)
    panels = (
        [(final, "requests (final outcome) = admission attempts")]
        if same
        else [
            (final, "requests (final outcome)"),
            (attempts, "admission attempts"),
        ]
    )
    fig, axes = _figure(1, len(panels), width=5.5 * len(panels) - 1.0, height=4.5, categorical_x=True)
    fig.suptitle("Outcomes")
    for ax, (counts, what) in zip(axes[0], panels):
        ax.set_title(what, fontsize=10)
        if counts.empty:
            _empty(ax, f"no {what.split(' ')[0]}")
            continue
        others = [o for o in counts.index if o not in OUTCOME_COLOURS]
        bars = ax.bar(
            [str(o) for o in counts.index], counts.to_numpy(), color=[_outcome_colour(o, others) for o in counts.index]
        )
        ax.bar_label(bars, fontsize=8)
        ax.yaxis.set_major_locator(_y_locator(ax, integer=True))
        ax.set_ylabel("count")
        grid(ax, "y")
    return _save(fig, path)


def single_outcome(result: ResultSource) -> str | None:
    """Why the outcomes figure would say nothing: every request and every admission attempt ended with
    one and the same outcome (a single bar); ``None`` when the figure shows a split."""
    final, attempts = outcome_counts(result)
    if len(final) != 1 or not final.equals(attempts):
        return None
    outcome, n = final.index[0], int(final.iloc[0])
    return f"all {n} requests and all {n} admission attempts ended `{outcome}` (a single bar)"


def connector_columns(steps: pd.DataFrame) -> list[str]:
    """The connector's per-step columns of the ``steps`` table (``conn_*``), in table order."""
    return [c for c in steps.columns if c.startswith("conn_")]


def plot_connector(result: ResultSource, path: str | Path) -> Path:
    """Connector per step: tier occupancy (``conn_tier_bytes``, GB) and loads / stores in flight."""
    steps = tables_of(result)["steps"]
    fig, axes = _figure(2, 1, width=10.0, height=5.0, sharex=True, legend_right=1.6)
    fig.suptitle(f"Connector ({summary_of(result).get('connector', '')})")
    if steps.empty or not connector_columns(steps):
        _empty(axes[0, 0], "no connector columns in the steps table")
        return _save(fig, path)
    xcol, xlabel = _time_axis(result, steps)
    ax = axes[0, 0]
    if "conn_tier_bytes" in steps:
        _step(
            ax,
            steps[xcol].to_numpy(),
            steps["conn_tier_bytes"].to_numpy(dtype=float) / 1e9,
            color="#8c564b",
            label="tier occupancy",
        )
    ax.set_ylabel("GB")
    ax.set_title("tier occupancy", loc="left", fontsize=10)
    grid(ax)
    ax = axes[1, 0]
    for col, colour in (("conn_loads_in_flight", "#1f77b4"), ("conn_stores_in_flight", "#ff7f0e")):
        if col in steps:
            _step(ax, steps[xcol].to_numpy(), steps[col].to_numpy(), color=colour, label=col[5:].replace("_", " "))
    ax.set_ylabel("transfers")
    ax.yaxis.set_major_locator(_y_locator(ax, integer=True))
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    grid(ax)
    ax.set_xlabel(xlabel)
    return _save(fig, path)


# ---------------------------------------------------------------- several runs


def compare_latency_cdfs(
    results: Mapping[str, Any], path: str | Path, *, force: bool = False, notes: list[str] | None = None
) -> Path:
    """TTFT / TPOT / E2E CDFs, one line per run label (``force``, ``notes``: see :func:`save_figure`)."""
    fig, axes = _figure(1, 3, width=12.0, height=4.0)
    fig.suptitle("Latency CDFs by run")
    done = {}
    for label, result in results.items():
        per_req = request_metrics(tables_of(result)["requests"])
        done[label] = per_req[per_req["finished"]]
    for ax, (col, name) in zip(axes[0], _LATENCIES):
        ax.set_title(name)
        drawn = [_ecdf(ax, d[col], label=str(label), index=i) for i, (label, d) in enumerate(done.items())]
        if not any(drawn):
            _empty(ax, f"no {name} data")
            continue
        ax.set_xlabel(f"{name} (s)")
        ax.set_ylabel("fraction of requests")
        ax.set_ylim(0, 1.02)
        ax.legend(fontsize=8)
        grid(ax)
    return _save(fig, path, force=force, notes=notes)


def compare_outcomes(
    results: Mapping[str, Any], path: str | Path, *, force: bool = False, notes: list[str] | None = None
) -> Path:
    """Admission outcome counts, one bar cluster per run label (``force``, ``notes``: see :func:`save_figure`)."""
    frames = []
    for label, result in results.items():
        adm = tables_of(result)["admissions"]
        frames.append(pd.DataFrame({"run": str(label), "outcome": adm["outcome"].astype(object)}))
    adm = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame({"run": [], "outcome": []})
    fig, axes = _figure(width=max(6.0, 1.6 * len(results) + 3), height=4.5, categorical_x=True)
    fig.suptitle("Admission outcomes by run")
    if adm.empty:
        _empty(axes[0, 0], "no admissions")
        return _save(fig, path, force=force, notes=notes)
    table = _outcome_table(adm, "run").reindex([str(k) for k in results], fill_value=0)
    _bars(axes[0, 0], table, "admission attempts", "run")
    return _save(fig, path, force=force, notes=notes)


def plot_hit_rate_by_turn(
    turns: pd.DataFrame, path: str | Path, *, group_kinds: Sequence[str] | None = None, min_turns: int = 5
) -> Path:
    """Usable hit rate by turn index (sessions): the share of the tokens a turn could reuse from its
    parent's prompt + answer that it did reuse, overall and per group (``sim.results.sessions``).
    Turn indices with fewer than ``min_turns`` turns are left out (their rate is noise)."""
    from sim.results.sessions import by_turn

    table = by_turn(turns)
    table = table[(table["turn"] > 1) & (table["n"] >= min_turns)] if len(table) else table
    kinds = list(group_kinds or [])
    fig, axes = _figure()
    ax = axes[0][0]
    ax.set_title(f"Usable prefix hit rate by turn (turn indices with >= {min_turns} turns)")
    if not len(table) or table["usable_hit_rate"].isna().all():
        _empty(ax, "no later turns with reusable tokens")
        return _save(fig, path)
    ax.plot(table["turn"], table["usable_hit_rate"], marker="o", color="C0", label="local hit (all groups)")
    for i, col in enumerate(c for c in table.columns if c.startswith("usable_hit_g")):
        ax.plot(
            table["turn"],
            table[col],
            marker=".",
            linestyle=_LINESTYLES[(i + 1) % len(_LINESTYLES)],
            color=f"C{i + 1}",
            label=_group_label(i, kinds),
        )
    ax.set_xlabel("turn index")
    ax.set_ylabel("reused / reusable tokens")
    ax.set_ylim(0, 1.02)
    ax.xaxis.set_major_locator(_locator(integer=True))
    grid(ax)
    ax.legend(fontsize=8)
    return _save(fig, path)


# ---------------------------------------------------------------- clusters


def instance_indices(result: ResultSource) -> list[int]:
    """The instances of a cluster result (from the ``steps`` table's ``instance`` column); ``[]`` for a
    one-instance run."""
    steps = tables_of(result)["steps"]
    if "instance" not in steps.columns:
        return []
    n = summary_of(result).get("cluster", {}).get("instances")
    return list(range(int(n))) if isinstance(n, int) else sorted(int(i) for i in steps["instance"].unique())


def plot_instances(result: ResultSource, path: str | Path, *, group_kinds: Sequence[str] | None = None) -> Path:
    """A cluster's per-instance panel: per instance (one row each, one time axis) the free blocks of its
    pool and the cached blocks of its full-attention and Mamba (or second) group per step."""
    t = tables_of(result)
    steps = t["steps"]
    n = infer_num_groups(steps.columns)
    kinds = _kinds(result, group_kinds, n)
    indices = instance_indices(result) or [0]
    fig, axes = _figure(len(indices), 1, width=11.0, height=1.7 * len(indices) + 1.3, sharex=True, legend_right=2.8)
    fig.suptitle("KV-cache blocks per instance")
    if steps.empty:
        _empty(axes[0, 0], "no steps recorded")
        return _save(fig, path)
    xcol, xlabel = _time_axis(result, steps)
    pair = _divergence_groups(kinds, n) or (0,)
    routed = summary_of(result).get("cluster", {}).get("routed") or []
    by_instance = steps.groupby("instance", sort=True) if "instance" in steps.columns else [(0, steps)]
    frames = {int(i): frame for i, frame in by_instance}
    for ax, index in zip(axes[:, 0], indices):
        frame = frames.get(index)
        title = f"instance {index}" + (f": {routed[index]} requests routed" if index < len(routed) else "")
        ax.set_title(title, loc="left", fontsize=10)
        if frame is None or frame.empty:
            _empty(ax, "no steps")
            continue
        ax.step(frame[xcol], frame["free_blocks"], where="post", color="#7f7f7f", label="free blocks")
        for g, colour in zip(pair, ("#9467bd", "#17becf")):
            ax.step(
                frame[xcol], frame[f"cached_g{g}"], where="post", color=colour, label=f"cached {_group_label(g, kinds)}"
            )
        _finish_panel(ax)
    axes[-1, 0].set_xlabel(xlabel)
    return _save(fig, path)


@dataclass(frozen=True)
class RouterPanel:
    """What :func:`plot_router` draws, one entry per instance in instance order."""

    router: str
    instances: list[int]
    #: Usable (local) and full-attention-only hit rates: fractions of the prompt tokens.
    usable: np.ndarray
    fa_only: np.ndarray
    routed: list[int]
    #: ``usable / fa_only`` (0 where the instance had no FA hit): the routed-to-cached match.
    usable_share: np.ndarray
    #: Queued requests (running + waiting) weighted by step duration over the run's span (an idle
    #: instance takes no steps: it counts as empty), and their peak; ``None`` without steps.
    mean_queued: np.ndarray | None
    peak_queued: np.ndarray | None


def router_panel(result: ResultSource) -> RouterPanel | None:
    """The router panel's numbers of a cluster result (``None`` for a one-instance run)."""
    summary = summary_of(result)
    instances = summary.get("instances") or []
    if not instances:
        return None
    cluster = summary.get("cluster", {})
    index = [int(s.get("instance", i)) for i, s in enumerate(instances)]
    usable = np.array([float(s.get("cache", {}).get("local_rate") or 0.0) for s in instances])
    fa = np.array([float(s.get("cache", {}).get("full_attention_hit_rate") or 0.0) for s in instances])
    share = np.divide(usable, fa, out=np.zeros_like(usable), where=fa > 0)
    steps = tables_of(result)["steps"]
    mean = peak = None
    if not steps.empty and "instance" in steps.columns:
        queued = steps["running"] + steps["waiting"]
        span = float((steps["time_s"] + steps["duration_s"]).max() - steps["time_s"].min()) or 1.0
        weighted = (queued * steps["duration_s"]).groupby(steps["instance"]).sum()
        top = queued.groupby(steps["instance"]).max()
        mean = np.array([float(weighted.get(i, 0.0)) / span for i in index])
        peak = np.array([float(top.get(i, 0)) for i in index])
    aware = " (group_aware)" if cluster.get("group_aware") else ""
    return RouterPanel(
        router=f"{cluster.get('router', '?')}{aware}",
        instances=index,
        usable=usable,
        fa_only=fa,
        routed=list(cluster.get("routed") or [0] * len(index)),
        usable_share=share,
        mean_queued=mean,
        peak_queued=peak,
    )


def plot_router(result: ResultSource, path: str | Path) -> Path:
    """A cluster's router panel (:class:`RouterPanel`): per instance the usable and full-attention-only hit
    rates, the requests routed there, the share of the FA prefix found there that was usable (100 % when
    every FA hit had its Mamba state) and the load: queued requests, time-weighted, and their peak."""
    panel = router_panel(result)
    fig, axes = _figure(2, 2, width=12.0, height=7.5, categorical_x=True)
    hits, routed_ax, usable_ax, load_ax = axes[0, 0], axes[0, 1], axes[1, 0], axes[1, 1]
    if panel is None:
        fig.suptitle("Router")
        for ax in axes.flat:
            _empty(ax, "not a cluster run")
        return _save(fig, path)
    fig.suptitle(f"Router: {panel.router}, {len(panel.instances)} instances")
    labels = [str(i) for i in panel.instances]
    x = np.arange(len(labels))
    hits.bar(x - 0.2, 100 * panel.fa_only, 0.4, label="full attention only", color="#9467bd")
    hits.bar(x + 0.2, 100 * panel.usable, 0.4, label="usable (local)", color="#2ca02c")
    hits.set_title("hit rate by instance", fontsize=10)
    hits.set_ylabel("% of prompt tokens")
    hits.legend(fontsize=8)
    routed_ax.bar_label(routed_ax.bar(x, panel.routed, color="#1f77b4"), fontsize=8)
    routed_ax.set_title("requests routed", fontsize=10)
    routed_ax.set_ylabel("requests")
    usable_ax.bar_label(usable_ax.bar(x, 100 * panel.usable_share, color="#ff7f0e"), fmt="%.0f%%", fontsize=8)
    usable_ax.set_ylim(0, 110)
    usable_ax.set_title("full-attention prefix found there that was usable", fontsize=10)
    usable_ax.set_ylabel("usable / FA hit (%)")
    load_ax.set_title("load: queued requests (running + waiting)", fontsize=10)
    for ax in (hits, routed_ax, usable_ax, load_ax):
        ax.set_xticks(x, labels)
        grid(ax, "y")
    usable_ax.set_xlabel("instance")
    load_ax.set_xlabel("instance")
    if panel.mean_queued is None or panel.peak_queued is None:
        _empty(load_ax, "no steps recorded")
        return _save(fig, path)
    load_ax.bar(x - 0.2, panel.mean_queued, 0.4, label="time-weighted mean", color="#1f77b4")
    load_ax.bar_label(
        load_ax.bar(x + 0.2, panel.peak_queued, 0.4, label="peak", color="#aec7e8"), fmt="%.0f", fontsize=7
    )
    load_ax.set_ylabel("requests")
    load_ax.legend(fontsize=8, loc="upper center")
    return _save(fig, path)


#: Below this many finished requests a latency CDF says nothing (a two-request step-clock script): left out.
MIN_REQUESTS_FOR_CDFS = 20

#: What each single-run figure shows, in drawing order (the lines of ``plots/index.md``).
FIGURES: Mapping[str, str] = {
    "block_usage": "free blocks of the shared pool; per group panel blocks in use, cached blocks, evictions per group",
    "divergence": "each admission's full-attention hit against its Mamba (or second group's) hit, by outcome",
    "eviction_raster": "one dot per evicted cache entry: time (or step) by block id, one colour per group panel",
    "latency_cdfs": "TTFT, TPOT and E2E latency distributions of the finished requests",
    "outcomes": "admission outcomes: final per request, and per attempt",
    "connector": "the connector's own per-step columns (tier blocks, loads in flight)",
    "instances": "a cluster: per instance, free blocks and the cached blocks of its FA and Mamba group per step",
    "router": "a cluster: hit rate (usable, FA only), requests routed, usable share of the FA hit and load (mean, peak) per instance",
}

#: The figures that read the ``steps`` table as one engine's series: a cluster draws ``instances`` instead.
_ONE_ENGINE = ("block_usage", "connector")
#: The figures only a cluster run has.
_CLUSTER_ONLY = ("instances", "router")


def plot_all(
    result: ResultSource, out_dir: str | Path, fmt: str = "png", *, group_kinds: Sequence[str] | None = None
) -> list[Path]:
    """Every single-run figure that says something into ``out_dir``, plus ``index.md`` naming each figure and
    each one left out with the reason; returns the paths written, in a fixed order (the index last).

    Left out: the latency CDFs below :data:`MIN_REQUESTS_FOR_CDFS` finished requests, the outcomes when
    every request and attempt has one outcome (:func:`single_outcome`), the connector panel without
    connector columns; for a cluster run (an ``instance`` column) the one-engine step series
    (block usage, connector), drawn per instance in ``instances`` beside the ``router`` panel. A
    one-instance run has no cluster figures."""
    if fmt not in PLOT_FORMATS:
        raise ValueError(f"plot format {fmt!r} is not one of {PLOT_FORMATS}")
    out = Path(out_dir)
    tables = tables_of(result)
    finished = int(tables["requests"]["finished_s"].notna().sum())
    left_out: dict[str, str] = {}
    if finished < MIN_REQUESTS_FOR_CDFS:
        left_out["latency_cdfs"] = (
            f"{finished} finished requests (fewer than {MIN_REQUESTS_FOR_CDFS}): a distribution of so few says nothing"
        )
    alike = single_outcome(result)
    if alike is not None:
        left_out["outcomes"] = alike
    if not connector_columns(tables["steps"]):
        left_out["connector"] = "the run has no connector columns"
    if "instance" in tables["steps"].columns:
        for name in _ONE_ENGINE:
            left_out.setdefault(name, "a cluster run: its instances' steps are drawn per instance in `instances`")
    # A one-instance run has no cluster figures to draw or leave out.
    names = [n for n in FIGURES if "instance" in tables["steps"].columns or n not in _CLUSTER_ONLY]
    draw: dict[str, Callable[[Path], Path]] = {
        "block_usage": lambda p: plot_block_usage(result, p, group_kinds=group_kinds),
        "divergence": lambda p: plot_divergence(result, p, group_kinds=group_kinds),
        "eviction_raster": lambda p: plot_eviction_raster(result, p, group_kinds=group_kinds),
        "latency_cdfs": lambda p: plot_latency_cdfs(result, p),
        "outcomes": lambda p: plot_outcomes(result, p),
        "connector": lambda p: plot_connector(result, p),
        "instances": lambda p: plot_instances(result, p, group_kinds=group_kinds),
        "router": lambda p: plot_router(result, p),
    }
    with shared_text():  # the figures' strings and glyphs laid out and rendered once
        paths = [draw[name](out / f"{name}.{fmt}") for name in names if name not in left_out]
    lines = ["# Plots", ""]
    lines += [f"- `{p.name}`: {FIGURES[p.stem]}" for p in paths]
    if left_out:
        lines += ["", "Left out:", ""] + [f"- `{name}`: {why}" for name, why in left_out.items()]
    index = out / "index.md"
    write_file(index, "\n".join(lines) + "\n")
    return paths + [index]
