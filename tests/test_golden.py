"""Golden traces: every golden scenario still makes exactly the stored cache and admission decisions.

A failure here means a change altered what the simulator decides. If the change is intended,
run ``hybridsim golden regenerate`` (``make golden``), read the printed diff and commit it.
"""

from __future__ import annotations

import io
import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from sim.cli import app
from sim.sweep import golden
from sim.trace.golden import GOLDEN_TABLES, compare, golden_scenarios

pytestmark = pytest.mark.slow  # end-to-end: runs whole scenarios (make test-fast skips it)

REPO_ROOT = Path(__file__).resolve().parents[1]
SCENARIO_ROOT = REPO_ROOT / "scenarios"
GOLDEN_ROOT = REPO_ROOT / "results" / "golden"
SCENARIOS = golden_scenarios(scenario_root=SCENARIO_ROOT, golden_root=GOLDEN_ROOT)
ROOTS = {"scenario_root": SCENARIO_ROOT}


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_golden_trace_is_unchanged(scenario, tmp_path: Path) -> None:
    fresh = golden.fresh_traces([scenario], tmp_path)[scenario.name]
    report = compare(scenario.golden_dir, fresh)
    assert report.identical, "\n" + report.format()


def _trace_with(scenario: golden.GoldenScenario, overrides: list[str], out: Path) -> Path:
    from sim.api import run_scenario
    from sim.config.load import load_scenario
    from sim.trace.golden import write_golden_tables

    result = run_scenario(load_scenario(scenario.path, overrides))
    return write_golden_tables(result.tables, out)


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_golden_trace_is_unchanged_with_lru_eviction_named_explicitly(scenario, tmp_path: Path) -> None:
    """``cache.eviction_policy: lru`` is the default and vLLM's order: byte-identical golden traces."""
    from sim.trace.diff import diff_traces

    fresh = _trace_with(scenario, ["cache.eviction_policy=lru"], tmp_path)
    report = diff_traces(scenario.golden_dir, fresh, tables=GOLDEN_TABLES)
    assert report.identical, "\n" + report.format()


def test_a_what_if_eviction_policy_changes_the_golden_pressure_trace(tmp_path: Path) -> None:
    """The seam is live: group_coherent evicts other blocks than lru on the pressure scenario."""
    from sim.trace.diff import diff_traces

    scenario = next(s for s in SCENARIOS if s.name == "golden-pressure")
    fresh = _trace_with(scenario, ["cache.eviction_policy=group_coherent"], tmp_path)
    events = pd.read_csv(fresh / "kv_events.csv")
    assert (events["cause"] == "evict_policy").any() and not (events["cause"] == "evict_lru").any()
    assert not diff_traces(scenario.golden_dir, fresh, tables=GOLDEN_TABLES).identical
    # Here it keeps more usable prefixes than vLLM's LRU (dead FA tails and orphaned states go first).
    lru_local = pd.read_csv(scenario.golden_dir / "admissions.csv")["local_tokens"].sum()
    assert pd.read_csv(fresh / "admissions.csv")["local_tokens"].sum() > lru_local


def test_golden_pressure_exercises_eviction_in_both_groups_and_divergence() -> None:
    d = GOLDEN_ROOT / "golden-pressure"
    events = pd.read_csv(d / "kv_events.csv")
    admissions = pd.read_csv(d / "admissions.csv")
    evicted = events[(events["kind"] == "removed") & (events["cause"] == "evict_lru")]
    evicted_groups = set(evicted["group"])
    assert evicted_groups == {0, 1}
    assert len(admissions) == 200
    assert (admissions["hit_g0"] != admissions["hit_g1"]).sum() > 0


def test_golden_csvs_are_not_git_ignored() -> None:
    files = [str(p.relative_to(REPO_ROOT)) for p in GOLDEN_ROOT.rglob("*.csv")]
    assert len(files) == 2 * len(SCENARIOS)
    done = subprocess.run(["git", "check-ignore", *files], cwd=REPO_ROOT, capture_output=True, text=True)
    assert done.stdout == "", f"git ignores golden files:\n{done.stdout}"


def test_check_reports_a_tampered_trace_and_regenerate_restores_it(tmp_path: Path) -> None:
    name = "pr48425-fa-deeper-ext0"
    shutil.copytree(GOLDEN_ROOT / name, tmp_path / name)
    adm = tmp_path / name / "admissions.csv"
    lines = adm.read_text().splitlines(keepends=True)
    last = lines[-1].split(",")
    last[2] = "somebody-else"  # request_id of the last admission
    adm.write_text("".join(lines[:-1]) + ",".join(last))

    out = io.StringIO()
    assert golden.check([name], golden_root=tmp_path, out=out, **ROOTS) == 1
    assert "admissions: DIFFERENT" in out.getvalue()
    assert "request_id" in out.getvalue()

    out = io.StringIO()
    notes = golden.regenerate([name], golden_root=tmp_path, out=out, **ROOTS)
    assert f"== {name}: CHANGED" in out.getvalue()
    # The hand-edited CSV no longer has the hash the manifest recorded: kept aside, never deleted.
    assert len(notes) == 1 and "admissions.csv" in notes[0]
    assert (tmp_path / f"{name}.old" / "admissions.csv").read_text().endswith(",".join(last))
    assert golden.check([name], golden_root=tmp_path, out=io.StringIO(), **ROOTS) == 0
    assert (tmp_path / name / "admissions.csv").read_bytes() == (GOLDEN_ROOT / name / "admissions.csv").read_bytes()


def test_check_without_golden_dir_exits_2_and_unknown_name_is_rejected(tmp_path: Path) -> None:
    out = io.StringIO()
    assert golden.check(["taint-propagation"], golden_root=tmp_path, out=out, **ROOTS) == 2
    assert "no golden trace" in out.getvalue()
    done = CliRunner().invoke(app, ["golden", "check", "--scenario", "nope", "--golden-dir", str(tmp_path)])
    assert done.exit_code == 2
    assert "unknown golden scenario" in done.output


def test_cli_golden_check_passes_on_the_stored_traces(monkeypatch) -> None:
    """The defaults are relative to the current directory (the repository root in a checkout)."""
    monkeypatch.chdir(REPO_ROOT)
    done = CliRunner().invoke(app, ["golden", "check", "--scenario", "taint-propagation"])
    assert done.exit_code == 0, done.output
    assert "== taint-propagation: identical" in done.output
