"""Sweep figures: metrics against one grid key, one line per value of another.

Only ``status == "ok"`` rows are plotted. The seeds of a grid point are summarised
as a mean line with a min-max band. Every other grid column must be constant in
the frame given (filter first, e.g. ``df[df["connector.type"] == "scripted"]``):
averaging over an unnamed axis would silently mix different experiments.

Uses matplotlib's object API with the Agg canvas (no pyplot global state).
"""

from __future__ import annotations

import math
import numbers
from pathlib import Path
from typing import Any, Sequence

import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

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
    return value if isinstance(value, str) else yaml_text(value.item() if hasattr(value, "item") else value)


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
) -> Figure:
    """One panel per metric against ``x``; one line per ``hue`` value (mean over seeds, min-max band).

    A numeric ``x`` without nulls is placed on a numeric axis (``logx`` makes it log2); anything else is
    categorical, in numeric order when the values are numbers (``null`` first), else in order of appearance.
    ``missing`` replaces a metric that a successful run's summary lacks (null cell); summaries leave zero
    counts out of count mappings (``admissions.by_outcome.crash``), so ``missing=0`` is right for those.
    Without it such runs are left out of that metric's mean. Writes a PNG to ``out`` when given; returns the
    figure.
    """
    _check_columns(sweep_df, x, hue, metrics)
    frame = sweep_df[sweep_df["status"] == "ok"] if "status" in sweep_df.columns else sweep_df
    numeric_x = pd.api.types.is_numeric_dtype(sweep_df[x]) and not pd.api.types.is_bool_dtype(sweep_df[x]) and sweep_df[x].notna().all()
    x_labels = _ordered_labels(sweep_df[x])
    position = {label: i for i, label in enumerate(x_labels)}
    hue_labels = _ordered_labels(sweep_df[hue]) if hue is not None else ["all"]

    data = pd.DataFrame(
        {
            "_x": frame[x].astype(float) if numeric_x else frame[x].map(lambda v: position[_label(v)]),
            "_hue": frame[hue].map(_label) if hue is not None else "all",
        }
    )
    ncols = min(len(metrics), 3)
    nrows = math.ceil(len(metrics) / ncols)
    legend_width = 2.2 if hue is not None else 0.0
    fig = Figure(figsize=(max(4.6 * ncols, 6.0) + legend_width, 3.6 * nrows), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    for ax, metric in zip(axes, metrics):
        values = frame[metric].astype(float)
        if missing is not None:
            values = values.fillna(missing)
        for i, label in enumerate(hue_labels):
            mask = data["_hue"] == label
            stats = values[mask].groupby(data["_x"][mask]).agg(["mean", "min", "max", "count"])
            stats = stats[stats["count"] > 0].sort_index()
            if stats.empty:
                continue
            # Distinct markers and shrinking sizes keep lines that coincide (common: policies that agree) visible.
            (line,) = ax.plot(
                stats.index,
                stats["mean"],
                marker=_MARKERS[i % len(_MARKERS)],
                markersize=max(9 - 1.5 * i, 3),
                linestyle=_LINESTYLES[i % len(_LINESTYLES)],
                label=label,
            )
            if (stats["max"] > stats["min"]).any():
                ax.fill_between(stats.index, stats["min"], stats["max"], color=line.get_color(), alpha=0.2, linewidth=0)
        ax.set_title(metric)
        ax.set_xlabel(x)
        ax.set_ylabel(metric)
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
            for h, l in zip(*ax.get_legend_handles_labels()):
                if l not in labels:
                    handles.append(h)
                    labels.append(l)
        fig.legend(handles, labels, title=hue, loc="outside right upper")
    seeds = frame["seed"].nunique() if "seed" in frame.columns else 1
    heading = title or (f"{' and '.join(metrics)} vs {x}" if len(metrics) <= 2 else f"{len(metrics)} metrics vs {x}")
    spread = f"mean over {seeds} seeds; band: min-max over seeds" if seeds > 1 else "one seed per point"
    fig.suptitle(f"{heading}\n{spread}", fontsize="medium")
    if out is not None:
        out = Path(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, dpi=120)
    return fig
