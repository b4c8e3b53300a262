"""The admission study: tables and figure from the admission sweeps (docs/admission.md).

    python -m sim.analysis.admission_study results/sweep-admission-conversation-half ... \\
        --figure docs/images/admission.png

reads each sweep's ``sweep.parquet`` and, per run, ``summary.json`` and the
``requests`` table; prints one Markdown table per sweep (per model, window,
threshold and load cap: TTFT p50/p95, usable and FA-only hit rates, divergences,
recomputed tokens, preemptions, and the fairness cost: how many requests waited
longer than in the same model's run with the window off, and their added wait,
mean and max) and draws one figure: TTFT p95 and usable hit rate against the
window, per workload and model.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Sequence

import pandas as pd

from sim.config.yamlio import load_yaml_file

WINDOW = "scheduler.cache_aware_admission_window"
THRESHOLD = "scheduler.cache_aware_admission_threshold"
CAP = "scheduler.max_num_inflight_kv_loads"


def _queueing(run_dir: Path) -> pd.Series:
    """Each scheduled request's wait before its first step (``first_scheduled_s - arrival_s``), by request id."""
    table = pd.read_parquet(run_dir / "requests.parquet", columns=["request_id", "arrival_s", "first_scheduled_s"])
    table = table.dropna(subset=["first_scheduled_s"])
    return pd.Series(
        (table["first_scheduled_s"] - table["arrival_s"]).to_numpy(), index=table["request_id"].astype(str)
    )


def load_sweep(sweep_dir: Path) -> pd.DataFrame:
    """One row per run of ``sweep_dir`` with the study's columns."""
    table = pd.read_parquet(sweep_dir / "sweep.parquet")
    rows = []
    for _, run in table.iterrows():
        run_dir = sweep_dir / str(run["run_id"])
        resolved = load_yaml_file(run_dir / "scenario.resolved.yaml", "resolved scenario").data or {}
        scheduler = resolved.get("scheduler") or {}
        summary = json.loads((run_dir / "summary.json").read_text())
        cache, ttft, adm = summary["cache"], summary["latency_s"]["ttft"], summary["admissions"]
        rows.append(
            {
                "workload": sweep_dir.name.removeprefix("sweep-admission-"),
                "model": str((resolved.get("model") or {}).get("preset")),
                "window": int(scheduler.get("cache_aware_admission_window") or 0),
                "threshold": float(scheduler.get("cache_aware_admission_threshold") or 0.0),
                "cap": scheduler.get("max_num_inflight_kv_loads"),
                "run_dir": run_dir,
                "finished": summary["requests"]["finished"],
                "ttft_p50": ttft["p50"],
                "ttft_p95": ttft["p95"],
                "usable": cache["local_rate"],
                "external": cache["external_rate"],
                "fa_only": cache["full_attention_hit_rate"],
                "divergences": adm["divergences"]["mamba_deeper"] + adm["divergences"]["fa_deeper"],
                "recomputed": adm["tokens_recomputed"],
                "preemptions": summary["requests"]["preemptions"],
            }
        )
    return pd.DataFrame(rows)


def with_fairness(df: pd.DataFrame) -> pd.DataFrame:
    """Add ``moved_back`` (requests that waited longer than with the window off, same workload and model),
    ``added_wait_mean`` and ``added_wait_max`` (seconds)."""
    out = df.copy()
    moved, mean, most = [], [], []
    for r in df.itertuples():
        base = df[(df["workload"] == r.workload) & (df["model"] == r.model) & (df["window"] == 0) & df["cap"].isna()]
        if r.window == 0 or base.empty:
            moved.append(0)
            mean.append(0.0)
            most.append(0.0)
            continue
        before, after = _queueing(base.iloc[0]["run_dir"]), _queueing(r.run_dir)
        both = before.index.intersection(after.index)
        added = (after[both] - before[both])[lambda s: s > 1e-9]
        moved.append(len(added))
        mean.append(float(added.mean()) if len(added) else 0.0)
        most.append(float(added.max()) if len(added) else 0.0)
    out["moved_back"], out["added_wait_mean"], out["added_wait_max"] = moved, mean, most
    return out


def markdown_table(df: pd.DataFrame) -> str:
    head = (
        "| model | window | threshold | cap | TTFT p50 (s) | TTFT p95 (s) | usable hit | FA-only hit | external "
        "| divergences | recomputed tokens | preemptions | moved back | added wait mean / max (s) |"
    )
    lines = [head, "|" + "---|" * 14]
    for r in df.itertuples():
        cap = "-" if pd.isna(r.cap) else str(int(r.cap))
        lines.append(
            f"| {r.model} | {r.window} | {r.threshold:g} | {cap} | {r.ttft_p50:.2f} | {r.ttft_p95:.2f} "
            f"| {r.usable:.2%} | {r.fa_only:.2%} | {r.external:.2%} | {r.divergences} | {r.recomputed:,} "
            f"| {r.preemptions} | {r.moved_back} | {r.added_wait_mean:.2f} / {r.added_wait_max:.2f} |"
        )
    return "\n".join(lines)


def figure(df: pd.DataFrame, path: Path) -> None:
    """Per workload: TTFT p95 (top) and usable hit rate (bottom) against the window, a line per model x threshold."""
    from matplotlib.figure import Figure

    from sim.analysis.figures import save_figure

    part = df[df["cap"].isna()]
    workloads = list(dict.fromkeys(part["workload"]))
    # One colour per model x threshold in every panel (each panel draws only the series its workload has).
    series = sorted(set(zip(part["model"], part["threshold"])))
    colour = {key: f"C{i % 10}" for i, key in enumerate(series)}
    fig = Figure(figsize=(3.6 * len(workloads), 5.6), layout="tight")
    axes = fig.subplots(2, len(workloads), squeeze=False)
    for j, workload in enumerate(workloads):
        rows = part[part["workload"] == workload]
        for (model, threshold), line in rows.groupby(["model", "threshold"], sort=True):
            line = line.sort_values("window")
            label = f"{model}, threshold {threshold:g}"
            xs = [str(w) for w in line["window"]]
            style = {"marker": "o", "label": label, "color": colour[(model, threshold)]}
            axes[0][j].plot(xs, line["ttft_p95"], **style)
            axes[1][j].plot(xs, line["usable"] * 100, **style)
        axes[0][j].set_title(workload, fontsize=9)
        axes[0][j].legend(fontsize=6)
        axes[1][j].set_xlabel("cache_aware_admission_window")
    axes[0][0].set_ylabel("TTFT p95 (s)")
    axes[1][0].set_ylabel("usable prefix hit (% of prompt tokens)")
    fig.suptitle("Cache-aware admission (vLLM 0.34) under block pressure", fontsize=10)
    save_figure(fig, path, dpi=110)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sim.analysis.admission_study", description=__doc__.split("\n")[0])
    parser.add_argument("sweeps", nargs="+", type=Path, help="sweep output folders (hybridsim sweep -o)")
    parser.add_argument("--figure", type=Path, default=None, help="write the figure here (PNG)")
    args = parser.parse_args(argv)
    missing = [str(d) for d in args.sweeps if not (d / "sweep.parquet").is_file()]
    if missing:
        print(f"error: no sweep.parquet in {', '.join(missing)} (run the admission sweeps first)", file=sys.stderr)
        return 2
    df = with_fairness(pd.concat([load_sweep(d) for d in args.sweeps], ignore_index=True))
    for workload, part in df.groupby("workload", sort=False):
        print(f"\n### {workload}\n")
        print(markdown_table(part.sort_values(["model", "cap", "threshold", "window"], kind="stable")))
    if args.figure is not None:
        figure(df, args.figure)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
