"""Sweep figures: metrics against one grid key, one line (numeric x) or one bar per group
(categorical x, e.g. the prefix policy) per value of another.

Titles are readable (``cache.hit_rate.g0`` -> ``cache hit rate g0 (full_attention)``, the group's
type from the table's ``groups`` column); rates (a metric named ``..rate..``, not per second) are
drawn in percent, as the run summary prints them; count metrics (integers) get integer ticks.
:func:`sweep_points` computes what is drawn (testable without a figure).

Only ``status == "ok"`` rows are plotted. The seeds of a grid point are summarised
as a mean line with a min-max band. Every other grid column must be constant in
the frame given (filter first, e.g. ``df[df["connector.type"] == "scripted"]``):
averaging over an unnamed axis would silently mix different experiments.

Uses matplotlib's object API with the Agg canvas (no pyplot global state).
"""

from __future__ import annotations

import json
import math
import numbers
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from sim.sweep.grid import yaml_text

_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
_LINESTYLES = ("-", "--", "-.", ":")


def _grid_columns(frame: pd.DataFrame) -> list[str]:
    """Grid columns sit between ``run_id`` and ``seed`` (the sweep.parquet layout)."""
    cols = list(frame.columns)
    if "run_id" in cols and "seed" in cols and cols.index("run_id") < cols.index("seed"):
        return cols[cols.index("run_id") + 1 : cols.index("seed")]
    return []


def _metric_columns(frame: pd.DataFrame) -> list[str]:
    cols = list(frame.columns)
    return cols[cols.index("error") + 1 :] if "error" in cols else cols


def _label(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "null"
    return value if isinstance(value, str) else yaml_text(value.item() if isinstance(value, np.generic) else value)


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _ordered_labels(series: pd.Series) -> list[str]:
    """Distinct value labels: numeric order when every value is a number (null first), else first appearance."""
    seen: dict[str, Any] = {}
    for value in series:
        seen.setdefault(_label(value), value)
    present = {k: v for k, v in seen.items() if k != "null"}
    if present and all(_is_number(v) for v in present.values()):
        return (["null"] if "null" in seen else []) + sorted(present, key=lambda k: float(present[k]))
    return list(seen)


def _check_columns(frame: pd.DataFrame, x: str, hue: str | None, metrics: Sequence[str]) -> None:
    grid = _grid_columns(frame)
    for role, key in (("x", x), ("hue", hue)):
        if key is not None and key not in frame.columns:
            raise ValueError(f"{role} {key!r} is not a column (grid columns: {', '.join(grid) or 'none'})")
    if not metrics:
        raise ValueError("metrics: give at least one summary metric to plot")
    available = _metric_columns(frame)
    for metric in metrics:
        if metric not in frame.columns:
            raise ValueError(f"metric {metric!r} is not a column (metrics: {', '.join(available) or 'none'})")
        column = frame[metric]
        if not (pd.api.types.is_numeric_dtype(column) or pd.api.types.is_bool_dtype(column)) and column.notna().any():
            raise ValueError(f"metric {metric!r} is not numeric (dtype {column.dtype})")
    for key in grid:
        if key in (x, hue):
            continue
        labels = _ordered_labels(frame[key])
        if len(labels) > 1:
            raise ValueError(
                f"grid column {key!r} also varies ({', '.join(labels)}); select one value first, "
                f"e.g. df[df[{key!r}] == ...], or plot it as x or hue"
            )


def group_kinds_of(frame: pd.DataFrame) -> list[str]:
    """The group types recorded in the table's ``groups`` column (JSON list text), or ``[]``."""
    if "groups" not in frame.columns:
        return []
    for text in frame["groups"].dropna():
        try:
            kinds = json.loads(text)
        except (TypeError, ValueError):
            continue
        if isinstance(kinds, list) and all(isinstance(k, str) for k in kinds):
            return kinds
    return []


def metric_title(metric: str, kinds: Sequence[str] = ()) -> str:
    """``cache.hit_rate.g0`` -> ``cache hit rate g0 (full_attention)`` (the type when known)."""
    words = []
    for part in metric.split("."):
        if part.startswith("g") and part[1:].isdigit() and int(part[1:]) < len(kinds):
            words.append(f"{part} ({kinds[int(part[1:])]})")
        else:
            words.append(part.replace("_", " "))
    return " ".join(words)


def is_rate(metric: str) -> bool:
    """A fraction in [0, 1] drawn as percent: ``rate`` in its name, not a per-second throughput."""
    return "rate" in metric and "per_s" not in metric


def sweep_points(
    frame: pd.DataFrame, x: str, metric: str, hue: str | None = None, missing: float | None = None
) -> pd.DataFrame:
    """What a panel draws: per (hue label, x label) the mean, min and max over seeds of ``ok`` runs,
    in percent for a rate; columns ``hue, x, mean, min, max, count`` in hue then x order."""
    ok = frame[frame["status"] == "ok"] if "status" in frame.columns else frame
    values = ok[metric].astype(float)
    if missing is not None:
        values = values.fillna(missing)
    if is_rate(metric):
        values = values * 100.0
    x_labels = _ordered_labels(frame[x])
    hue_labels = _ordered_labels(frame[hue]) if hue is not None else ["all"]
    keys = pd.DataFrame({"hue": ok[hue].map(_label) if hue is not None else "all", "x": ok[x].map(_label), "v": values})
    stats = keys.groupby(["hue", "x"], sort=False)["v"].agg(["mean", "min", "max", "count"]).reset_index()
    stats = stats[stats["count"] > 0]
    stats["_h"] = stats["hue"].map(hue_labels.index)
    stats["_x"] = stats["x"].map(x_labels.index)
    return stats.sort_values(["_h", "_x"]).drop(columns=["_h", "_x"]).reset_index(drop=True)


def plot_sweep(
    sweep_df: pd.DataFrame,
    x: str,
    metrics: Sequence[str],
    hue: str | None = None,
    out: Path | str | None = None,
    *,
    title: str | None = None,
    logx: bool = False,
    missing: float | None = None,
    force: bool = False,
) -> Figure:
    """One panel per metric against ``x``; per ``hue`` value the mean over seeds with its min-max.

    A numeric ``x`` without nulls is placed on a numeric axis (``logx`` makes it log2) with one line per
    hue value and a min-max band; anything else is categorical (numeric order when the values are numbers,
    ``null`` first, else order of appearance) with grouped bars and min-max error bars.
    ``missing`` replaces a metric that a successful run's summary lacks (null cell); summaries leave zero
    counts out of count mappings (``admissions.by_outcome.crash``), so ``missing=0`` is right for those.
    Without it such runs are left out of that metric's mean. Writes a PNG to ``out`` when given; returns the
    figure.
    """
    _check_columns(sweep_df, x, hue, metrics)
    frame = sweep_df[sweep_df["status"] == "ok"] if "status" in sweep_df.columns else sweep_df
    numeric_x = (
        pd.api.types.is_numeric_dtype(sweep_df[x])
        and not pd.api.types.is_bool_dtype(sweep_df[x])
        and sweep_df[x].notna().all()
    )
    x_labels = _ordered_labels(sweep_df[x])
    hue_labels = _ordered_labels(sweep_df[hue]) if hue is not None else ["all"]
    x_value = {_label(v): float(v) for v in sweep_df[x]} if numeric_x else {k: float(i) for i, k in enumerate(x_labels)}
    kinds = group_kinds_of(sweep_df)

    ncols = min(len(metrics), 3)
    nrows = math.ceil(len(metrics) / ncols)
    legend_width = 2.2 if hue is not None else 0.0
    fig = Figure(figsize=(max(4.6 * ncols, 6.0) + legend_width, 3.6 * nrows), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    width = 0.8 / max(len(hue_labels), 1)
    for ax, metric in zip(axes, metrics):
        points = sweep_points(sweep_df, x, metric, hue, missing)
        for i, label in enumerate(hue_labels):
            stats = points[points["hue"] == label]
            if stats.empty:
                continue
            xs = np.array([x_value[v] for v in stats["x"]])
            mean, lo, hi = (stats[c].to_numpy(dtype=float) for c in ("mean", "min", "max"))
            if not numeric_x:
                ax.bar(
                    xs + (i - (len(hue_labels) - 1) / 2) * width,
                    mean,
                    width,
                    label=label,
                    color=f"C{i % 10}",
                    yerr=np.vstack([mean - lo, hi - mean]) if (hi > lo).any() else None,
                    capsize=3,
                )
                continue
            # Distinct markers and shrinking sizes keep lines that coincide (common: policies that agree) visible.
            (line,) = ax.plot(
                xs,
                mean,
                marker=_MARKERS[i % len(_MARKERS)],
                markersize=max(9 - 1.5 * i, 3),
                linestyle=_LINESTYLES[i % len(_LINESTYLES)],
                label=label,
            )
            if (hi > lo).any():
                ax.fill_between(xs, lo, hi, color=line.get_color(), alpha=0.2, linewidth=0)
        name = metric_title(metric, kinds)
        ax.set_title(name)
        ax.set_xlabel(x)
        ax.set_ylabel(f"{name} (%)" if is_rate(metric) else name)
        values = frame[metric].dropna()
        if not is_rate(metric) and len(values) and bool((values.astype(float) % 1 == 0).all()):
            ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(True, alpha=0.3)
        if not numeric_x:
            ax.set_xticks(range(len(x_labels)), x_labels)
        else:
            if logx:
                ax.set_xscale("log", base=2)
            if len(x_labels) <= 12:
                ax.set_xticks([float(v) for v in sorted(set(sweep_df[x]))], x_labels, minor=False)
                ax.minorticks_off()
    for ax in axes[len(metrics) :]:
        ax.set_visible(False)
    if hue is not None:
        handles, labels = axes[0].get_legend_handles_labels()
        for ax in axes[1 : len(metrics)]:
            for h, label in zip(*ax.get_legend_handles_labels()):
                if label not in labels:
                    handles.append(h)
                    labels.append(label)
        fig.legend(handles, labels, title=hue, loc="outside right upper")
    seeds = frame["seed"].nunique() if "seed" in frame.columns else 1
    names = [metric_title(m, kinds) for m in metrics]
    heading = title or (f"{' and '.join(names)} vs {x}" if len(metrics) <= 2 else f"{len(metrics)} metrics vs {x}")
    spread = (
        f"mean over {seeds} seeds; {'band' if numeric_x else 'error bar'}: min-max over seeds"
        if seeds > 1
        else "one seed per point"
    )
    fig.suptitle(f"{heading}\n{spread}", fontsize="medium")
    if out is not None:
        from sim.analysis.figures import save_figure

        save_figure(fig, out, dpi=120, force=force)
    return fig
