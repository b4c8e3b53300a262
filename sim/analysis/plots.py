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

from pathlib import Path
from typing import Any, Mapping, Sequence

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from sim.results.metrics import FULL_ATTENTION, NOT_ADMITTED, request_metrics
from sim.trace.tables import TABLE_NAMES, empty_table, infer_num_groups

PLOT_FORMATS = ("png", "svg")

#: Fixed colours for the outcomes DESIGN.md §3/§6 name; others cycle through tab10.
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


def _tables(result: Any) -> dict[str, pd.DataFrame]:
    tables = result.tables if hasattr(result, "tables") else result
    if not isinstance(tables, Mapping):
        raise ValueError("expected a loaded result, an object with .tables, or a mapping of DataFrames")
    num_groups = max([0] + [infer_num_groups(t.columns) for t in tables.values()])
    return {n: tables[n] if n in tables else empty_table(n, num_groups) for n in TABLE_NAMES}


def _kinds(result: Any, group_kinds: Sequence[str] | None, num_groups: int) -> list[str]:
    if group_kinds is None:
        group_kinds = getattr(result, "group_kinds", None) or (getattr(result, "summary", None) or {}).get("groups")
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


def _time_axis(result: Any, steps: pd.DataFrame) -> tuple[str, str]:
    """``time_s`` under ``clock: time``, ``step`` under ``clock: steps`` (where time counts steps)."""
    clock = (getattr(result, "summary", None) or {}).get("clock")
    if clock == "time" or (clock is None and not steps["time_s"].equals(steps["step"].astype(float))
                           and steps["time_s"].nunique() > 1):
        return "time_s", "simulated time (s)"
    return "step", "engine step"


def _empty(ax: Axes, message: str) -> None:
    ax.text(0.5, 0.5, message, ha="center", va="center", fontsize=13, color="#555555", transform=ax.transAxes)
    ax.set_xticks([])
    ax.set_yticks([])


def _figure(nrows: int = 1, ncols: int = 1, *, width: float = 9.0, height: float = 4.5, **kw) -> tuple[Figure, np.ndarray]:
    fig = Figure(figsize=(width, height), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False, **kw)
    return fig, axes


def _save(fig: Figure, path: str | Path) -> Path:
    out = Path(path)
    fmt = out.suffix.lstrip(".").lower()
    if fmt not in PLOT_FORMATS:
        raise ValueError(f"plot path {out} must end in one of {', '.join('.' + f for f in PLOT_FORMATS)}")
    out.parent.mkdir(parents=True, exist_ok=True)
    metadata = {"Software": None} if fmt == "png" else {"Date": None, "Creator": None}
    with matplotlib.rc_context({"svg.hashsalt": "hybridsim", "svg.fonttype": "path"}):
        fig.savefig(out, format=fmt, dpi=100, metadata=metadata)
    return out


# ---------------------------------------------------------------- single run


def plot_block_usage(result: Any, path: str | Path, *, group_kinds: Sequence[str] | None = None) -> Path:
    """Free blocks of the shared pool, then per group blocks in use and cached blocks per step.

    Evictions (``removed`` events) are a rug of red ticks along each group's
    time axis.
    """
    t = _tables(result)
    steps, kv = t["steps"], t["kv_events"]
    n = infer_num_groups(steps.columns)
    kinds = _kinds(result, group_kinds, n)
    fig, axes = _figure(n + 1, 1, width=10.0, height=2.2 * (n + 1) + 0.8, sharex=True)
    fig.suptitle("KV-cache blocks over time")
    if steps.empty:
        _empty(axes[0, 0], "no steps recorded")
        for ax in axes[1:, 0]:
            ax.set_axis_off()
        return _save(fig, path)
    xcol, xlabel = _time_axis(result, steps)
    ax = axes[0, 0]
    ax.step(steps[xcol], steps["free_blocks"], where="post", color="#7f7f7f", label="free blocks")
    ax.set_title("shared block pool", loc="left", fontsize=10)
    _finish_panel(ax)
    removed = kv[kv["kind"] == "removed"]
    for g in range(n):
        ax = axes[g + 1, 0]
        ax.step(steps[xcol], steps[f"blocks_g{g}"], where="post", label="blocks in use", color="#1f77b4")
        ax.step(steps[xcol], steps[f"cached_g{g}"], where="post", label="cached blocks", color="#9467bd",
                linestyle="--")
        ev = removed[removed["group"] == g]
        if len(ev):
            ax.plot(ev[xcol], np.zeros(len(ev)), linestyle="none", marker="|", markersize=12,
                    color="#d62728", label=f"evictions ({len(ev)})")
        ax.set_title(_group_label(g, kinds), loc="left", fontsize=10)
        _finish_panel(ax)
    axes[-1, 0].set_xlabel(xlabel)
    return _save(fig, path)


def _finish_panel(ax: Axes) -> None:
    ax.set_ylabel("blocks")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    ax.grid(alpha=0.3)


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


def plot_divergence(result: Any, path: str | Path, *, group_kinds: Sequence[str] | None = None) -> Path:
    """Per admitted row: full-attention hit vs Mamba hit, coloured by outcome, y = x marked.

    Equal points are merged into one marker whose area grows with the count.
    """
    t = _tables(result)
    adm = t["admissions"]
    n = infer_num_groups(adm.columns)
    kinds = _kinds(result, group_kinds, n)
    fig, axes = _figure(width=7.5, height=6.0)
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
        ax.scatter(rows[xc], rows[yc], s=30 + 20 * np.sqrt(rows["n"]), color=_outcome_colour(o, others),
                   alpha=0.75, edgecolors="white", linewidths=0.5, label=f"{o} ({int(rows['n'].sum())})")
    top = float(max(admitted[xc].max(), admitted[yc].max(), 1))
    ax.plot([0, top], [0, top], linestyle="--", color="#555555", linewidth=1, label="equal hits")
    ax.set_xlim(-0.03 * top, 1.05 * top)
    ax.set_ylim(-0.03 * top, 1.05 * top)
    ax.set_xlabel(f"{_group_label(gx, kinds)} hit (tokens)")
    ax.set_ylabel(f"{_group_label(gy, kinds)} hit (tokens)")
    ax.set_title(f"above the diagonal: g{gy} deeper; below: g{gx} deeper ({len(admitted)} admissions)",
                 fontsize=9, color="#555555")
    ax.legend(title="outcome (area ∝ count)", fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(alpha=0.3)
    return _save(fig, path)


def plot_eviction_raster(result: Any, path: str | Path, *, group_kinds: Sequence[str] | None = None) -> Path:
    """One dot per evicted cache entry: time (or step) × block id, one panel per group."""
    t = _tables(result)
    kv, steps = t["kv_events"], t["steps"]
    n = max(infer_num_groups(t["admissions"].columns), infer_num_groups(steps.columns))
    kinds = _kinds(result, group_kinds, n)
    removed = kv[kv["kind"] == "removed"]
    fig, axes = _figure(max(n, 1), 1, height=2.2 * max(n, 1) + 0.8, sharex=True, sharey=True)
    fig.suptitle("Evictions (cache entries removed)")
    if removed.empty or n == 0:
        _empty(axes[0, 0], "no evictions")
        return _save(fig, path)
    xcol, xlabel = _time_axis(result, steps) if not steps.empty else ("step", "engine step")
    for g in range(n):
        ax = axes[g, 0]
        ev = removed[removed["group"] == g]
        ax.scatter(ev[xcol], ev["block_id"].astype(float), s=6, marker="s", color=f"C{g % 10}", linewidths=0)
        ax.set_ylabel("block id")
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_title(f"{_group_label(g, kinds)}: {len(ev)} evictions", loc="left", fontsize=10)
        ax.grid(alpha=0.3)
    if not steps.empty:
        axes[-1, 0].set_xlim(steps[xcol].min(), steps[xcol].max() + (steps["duration_s"].iloc[-1] if xcol == "time_s" else 1))
    axes[-1, 0].set_xlabel(xlabel)
    return _save(fig, path)


_LINESTYLES = ("-", "--", ":", "-.")


def _ecdf(ax: Axes, values: pd.Series, label: str | None = None, index: int = 0) -> bool:
    """Step ECDF; runs after the first get other line styles so that equal curves stay visible."""
    v = np.sort(values.dropna().to_numpy(dtype=float))
    if len(v) == 0:
        return False
    ax.step(np.concatenate([[v[0]], v]), np.concatenate([[0.0], np.arange(1, len(v) + 1) / len(v)]),
            where="post", label=label, color=f"C{index % 10}", linestyle=_LINESTYLES[index % len(_LINESTYLES)])
    return True


def plot_latency_cdfs(result: Any, path: str | Path) -> Path:
    """Empirical CDFs of TTFT, TPOT and E2E latency over finished requests."""
    per_req = request_metrics(_tables(result)["requests"])
    done = per_req[per_req["finished"]]
    fig, axes = _figure(1, 3, width=12.0, height=4.0)
    fig.suptitle(f"Latency CDFs ({len(done)} finished requests)")
    for ax, (col, name) in zip(axes[0], _LATENCIES):
        ax.set_title(name)
        if not _ecdf(ax, done[col]):
            _empty(ax, f"no {name} data")
            continue
        ax.set_xlabel(f"{name} (s)")
        ax.set_ylabel("fraction of requests")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
    return _save(fig, path)


def _bars(ax: Axes, table: pd.DataFrame, ylabel: str, xlabel: str) -> None:
    """Grouped bars: one cluster per row of ``table``, one bar per column (an outcome)."""
    outcomes = list(table.columns)
    others = [o for o in outcomes if o not in OUTCOME_COLOURS]
    width = 0.8 / max(len(outcomes), 1)
    x = np.arange(len(table.index))
    for j, o in enumerate(outcomes):
        bars = ax.bar(x + (j - (len(outcomes) - 1) / 2) * width, table[o], width, label=o,
                      color=_outcome_colour(o, others))
        ax.bar_label(bars, fontsize=7)
    ax.set_xticks(x, [str(i) for i in table.index])
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.legend(title="outcome", fontsize=8)
    ax.grid(axis="y", alpha=0.3)


def _outcome_table(adm: pd.DataFrame, by: str | pd.Series) -> pd.DataFrame:
    table = adm.groupby([by, "outcome"]).size().unstack(fill_value=0)
    return table[_ordered_outcomes(list(table.columns))]


def plot_outcomes(result: Any, path: str | Path) -> Path:
    """Admission attempts per policy, split by outcome."""
    adm = _tables(result)["admissions"]
    fig, axes = _figure(width=8.0, height=4.5)
    fig.suptitle("Admission outcomes per prefix policy")
    if adm.empty:
        _empty(axes[0, 0], "no admissions")
        return _save(fig, path)
    _bars(axes[0, 0], _outcome_table(adm, "policy"), "admission attempts", "prefix policy")
    return _save(fig, path)


# ---------------------------------------------------------------- several runs


def compare_latency_cdfs(results: Mapping[str, Any], path: str | Path) -> Path:
    """TTFT / TPOT / E2E CDFs, one line per run label."""
    fig, axes = _figure(1, 3, width=12.0, height=4.0)
    fig.suptitle("Latency CDFs by run")
    done = {}
    for label, result in results.items():
        per_req = request_metrics(_tables(result)["requests"])
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
        ax.grid(alpha=0.3)
    return _save(fig, path)


def compare_outcomes(results: Mapping[str, Any], path: str | Path) -> Path:
    """Admission outcome counts, one bar cluster per run label."""
    frames = []
    for label, result in results.items():
        adm = _tables(result)["admissions"]
        frames.append(pd.DataFrame({"run": str(label), "outcome": adm["outcome"].astype(object)}))
    adm = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame({"run": [], "outcome": []})
    fig, axes = _figure(width=max(6.0, 1.6 * len(results) + 3), height=4.5)
    fig.suptitle("Admission outcomes by run")
    if adm.empty:
        _empty(axes[0, 0], "no admissions")
        return _save(fig, path)
    table = _outcome_table(adm, "run").reindex([str(k) for k in results], fill_value=0)
    _bars(axes[0, 0], table, "admission attempts", "run")
    return _save(fig, path)


def plot_all(result: Any, out_dir: str | Path, fmt: str = "png",
             *, group_kinds: Sequence[str] | None = None) -> list[Path]:
    """Every single-run figure into ``out_dir``; returns the paths written, in a fixed order."""
    if fmt not in PLOT_FORMATS:
        raise ValueError(f"plot format {fmt!r} is not one of {PLOT_FORMATS}")
    out = Path(out_dir)
    return [
        plot_block_usage(result, out / f"block_usage.{fmt}", group_kinds=group_kinds),
        plot_divergence(result, out / f"divergence.{fmt}", group_kinds=group_kinds),
        plot_eviction_raster(result, out / f"eviction_raster.{fmt}", group_kinds=group_kinds),
        plot_latency_cdfs(result, out / f"latency_cdfs.{fmt}"),
        plot_outcomes(result, out / f"outcomes.{fmt}"),
    ]
