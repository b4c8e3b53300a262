"""The sweep against the real scenario loader and engine: the bundled pressure sweep plans and runs."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from sim.sweep import build_sweep, plan_runs, run_sweep

pytestmark = pytest.mark.slow  # end-to-end: runs whole scenarios (make test-fast skips it)

SWEEPS = Path(__file__).resolve().parents[2] / "scenarios" / "sweeps"


def test_bundled_pressure_sweep_covers_every_policy_and_pool_size():
    spec = build_sweep(SWEEPS / "pressure.yaml")
    assert spec.scenario == SWEEPS / "pressure-base.yaml"
    assert spec.keys == ("cache.num_blocks", "scheduler.prefix_policy")
    assert spec.axes[1].points == (("reconciled",), ("max_per_group",), ("trim_to_min",), ("pr48425",))
    assert len(plan_runs(spec, 0)) == 9 * 4
    assert [p.name for p in spec.plots] == ["divergence-vs-pressure", "reuse-vs-pressure"]


def test_two_points_of_the_pressure_sweep_run_on_the_real_engine(tmp_path):
    result = run_sweep(
        SWEEPS / "pressure-base.yaml",
        tmp_path,
        grid=["cache.num_blocks=36", "scheduler.prefix_policy=reconciled,pr48425"],
        overrides=["outputs.plots=false"],
        executor="serial",
        progress=False,
    )
    assert [r.status for r in result.runs] == ["ok", "ok"], result.describe()
    df = pd.read_parquet(tmp_path / "sweep.parquet")
    assert list(df["scheduler.prefix_policy"]) == ["reconciled", "pr48425"]
    # Under this pressure the FA prefix outlives the Mamba state: per-group hits diverge for both policies,
    # and only pr48425's lookup reports it (hit_diverged).
    assert (df["admissions.divergences.fa_deeper"] > 0).all()
    assert list(df["admissions.hit_diverged"] > 0) == [False, True]
    for run in result.runs:
        assert (tmp_path / run.run_id / "scenario.resolved.yaml").is_file()


def test_real_engine_runs_give_identical_tables_from_the_process_pool_and_the_serial_loop(tmp_path):
    """The real loader and engine survive the trip to worker processes and decide identically there."""
    grid = ["cache.num_blocks=36,40", "scheduler.prefix_policy=max_per_group,pr48425"]
    kwargs = dict(grid=grid, overrides=["outputs.plots=false"], progress=False)
    serial = run_sweep(SWEEPS / "pressure-base.yaml", tmp_path / "serial", executor="serial", **kwargs)
    pooled = run_sweep(SWEEPS / "pressure-base.yaml", tmp_path / "pool", executor="local", jobs=2, **kwargs)
    assert [r.status for r in pooled.runs] == ["ok"] * 4, pooled.describe()
    assert (tmp_path / "serial" / "sweep.parquet").read_bytes() == (tmp_path / "pool" / "sweep.parquet").read_bytes()
    for run in serial.runs:
        a = (tmp_path / "serial" / run.run_id / "admissions.parquet").read_bytes()
        assert a == (tmp_path / "pool" / run.run_id / "admissions.parquet").read_bytes()
    df = pd.read_parquet(tmp_path / "pool" / "sweep.parquet").set_index(["cache.num_blocks", "scheduler.prefix_policy"])
    # The numbers the pressure figure shows at 40 blocks (docs/sweeps.md): pr48425 falls back, max_per_group corrupts.
    assert df.loc[(40, "pr48425"), "admissions.fallbacks"] == 6
    assert df.loc[(40, "max_per_group"), "admissions.by_outcome.corrupt"] == 2
