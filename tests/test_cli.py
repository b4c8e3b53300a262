"""Every ``hybridsim`` command through typer's CliRunner: outputs written and exit codes as documented."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from support.cli import CRASHING, invoke

from sim.trace.bundle import load_result
from sim.trace.diff import diff_traces
from sim.trace.tables import TABLE_NAMES

pytestmark = pytest.mark.slow  # end-to-end: runs whole scenarios (make test-fast skips it)

ROOT = Path(__file__).resolve().parent.parent
REPRO = ROOT / "scenarios" / "repro"
FA_DEEPER = REPRO / "pr48425-fa-deeper-ext0.yaml"
TAINT = REPRO / "taint-propagation.yaml"


@pytest.fixture(scope="module")
def bundles(tmp_path_factory) -> dict[str, Path]:
    """Two runs of the same repro scenario under two prefix policies (parquet; PNG plots for pr48425 only)."""
    root = tmp_path_factory.mktemp("bundles")
    out = {}
    for policy in ("pr48425", "reconciled"):
        target = root / policy
        plots = [] if policy == "pr48425" else ["--no-plots"]
        res = invoke("run", FA_DEEPER, "-o", target, "--set", f"scheduler.prefix_policy={policy}", "-q", *plots)
        assert res.exit_code == 0, res.output
        out[policy] = target
    return out


def test_run_writes_a_complete_bundle(bundles) -> None:
    d = bundles["pr48425"]
    for name in TABLE_NAMES:
        assert (d / f"{name}.parquet").is_file()
    summary = json.loads((d / "summary.json").read_text())
    assert summary["status"] == "complete" and summary["partial"] is False
    assert summary["policy"] == "pr48425"
    adm = load_result(d).admissions.set_index("request_id")
    # The scenario's point: FA hit 64, Mamba hit 16; pr48425 flags the divergence and falls back to 16.
    assert (adm.loc["r", "hit_g0"], adm.loc["r", "hit_g1"]) == (64, 16)
    assert adm.loc["r", "num_computed_tokens"] == 16
    assert list((d / "plots").glob("*.png"))


def test_run_format_csv_and_check_invariants(tmp_path: Path) -> None:
    res = invoke("run", TAINT, "-o", tmp_path, "--format", "csv", "--no-plots", "--check-invariants", "-q")
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in tmp_path.glob("*.csv")) == sorted(f"{n}.csv" for n in TABLE_NAMES)
    assert not list(tmp_path.glob("*.parquet")) and not (tmp_path / "plots").exists()
    outcomes = dict(zip(*pd.read_csv(tmp_path / "requests.csv")[["request_id", "outcome"]].T.values))
    assert (outcomes["r"], outcomes["r2"], outcomes["r3"]) == ("corrupt", "corrupt", "ok")


def test_run_prints_the_summary_table(tmp_path: Path) -> None:
    res = invoke("run", FA_DEEPER, "-o", tmp_path, "--no-plots")
    assert res.exit_code == 0
    assert "admission outcomes" in res.stdout and "ok=5" in res.stdout


def test_crash_stops_with_exit_3_and_replay_reproduces_it(tmp_path: Path) -> None:
    scenario = tmp_path / "crash.yaml"
    scenario.write_text(CRASHING)
    out = tmp_path / "out"
    res = invoke("run", scenario, "-o", out, "--no-plots", "-q")
    assert res.exit_code == 3, res.output
    crash = json.loads((out / "crash.json").read_text())
    assert (crash["request_id"], crash["step"]) == ("r1", 3)
    assert crash["reason"].startswith("AssertionError")
    assert crash["external_tokens"] == 80
    assert (out / "replay" / "replay.yaml").is_file() and (out / "replay" / "crash.json").is_file()
    assert json.loads((out / "summary.json").read_text())["status"] == "crashed"

    replayed = invoke("replay", out / "replay", "-o", tmp_path / "replayed")
    assert replayed.exit_code == 0, replayed.output
    assert "reproduced" in replayed.stdout and "NOT" not in replayed.stdout


def test_replay_without_replay_yaml_is_bad_input(tmp_path: Path) -> None:
    res = invoke("replay", tmp_path)
    assert res.exit_code == 2
    assert "no replay.yaml" in res.stderr


def test_validate_and_scenarios_listing() -> None:
    res = invoke("validate", FA_DEEPER, TAINT)
    assert res.exit_code == 0
    assert res.stdout.splitlines() == [f"{FA_DEEPER}: ok (pr48425-fa-deeper-ext0)", f"{TAINT}: ok (taint-propagation)"]
    listing = invoke("scenarios")
    assert listing.exit_code == 0
    names = {line.split()[0] for line in listing.stdout.splitlines()}
    assert {"demo-pressure.yaml", "golden-pressure.yaml", "repro/taint-propagation.yaml"} <= names
    line = next(row for row in listing.stdout.splitlines() if row.startswith("demo-pressure.yaml"))
    assert "Nemotron-H 8B" in line


def test_show_plot_and_compare(bundles, tmp_path: Path) -> None:
    shown = invoke("show", bundles["pr48425"])
    assert shown.exit_code == 0 and "admission outcomes" in shown.stdout

    for p in (bundles["pr48425"] / "plots").glob("*.png"):
        p.unlink()
    plotted = invoke("plot", bundles["pr48425"])
    assert plotted.exit_code == 0
    paths = [Path(line) for line in plotted.stdout.splitlines()]
    assert paths[-1].name == "index.md"
    assert paths[:-1] and all(p.suffix == ".png" and p.stat().st_size > 0 for p in paths[:-1])
    pngs = sorted(p.name for p in paths[:-1])
    svg = invoke("plot", bundles["pr48425"], "--svg")
    assert svg.exit_code == 0, svg.output
    # --svg adds SVGs beside the PNGs, which stay (and stay in the manifest: the bundle still checks out).
    assert sorted(p.name for p in (bundles["pr48425"] / "plots").glob("*.png")) == pngs
    assert sorted(p.name for p in (bundles["pr48425"] / "plots").glob("*.svg")) == [n[:-4] + ".svg" for n in pngs]
    assert load_result(bundles["pr48425"]).summary

    compared = invoke("compare", bundles["pr48425"], bundles["reconciled"], "-o", tmp_path)
    assert compared.exit_code == 0, compared.output
    assert "pr48425" in compared.stdout and "reconciled" in compared.stdout
    for name in ("latency_cdfs.png", "outcomes.png"):
        assert (tmp_path / name).stat().st_size > 0
    assert invoke("compare", bundles["pr48425"]).exit_code == 2
    md = invoke("compare", bundles["pr48425"], bundles["reconciled"], "--format", "markdown")
    assert md.exit_code == 0 and md.stdout.startswith("| metric | pr48425 | reconciled | Δ |")
    assert "| prefix policy | pr48425 | reconciled | * |" in md.stdout
    assert invoke("compare", bundles["pr48425"], bundles["reconciled"], "--format", "xml").exit_code == 2


def test_trace_diff_exit_codes(bundles, tmp_path: Path) -> None:
    same = invoke("trace", "diff", bundles["pr48425"], bundles["pr48425"])
    assert same.exit_code == 0 and "traces are identical" in same.stdout
    differ = invoke("trace", "diff", bundles["pr48425"], bundles["reconciled"])
    assert differ.exit_code == 1 and "traces differ" in differ.stdout
    assert "admissions: DIFFERENT" in differ.stdout
    missing = invoke("trace", "diff", bundles["pr48425"], tmp_path / "nope")
    assert missing.exit_code == 2 and "does not exist" in missing.stderr


def test_workload_stats() -> None:
    res = invoke("workload", "stats", TAINT)
    assert res.exit_code == 0
    stats = json.loads(res.stdout)
    # Seeds hit 16+32+48 tokens of `doc`, r 64, r2 and r3 80: 320 of 452 prompt tokens.
    assert (stats["requests"], stats["prompt_tokens"], stats["ideal_hit_tokens"]) == (7, 452, 320)


def test_resolved_scenario_round_trip(bundles, tmp_path: Path) -> None:
    first = bundles["reconciled"]
    res = invoke("run", first / "scenario.resolved.yaml", "-o", tmp_path, "--no-plots", "-q")
    assert res.exit_code == 0, res.output
    report = diff_traces(first, tmp_path, tables=TABLE_NAMES)
    assert report.identical, report.format()
    assert (tmp_path / "scenario.resolved.yaml").read_text() == (first / "scenario.resolved.yaml").read_text()


def test_resolved_scenario_of_a_trace_replay_references_the_trace_and_reruns_identically(tmp_path: Path) -> None:
    """A trace workload is not inlined into ``scenario.resolved.yaml`` (it names the trace file), and running that
    file again gives the same tables (Mooncake format, Nemotron-H 8B on H100, time clock, as the shipped replay)."""
    import random

    rnd = random.Random(3)
    rows, shared = [], [rnd.randrange(10**6) for _ in range(6)]
    for i in range(40):
        blocks = rnd.randint(1, 8)
        ids = shared[: rnd.randint(0, 6)] + [10**6 + i * 10 + j for j in range(blocks)]
        rows.append(
            {
                "timestamp": i * 400,
                "input_length": len(ids) * 512 - rnd.randint(0, 300),
                "output_length": rnd.randint(1, 60),
                "hash_ids": ids,
            }
        )
    (tmp_path / "mc.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    scenario = tmp_path / "replay.yaml"
    scenario.write_text(
        "name: trace-round-trip\nseed: 1\nclock: time\nmodel: {preset: nemotron-h-8b}\n"
        "hardware: {preset: h100-80g, gpu_memory_utilization: 0.92}\n"
        "scheduler: {prefix_policy: pr48425, max_model_len: 131072}\n"
        "workload:\n  trace: {format: mooncake, path: mc.jsonl, allow_merged_blocks: true}\n"
    )
    first, second = tmp_path / "first", tmp_path / "second"
    res = invoke("run", scenario, "-o", first, "--no-plots", "-q")
    assert res.exit_code == 0, res.output
    resolved = (first / "scenario.resolved.yaml").read_text()
    assert str(tmp_path / "mc.jsonl") in resolved and "hash_ids" not in resolved and "requests: null" in resolved
    res = invoke("run", first / "scenario.resolved.yaml", "-o", second, "--no-plots", "-q")
    assert res.exit_code == 0, res.output
    report = diff_traces(first, second, tables=TABLE_NAMES)
    assert report.identical, report.format()
    assert len(load_result(first).requests) == 40
    assert (second / "scenario.resolved.yaml").read_text() == resolved


def test_interrupted_run_writes_a_partial_bundle(tmp_path: Path, monkeypatch) -> None:
    from sim.trace.recorder import Recorder

    original = Recorder.record_step
    calls = {"n": 0}

    def interrupt_at_step_5(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 5:
            raise KeyboardInterrupt
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Recorder, "record_step", interrupt_at_step_5)
    res = invoke("run", TAINT, "-o", tmp_path, "--no-plots", "-q")
    assert res.exit_code == 130
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["partial"] is True and summary["status"] == "interrupted"
    assert len(load_result(tmp_path).steps) == 4


def test_sweep_runs_one_bundle_per_grid_point(tmp_path: Path) -> None:
    scenario = REPRO / "pr48425-mamba-deeper-ext16.yaml"
    res = invoke(
        "sweep",
        scenario,
        "--grid",
        "scheduler.prefix_policy=reconciled,trim_to_min",
        "-j",
        "1",
        "-o",
        tmp_path,
        "--set",
        "outputs.plots=false",
    )
    assert res.exit_code == 0, res.output
    assert "2 runs: 2 ran" in res.stdout
    assert (tmp_path / "sweep.parquet").is_file()
    resume = {}
    for policy in ("reconciled", "trim_to_min"):
        adm = load_result(tmp_path / f"scheduler.prefix_policy={policy}__seed=0").admissions.set_index("request_id")
        resume[policy] = (adm.loc["r", "num_computed_tokens"], adm.loc["r", "outcome"])
    assert resume == {"reconciled": (32, "recompute"), "trim_to_min": (48, "ok")}


def test_validate_checks_a_sweep_file_as_a_sweep(tmp_path: Path) -> None:
    """`validate scenarios/**/*.yaml` works: a sweep file is checked at every grid point, not as a scenario."""
    ok = invoke("validate", ROOT / "scenarios/sweeps/pressure.yaml")
    assert ok.exit_code == 0, ok.output
    assert "sweep of pressure-base.yaml: 36 grid points" in ok.stdout
    bad = tmp_path / "bad-sweep.yaml"
    bad.write_text(f"scenario: {ROOT / 'scenarios/sweeps/pressure-base.yaml'}\ncache.num_blocks: [32, 0]\n")
    refused = invoke("validate", bad)
    assert refused.exit_code == 2
    assert "num_blocks" in refused.output and "unknown key 'scenario'" not in refused.output
