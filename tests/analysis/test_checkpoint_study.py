"""The checkpoint-placement study's table and frontier (sim.analysis.checkpoint_study) from a tiny real sweep."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from sim.analysis import checkpoint_study as study
from sim.cli import app

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory) -> Path:
    """golden-pressure (shared system prompts, FA + one Mamba group) at two pool sizes, vllm vs branch_points."""
    out = tmp_path_factory.mktemp("sweeps") / "sweep-checkpoints-pressure"
    res = CliRunner().invoke(
        app,
        [
            "sweep",
            str(ROOT / "scenarios" / "golden-pressure.yaml"),
            "-j",
            "1",
            "-o",
            str(out),
            "--grid",
            "cache.num_blocks=300,400",
            "--grid",
            "cache.mamba_checkpoint_policy=vllm,branch_points",
            "--set",
            "outputs.ideal_hit_rate=true",
            "--set",
            "outputs.plots=false",
            "--set",
            "cache.retention_interval=0",
        ],
    )
    assert res.exit_code == 0, res.output
    return out


def test_table_has_every_run_with_the_ideal_split_and_ratios(sweep_dir: Path) -> None:
    df = study.with_baseline_ratio(study.load_sweep(sweep_dir))
    assert sorted(zip(df["pool"], df["placement"], df["eviction"])) == [
        (300, "branch_points", "lru"),
        (300, "vllm", "lru"),
        (400, "branch_points", "lru"),
        (400, "vllm", "lru"),
    ]
    assert set(df["workload"]) == {"shared_system"}
    base = df[df["placement"] == "vllm"]
    assert (base["usable_vs_vllm_lru"] == 1.0).all()
    assert (base["ideal_placement"] == base["ideal_vllm_placement"]).all()
    assert ((df["usable"] <= df["fa_only"]) & (df["fa_only"] <= df["ideal"])).all()
    assert (df["ideal_vllm_placement"] <= df["ideal"]).all()
    # branch_points saves at each system prompt's end: its infinite-pool limit is the ideal here.
    bp = df[df["placement"] == "branch_points"]
    assert (bp["ideal_placement"] > bp["ideal_vllm_placement"]).all()
    assert (df["mamba_state_blocks"] > 0).all() and (df["mamba_state_share"] < 1).all()
    table = study.markdown_table(df)
    assert table.count("\n") == 1 + len(df) and "| shared_system | 400 | branch_points | lru |" in table


def test_main_writes_the_frontier_and_rejects_a_missing_sweep(sweep_dir: Path, tmp_path: Path, capsys) -> None:
    fig = tmp_path / "frontier.png"
    assert study.main([str(sweep_dir), "--figure", str(fig)]) == 0
    assert fig.stat().st_size > 0 and "| workload |" in capsys.readouterr().out
    assert study.main([str(tmp_path / "nothing")]) == 2
    assert "no sweep.parquet" in capsys.readouterr().err
