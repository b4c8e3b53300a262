from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd
import pytest
from sweep_fakes import LOG_ENV, expected_summary, fake_load, fake_run

from sim.sweep import SweepError, build_sweep, run_sweep
from sim.sweep.grid import plan_runs

POLICIES = ["pr48425", "max_per_group"]
BLOCKS = [400, 800]


def _spec(base: Path, policies=POLICIES, seeds="2"):
    return build_sweep(
        base,
        [f"cache.num_blocks={','.join(map(str, BLOCKS))}", f"scheduler.prefix_policy={','.join(policies)}"],
        seeds=seeds,
    )


def _sweep(spec, out, executor="serial", **kw):
    return run_sweep(spec, out, executor=executor, load_fn=fake_load, run_fn=fake_run, progress=False, **kw)


def _log(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


@pytest.fixture
def call_log(tmp_path, monkeypatch) -> Path:
    log = tmp_path / "calls.log"
    monkeypatch.setenv(LOG_ENV, str(log))
    return log


def test_serial_sweep_writes_bundles_manifest_and_one_row_per_run(tmp_path, base_scenario, call_log):
    out = tmp_path / "out"
    result = _sweep(_spec(base_scenario), out)
    ids = [
        f"cache.num_blocks={b}__scheduler.prefix_policy={p}__seed={s}" for b in BLOCKS for p in POLICIES for s in (7, 8)
    ]
    assert [r.run_id for r in result.runs] == ids
    assert result.executed == ids and result.reused == [] and result.failed == []
    assert _log(call_log) == ids
    for run_id in ids:
        assert (out / run_id / "summary.json").is_file()
        assert (out / run_id / "scenario.resolved.yaml").is_file()

    manifest = json.loads((out / "sweep.json").read_text())
    assert manifest["scenario"] == base_scenario.as_posix()
    assert manifest["seeds"] == [7, 8]
    assert manifest["axes"] == [
        {"keys": ["cache.num_blocks"], "points": [[400], [800]]},
        {"keys": ["scheduler.prefix_policy"], "points": [["pr48425"], ["max_per_group"]]},
    ]
    assert manifest["runs"][3] == {
        "run_id": ids[3],
        "values": {"cache.num_blocks": 400, "scheduler.prefix_policy": "max_per_group"},
        "seed": 8,
        "overrides": ["cache.num_blocks=400", "scheduler.prefix_policy=max_per_group", "seed=8"],
        "status": "ok",
        "error": None,
    }

    df = pd.read_parquet(out / "sweep.parquet")
    assert list(df.columns) == [
        "run_id",
        "cache.num_blocks",
        "scheduler.prefix_policy",
        "seed",
        "status",
        "error",
        "crash",
        "divergences",
        "fallbacks",
        "hit_rate_g0",
        "outcomes.crash",
        "outcomes.ok",
        "partial",
        "preemptions",
        "requests.total",
    ]
    assert list(df["run_id"]) == ids
    assert str(df["cache.num_blocks"].dtype) == "int64"
    assert str(df["divergences"].dtype) == "int64"
    for _, row in df.iterrows():
        want = expected_summary(row["cache.num_blocks"], row["scheduler.prefix_policy"], row["seed"])
        assert row["status"] == "ok" and pd.isna(row["error"]) and pd.isna(row["crash"])
        assert row["divergences"] == want["divergences"]
        assert row["fallbacks"] == want["fallbacks"]
        assert row["hit_rate_g0"] == want["hit_rate_g0"]
        assert row["outcomes.crash"] == want["outcomes"]["crash"]
        assert row["outcomes.ok"] == want["outcomes"]["ok"]
    assert result.table().equals(df)


@pytest.mark.slow
def test_local_pool_and_serial_loop_give_identical_bytes(tmp_path, base_scenario):
    spec = _spec(base_scenario)
    serial, pooled = tmp_path / "serial", tmp_path / "pooled"
    _sweep(spec, serial)
    result = _sweep(spec, pooled, executor="local", jobs=2)
    assert result.failed == []
    assert (serial / "sweep.parquet").read_bytes() == (pooled / "sweep.parquet").read_bytes()
    assert (serial / "sweep.json").read_bytes() == (pooled / "sweep.json").read_bytes()


def test_resume_reruns_only_incomplete_runs_and_keeps_the_table(tmp_path, base_scenario, call_log):
    spec = _spec(base_scenario)
    out = tmp_path / "out"
    first = _sweep(spec, out)
    table_bytes = (out / "sweep.parquet").read_bytes()
    victim, partial = first.runs[5].run_id, first.runs[1].run_id
    (out / victim / "summary.json").unlink()
    (out / partial / "summary.json").write_text(json.dumps({"partial": True, "requests": {"total": 1}}))
    (out / partial / "stale.png").write_text("left over")
    call_log.unlink()

    with pytest.raises(SweepError, match="stale.png, which hybridsim did not write"):
        _sweep(spec, out)  # a file the sweep did not write is never deleted
    assert (out / partial / "stale.png").exists() and not call_log.exists()
    (out / partial / "stale.png").unlink()

    second = _sweep(spec, out)
    assert second.executed == [partial, victim]
    assert _log(call_log) == [partial, victim]
    assert len(second.reused) == 6
    assert (out / "sweep.parquet").read_bytes() == table_bytes

    call_log.unlink()
    third = _sweep(spec, out)
    assert third.executed == [] and _log(call_log) == []
    assert (out / "sweep.parquet").read_bytes() == table_bytes


def test_resume_reruns_a_bundle_that_does_not_match_its_manifest(tmp_path, base_scenario, call_log):
    spec = _spec(base_scenario)
    out = tmp_path / "out"
    first = _sweep(spec, out)
    emptied, tampered, unverified = first.runs[0].run_id, first.runs[2].run_id, first.runs[4].run_id
    (out / emptied / "summary.json").write_text("{}")
    (out / tampered / "summary.json").write_text(json.dumps({**first.runs[2].summary, "divergences": -1}))
    call_log.unlink()
    second = _sweep(spec, out)
    assert second.executed == [emptied, tampered] and _log(call_log) == second.executed
    assert [r.summary for r in second.runs] == [r.summary for r in first.runs]
    # Without its manifest a folder cannot be told from a user's: refused, not rerun over.
    (out / unverified / "manifest.json").unlink()
    with pytest.raises(SweepError, match="which hybridsim did not write"):
        _sweep(spec, out)
    assert (out / unverified / "summary.json").is_file()


def test_a_user_folder_named_like_a_run_is_never_deleted(tmp_path, base_scenario, call_log):
    spec = _spec(base_scenario)
    out = tmp_path / "out"
    run_id = plan_runs(spec, 7)[0].run_id
    (out / run_id).mkdir(parents=True)
    (out / run_id / "thesis.tex").write_text("mine\n")
    with pytest.raises(SweepError, match="thesis.tex, which hybridsim did not write"):
        _sweep(spec, out)
    assert (out / run_id / "thesis.tex").read_text() == "mine\n"


@pytest.mark.slow
def test_failing_runs_are_recorded_and_retried_on_resume(tmp_path, base_scenario, call_log):
    spec = build_sweep(base_scenario, ["cache.num_blocks=1,400", "scheduler.prefix_policy=pr48425,explode"], seeds="1")
    out = tmp_path / "out"
    result = _sweep(spec, out, executor="local", jobs=2)
    status = {r.run_id: (r.status, r.error) for r in result.runs}
    assert status == {
        "cache.num_blocks=1__scheduler.prefix_policy=pr48425__seed=7": (
            "failed",
            "FakeScenarioError: cache.num_blocks: must be >= 2, got 1",
        ),
        "cache.num_blocks=1__scheduler.prefix_policy=explode__seed=7": (
            "failed",
            "FakeScenarioError: cache.num_blocks: must be >= 2, got 1",
        ),
        "cache.num_blocks=400__scheduler.prefix_policy=pr48425__seed=7": ("ok", None),
        "cache.num_blocks=400__scheduler.prefix_policy=explode__seed=7": (
            "failed",
            "RuntimeError: boom: policy explode",
        ),
    }
    exploded = out / "cache.num_blocks=400__scheduler.prefix_policy=explode__seed=7"
    assert "RuntimeError: boom" in (exploded / "error.txt").read_text()
    df = pd.read_parquet(out / "sweep.parquet")
    assert list(df["status"]) == ["failed", "failed", "ok", "failed"]
    assert df["error"].iloc[3] == "RuntimeError: boom: policy explode"
    assert pd.isna(df["divergences"].iloc[3]) and df["divergences"].iloc[2] == 1600 // 400 + 7 % 3
    manifest = json.loads((out / "sweep.json").read_text())
    assert [r["status"] for r in manifest["runs"]] == ["failed", "failed", "ok", "failed"]

    call_log.unlink()
    again = _sweep(spec, out)
    assert again.reused == ["cache.num_blocks=400__scheduler.prefix_policy=pr48425__seed=7"]
    assert sorted(_log(call_log)) == sorted([exploded.name])  # the load failures never reach run_fn


def test_output_dir_of_another_definition_is_refused_before_anything_is_deleted(tmp_path, base_scenario):
    out = tmp_path / "out"
    first = _sweep(_spec(base_scenario), out)
    base_scenario.write_text(base_scenario.read_text().replace("clock: steps", "clock: time"))
    with pytest.raises(SweepError, match="holds a run of a different sweep .the base scenario .* changed since"):
        _sweep(_spec(base_scenario), out)
    assert all((out / r.run_id / "summary.json").is_file() for r in first.runs)


def test_bad_base_scenario_and_bad_executor_are_clear_errors(tmp_path, base_scenario):
    base_scenario.write_text(base_scenario.read_text().replace("num_blocks: 100", "num_blocks: 1"))
    with pytest.raises(SweepError, match="cannot load base scenario .*cache.num_blocks: must be >= 2"):
        _sweep(build_sweep(base_scenario), tmp_path / "out")
    with pytest.raises(SweepError, match=r"unknown executor 'dask' \(valid: local, serial, ray\)"):
        _sweep(build_sweep(base_scenario), tmp_path / "out", executor="dask")
    with pytest.raises(SweepError, match="must be >= 1"):
        _sweep(build_sweep(base_scenario), tmp_path / "out", executor="local", jobs=0)


def test_ray_executor_without_ray_says_how_to_install(tmp_path, base_scenario, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(SweepError, match=r"pip install 'hybridsim\[ray\]'"):
        _sweep(_spec(base_scenario), tmp_path / "out", executor="ray")


def test_sweep_file_plots_are_drawn_and_plot_problems_reported(tmp_path, base_scenario):
    sweep_file = tmp_path / "sweep.yaml"
    sweep_file.write_text(
        "scenario: base.yaml\n"
        "cache.num_blocks: [400, 800]\n"
        "scheduler.prefix_policy: [pr48425, max_per_group]\n"
        "seeds: 2\n"
        "plots:\n"
        "  - {name: pressure, x: cache.num_blocks, hue: scheduler.prefix_policy, metrics: [divergences, fallbacks]}\n"
        "  - {name: nope, x: cache.num_blocks, hue: scheduler.prefix_policy, metrics: [no_such_metric]}\n"
    )
    result = _sweep(build_sweep(sweep_file), tmp_path / "out")
    assert result.plots == [tmp_path / "out" / "plots" / "pressure.png"]
    assert result.plots[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(result.plot_errors) == 1
    assert result.plot_errors[0].startswith("plot 'nope': metric 'no_such_metric' is not a column (metrics: crash, ")


def test_path_form_describe_and_changed_overrides_are_refused(tmp_path, base_scenario):
    out = tmp_path / "out"
    result = run_sweep(
        base_scenario,
        out,
        grid=["scheduler.prefix_policy=pr48425,explode"],
        overrides=["cache.num_blocks=400"],
        executor="serial",
        load_fn=fake_load,
        run_fn=fake_run,
        progress=False,
    )
    assert result.describe().splitlines() == [
        "2 runs: 2 ran, 0 reused, 1 failed",
        f"table: {out / 'sweep.parquet'}",
        "  failed scheduler.prefix_policy=explode__seed=7: RuntimeError: boom: policy explode",
    ]
    df = pd.read_parquet(out / "sweep.parquet")
    assert list(df.columns[:5]) == ["run_id", "scheduler.prefix_policy", "seed", "status", "error"]
    assert json.loads((out / "sweep.json").read_text())["set"] == {"cache.num_blocks": 400}
    with pytest.raises(
        SweepError, match=r"its overrides were \['cache.num_blocks=400', .*now \['cache.num_blocks=800'"
    ):
        run_sweep(
            base_scenario,
            out,
            grid=["scheduler.prefix_policy=pr48425,explode"],
            overrides=["cache.num_blocks=800"],
            executor="serial",
            load_fn=fake_load,
            run_fn=fake_run,
            progress=False,
        )
    with pytest.raises(SweepError, match="go with a scenario path"):
        run_sweep(build_sweep(base_scenario), out, grid=["a.b=1"], load_fn=fake_load, run_fn=fake_run)
