"""The checkpoint-placement study: table and frontier figure from the placement sweeps (docs/checkpoints.md).

    python -m sim.analysis.checkpoint_study results/sweep-checkpoints-* --figure docs/images/checkpoint-frontier.png

reads each sweep's ``sweep.parquet`` and, per run, ``scenario.resolved.yaml``, ``summary.json`` (runs with
``outputs.ideal_hit_rate: true``) and the ``steps`` table; prints one Markdown table (per workload, pool,
placement and eviction: usable and FA-only hit rates, the ideal and its split, the infinite-pool limit of the
run's placement, the blocks holding Mamba states, TTFT p50/p95, recomputed prompt tokens, and the usable rate
relative to ``vllm`` + ``lru`` at the same workload and pool) and draws the frontier: usable hit rate against
the pool share spent on Mamba states, one line per placement across pool sizes, the ideal and vLLM's
placement limit marked.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd
import yaml

BASELINE = ("vllm", "lru")


def _label(name: str, options: dict[str, Any] | None) -> str:
    """``name`` with its non-empty options: ``marconi(alpha=4, window=4096)``."""
    if not options:
        return name
    return name + "(" + ", ".join(f"{k}={v}" for k, v in sorted(options.items())) + ")"


def workload_label(resolved: dict[str, Any]) -> str:
    """``conversation x2``: the Mooncake trace's middle name or the generator's structure, and the time scale."""
    workload = resolved.get("workload") or {}
    name = "workload"
    path = (workload.get("trace") or {}).get("path")
    if path:
        stem = Path(str(path)).name
        name = stem.removeprefix("mooncake_").removesuffix("_trace.jsonl") if stem.startswith("mooncake_") else stem
    elif workload.get("generator"):
        name = str(((workload["generator"] or {}).get("structure") or {}).get("kind", "generator"))
    scale = workload.get("time_scale")
    return f"{name} x{scale:g}" if scale not in (None, 1, 1.0) else name


def mamba_state_blocks(steps: pd.DataFrame, group_kinds: Sequence[str]) -> float:
    """Blocks holding a cached Mamba state, averaged over simulated time (each step weighted by its duration)."""
    columns = [f"cached_g{g}" for g, kind in enumerate(group_kinds) if kind == "mamba"]
    if not columns or steps.empty:
        return 0.0
    held = steps[columns].sum(axis=1).to_numpy(dtype=float)
    weights = steps["duration_s"].to_numpy(dtype=float)
    total = float(weights.sum())
    return float((held * weights).sum() / total) if total > 0 else float(held.mean())


def load_run(run_dir: Path) -> dict[str, Any]:
    """One row of the study for a run bundle."""
    resolved = yaml.safe_load((run_dir / "scenario.resolved.yaml").read_text())
    summary = json.loads((run_dir / "summary.json").read_text())
    cache_cfg = resolved.get("cache") or {}
    kinds = summary["groups"]
    columns = ["duration_s"] + [f"cached_g{g}" for g, kind in enumerate(kinds) if kind == "mamba"]
    steps = pd.read_parquet(run_dir / "steps.parquet", columns=columns)
    cache = summary["cache"]
    ttft = summary["latency_s"]["ttft"]
    pool = int(summary["num_blocks"])
    state_blocks = mamba_state_blocks(steps, kinds)
    return {
        "workload": workload_label(resolved),
        "pool": pool,
        "placement": _label(
            str(cache_cfg.get("mamba_checkpoint_policy", "vllm")), cache_cfg.get("mamba_checkpoint_options")
        ),
        "eviction": _label(str(cache_cfg.get("eviction_policy", "lru")), cache_cfg.get("eviction_options")),
        "usable": cache["local_rate"],
        "fa_only": cache["full_attention_hit_rate"],
        "ideal": cache["ideal_hit_rate"],
        "ideal_vllm_placement": cache.get("ideal_vllm_placement_hit_rate"),
        "ideal_placement": cache.get("ideal_placement_hit_rate"),
        "mamba_state_blocks": state_blocks,
        "mamba_state_share": state_blocks / pool if pool else 0.0,
        "ttft_p50": ttft["p50"],
        "ttft_p95": ttft["p95"],
        "recomputed_tokens": cache["missed_reuse_tokens"],
    }


def load_sweep(sweep_dir: Path) -> pd.DataFrame:
    """One row per run of ``sweep_dir`` (:func:`load_run`)."""
    table = pd.read_parquet(sweep_dir / "sweep.parquet")
    return pd.DataFrame([load_run(sweep_dir / str(run_id)) for run_id in table["run_id"]])


def with_baseline_ratio(df: pd.DataFrame) -> pd.DataFrame:
    """Add ``usable_vs_vllm_lru``: each run's usable rate over ``vllm`` + ``lru`` at the same workload and pool
    (``None`` where that run is missing or reached 0)."""
    base = df[(df["placement"] == BASELINE[0]) & (df["eviction"] == BASELINE[1])].set_index(["workload", "pool"])
    ratios = []
    for workload, pool, usable in zip(df["workload"], df["pool"], df["usable"]):
        key = (workload, pool)
        ref = base.loc[key, "usable"] if key in base.index else None
        ratios.append(usable / ref if ref else None)
    out = df.copy()
    out["usable_vs_vllm_lru"] = ratios
    return out


def _pct(value: Any) -> str:
    return "n/a" if value is None or (isinstance(value, float) and np.isnan(value)) else f"{value:.2%}"


def markdown_table(df: pd.DataFrame) -> str:
    head = (
        "| workload | pool (blocks) | placement | eviction | usable hit | FA-only hit | ideal | ideal, vLLM placement "
        "| ideal, this placement | usable vs vllm+lru | Mamba-state blocks (mean, % of pool) | TTFT p50 (s) "
        "| TTFT p95 (s) | recomputed prompt tokens |"
    )
    lines = [head, "|" + "---|" * 14]
    for r in df.itertuples():
        ratio = f"{r.usable_vs_vllm_lru:.2f}x" if r.usable_vs_vllm_lru is not None else "n/a"
        lines.append(
            f"| {r.workload} | {r.pool} | {r.placement} | {r.eviction} | {_pct(r.usable)} | {_pct(r.fa_only)} "
            f"| {_pct(r.ideal)} | {_pct(r.ideal_vllm_placement)} | {_pct(r.ideal_placement)} | {ratio} "
            f"| {r.mamba_state_blocks:,.0f} ({r.mamba_state_share:.1%}) | {r.ttft_p50:.2f} | {r.ttft_p95:.2f} "
            f"| {r.recomputed_tokens:,} |"
        )
    return "\n".join(lines)


def frontier_figure(df: pd.DataFrame, path: Path, eviction: str = "lru") -> None:
    """Per workload: usable hit rate against the pool share spent on Mamba states, one line per placement
    over the pool sizes (runs with ``eviction``), the ideal and vLLM's infinite-pool limit as lines."""
    from matplotlib.figure import Figure

    from sim.analysis.figures import save_figure

    part = df[df["eviction"] == eviction]
    workloads = sorted(part["workload"].unique())
    placements = sorted(part["placement"].unique())
    colors = {p: f"C{i}" for i, p in enumerate(placements)}
    cols = min(3, len(workloads))
    rows = -(-len(workloads) // cols)
    fig = Figure(figsize=(4.6 * cols, 3.6 * rows), layout="tight")
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    for ax, workload in zip(axes, workloads):
        runs = part[part["workload"] == workload]
        for placement, line in runs.groupby("placement", sort=True):
            line = line.sort_values("pool")
            xs, ys = line["mamba_state_share"] * 100, line["usable"] * 100
            ax.plot(xs, ys, marker="o", color=colors[placement], label=placement)
            for x, y, pool in zip(xs, ys, line["pool"]):
                ax.annotate(str(pool), (x, y), fontsize=6, xytext=(3, 3), textcoords="offset points")
        ax.axhline(runs["ideal"].iloc[0] * 100, color="#e6550d", linestyle="--", label="ideal (infinite cache)")
        vllm_limit = runs["ideal_vllm_placement"].iloc[0]
        if vllm_limit is not None:
            ax.axhline(vllm_limit * 100, color="#756bb1", linestyle=":", label="vLLM placement, infinite pool")
        ax.set_xlim(0, 100)
        ax.set_xlabel("pool holding Mamba states (%, time mean)", fontsize=8)
        ax.set_ylabel("usable prefix hit (%)", fontsize=8)
        ax.set_title(workload, fontsize=9)
        ax.legend(fontsize=6, loc="best")
    for ax in axes[len(workloads) :]:
        ax.set_visible(False)
    fig.suptitle(f"Checkpoint placement frontier (eviction {eviction}; point labels: pool blocks)", fontsize=10)
    save_figure(fig, path, dpi=110)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sim.analysis.checkpoint_study", description=__doc__.split("\n")[0])
    parser.add_argument("sweeps", nargs="+", type=Path, help="sweep output folders (hybridsim sweep -o)")
    parser.add_argument("--figure", type=Path, default=None, help="write the frontier figure here (PNG)")
    args = parser.parse_args(argv)
    missing = [str(d) for d in args.sweeps if not (d / "sweep.parquet").is_file()]
    if missing:
        print(f"error: no sweep.parquet in {', '.join(missing)} (run the checkpoint sweeps first)", file=sys.stderr)
        return 2
    df = pd.concat([load_sweep(d) for d in args.sweeps], ignore_index=True)
    df = df.sort_values(["workload", "pool", "placement", "eviction"], kind="stable", ignore_index=True)
    df = with_baseline_ratio(df)
    print(markdown_table(df))
    if args.figure is not None:
        frontier_figure(df, args.figure)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
