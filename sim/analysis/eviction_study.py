"""The eviction study: table and gap figure from the eviction sweeps (docs/eviction.md).

    python -m sim.analysis.eviction_study results/sweep-eviction-conversation \\
        results/sweep-eviction-synthetic --figure docs/images/eviction-gap.png

reads each sweep's ``sweep.parquet`` (grid keys ``cache.num_blocks`` and
``cache.eviction_policy``; runs with ``outputs.ideal_hit_rate: true``) and the
``steps`` table of each run, prints one Markdown table (per trace, pool size
and policy: usable local hit rate, FA-only hit rate, the ideal, TTFT p50/p95,
missed reuse tokens, evictions per group kind, engine busy fraction, and the
usable rate and TTFT p95 relative to ``lru``) and draws one figure: per trace
and pool size, ideal vs FA-only vs usable hit rate for each policy.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Sequence

import pandas as pd

from sim.config.yamlio import load_yaml_file

POOL = "cache.num_blocks"


def _run_labels(run_dir: Path, fallback_trace: str) -> tuple[str, str]:
    """``(trace, policy)`` of one run from its resolved scenario.

    The trace is the Mooncake file's middle name (``mooncake_<name>_trace.jsonl``), else
    ``fallback_trace``; the policy label adds non-empty ``cache.eviction_options`` (``marconi(alpha=4)``).
    """
    resolved = load_yaml_file(run_dir / "scenario.resolved.yaml", "resolved scenario").data or {}
    cache = resolved.get("cache") or {}
    options = cache.get("eviction_options") or {}
    policy = str(cache.get("eviction_policy", "lru"))
    if options:
        policy += "(" + ", ".join(f"{k}={v}" for k, v in sorted(options.items())) + ")"
    trace = fallback_trace
    path = ((resolved.get("workload") or {}).get("trace") or {}).get("path")
    if path:
        stem = Path(str(path)).name
        if stem.startswith("mooncake_") and stem.endswith("_trace.jsonl"):
            trace = stem.removeprefix("mooncake_").removesuffix("_trace.jsonl")
    return trace, policy


def load_sweep(sweep_dir: Path) -> pd.DataFrame:
    """One row per run of ``sweep_dir`` with the study's columns (trace and policy label: :func:`_run_labels`)."""
    table = pd.read_parquet(sweep_dir / "sweep.parquet")
    rows = []
    for _, run in table.iterrows():
        run_dir = sweep_dir / str(run["run_id"])
        trace, policy = _run_labels(run_dir, sweep_dir.name.removeprefix("sweep-eviction-"))
        summary = json.loads((run_dir / "summary.json").read_text())
        steps = pd.read_parquet(run_dir / "steps.parquet", columns=["duration_s"])
        kinds = summary["groups"]
        evictions = {kind: 0 for kind in kinds}
        for g, kind in enumerate(kinds):
            evictions[kind] += summary["evictions"]["by_group"].get(f"g{g}", {}).get("total", 0)
        cache = summary["cache"]
        ttft = summary["latency_s"]["ttft"]
        rows.append(
            {
                "trace": trace,
                "pool": int(run[POOL]),
                "policy": policy,
                "usable": cache["local_rate"],
                "fa_only": cache["full_attention_hit_rate"],
                "ideal": cache["ideal_hit_rate"],
                "ttft_p50": ttft["p50"],
                "ttft_p95": ttft["p95"],
                "missed_reuse_tokens": cache["missed_reuse_tokens"],
                "evictions_fa": evictions.get("full_attention", 0),
                "evictions_mamba": evictions.get("mamba", 0),
                "busy": float(steps["duration_s"].sum()) / summary["simulated_s"] if summary["simulated_s"] else None,
            }
        )
    return pd.DataFrame(rows)


def with_lru_ratios(df: pd.DataFrame) -> pd.DataFrame:
    """Add ``usable_vs_lru`` and ``ttft_p95_vs_lru`` (each policy over ``lru`` at the same trace and pool)."""
    lru = df[df["policy"] == "lru"].set_index(["trace", "pool"])
    key = list(zip(df["trace"], df["pool"]))
    base_usable = [lru.loc[k, "usable"] for k in key]
    base_p95 = [lru.loc[k, "ttft_p95"] for k in key]
    out = df.copy()
    out["usable_vs_lru"] = [u / b if b else None for u, b in zip(df["usable"], base_usable)]
    out["ttft_p95_vs_lru"] = [t / b if b else None for t, b in zip(df["ttft_p95"], base_p95)]
    return out


def markdown_table(df: pd.DataFrame) -> str:
    head = (
        "| trace | pool (blocks) | policy | usable hit | FA-only hit | ideal | usable vs lru | TTFT p50 (s) "
        "| TTFT p95 (s) | p95 vs lru | missed reuse (tokens) | evictions FA / Mamba | busy |"
    )
    lines = [head, "|" + "---|" * 13]
    for r in df.itertuples():
        ratio = f"{r.usable_vs_lru:.2f}x" if r.usable_vs_lru is not None else "n/a (lru 0)"
        p95 = f"{r.ttft_p95_vs_lru:.3f}" if r.ttft_p95_vs_lru is not None else "n/a"
        lines.append(
            f"| {r.trace} | {r.pool} | {r.policy} | {r.usable:.2%} | {r.fa_only:.2%} | {r.ideal:.2%} | {ratio} "
            f"| {r.ttft_p50:.2f} | {r.ttft_p95:.2f} | {p95} | {r.missed_reuse_tokens:,} "
            f"| {r.evictions_fa:,} / {r.evictions_mamba:,} | {r.busy:.2f} |"
        )
    return "\n".join(lines)


def gap_figure(df: pd.DataFrame, path: Path, *, force: bool = False, notes: list[str] | None = None) -> None:
    """Per (trace, pool) panel: the ideal as a line, FA-only and usable hit rate as bars per policy."""
    from matplotlib.figure import Figure

    from sim.analysis.figures import save_figure

    traces = sorted(df["trace"].unique())
    pools = sorted(df["pool"].unique())
    policies = list(dict.fromkeys(df["policy"]))
    fig = Figure(figsize=(4.2 * len(pools), 3.3 * len(traces)), layout="tight")
    axes = fig.subplots(len(traces), len(pools), squeeze=False)
    for i, trace in enumerate(traces):
        for j, pool in enumerate(pools):
            ax = axes[i][j]
            part = df[(df["trace"] == trace) & (df["pool"] == pool)].set_index("policy").reindex(policies)
            x = range(len(policies))
            ax.bar([k - 0.2 for k in x], part["fa_only"] * 100, width=0.4, label="FA-only hit", color="#9ecae1")
            ax.bar([k + 0.2 for k in x], part["usable"] * 100, width=0.4, label="usable hit", color="#3182bd")
            ax.axhline(part["ideal"].iloc[0] * 100, color="#e6550d", linestyle="--", label="ideal (infinite cache)")
            ax.set_xticks(list(x), [p.replace("(", "\n(") for p in policies], fontsize=7)
            ax.set_title(f"{trace}, {pool} blocks", fontsize=9)
            if j == 0:
                ax.set_ylabel("prompt tokens hit (%)")
    axes[0][0].legend(fontsize=7, loc="upper left")
    fig.suptitle("Hybrid prefix-cache gap per eviction policy: ideal vs FA-only vs usable", fontsize=10)
    save_figure(fig, path, dpi=110, force=force, notes=notes)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sim.analysis.eviction_study", description=__doc__.split("\n")[0])
    parser.add_argument("sweeps", nargs="+", type=Path, help="sweep output folders (hybridsim sweep -o)")
    parser.add_argument("--figure", type=Path, default=None, help="write the gap figure here (PNG)")
    parser.add_argument(
        "--force", action="store_true", help="replace a --figure file hybridsim did not write (kept aside as .old)"
    )
    args = parser.parse_args(argv)
    missing = [str(d) for d in args.sweeps if not (d / "sweep.parquet").is_file()]
    if missing:
        print(f"error: no sweep.parquet in {', '.join(missing)} (run the eviction sweeps first)", file=sys.stderr)
        return 2
    df = pd.concat([load_sweep(d) for d in args.sweeps], ignore_index=True)
    df = with_lru_ratios(df.sort_values(["trace", "pool"], kind="stable", ignore_index=True))
    print(markdown_table(df))
    if args.figure is not None:
        from sim.trace.output import OutputPathError, OutputWriteError

        notes: list[str] = []
        try:
            gap_figure(df, args.figure, force=args.force, notes=notes)
        except (OutputPathError, OutputWriteError) as exc:
            print(f"error: --figure {exc.strerror if isinstance(exc, OSError) else exc}", file=sys.stderr)
            return 2
        for note in notes:
            print(f"note: {note}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
