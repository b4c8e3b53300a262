"""Golden traces: every golden scenario still makes exactly the stored cache and admission decisions.

A failure here means a change altered what the simulator decides. If the change is intended,
run ``python -m sim.trace.golden regenerate`` (``make golden``), read the printed diff and commit it.
"""

from __future__ import annotations

import io
import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from sim.trace import golden

SCENARIOS = golden.golden_scenarios()


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_golden_trace_is_unchanged(scenario: golden.GoldenScenario) -> None:
    report = golden.check_scenario(scenario)
    assert report.identical, "\n" + report.format()


def _trace_with(scenario: golden.GoldenScenario, overrides: list[str], out: Path) -> Path:
    from sim.config.load import load_scenario
    from sim.engine.run import run_scenario
    from sim.trace.bundle import write_table
    from sim.trace.tables import normalize_table

    result = run_scenario(load_scenario(scenario.path, overrides))
    out.mkdir(parents=True, exist_ok=True)
    for table in golden.GOLDEN_TABLES:
        write_table(normalize_table(table, result.tables[table]), out / f"{table}.csv", "csv")
    return out


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_golden_trace_is_unchanged_with_lru_eviction_named_explicitly(scenario, tmp_path: Path) -> None:
    """``cache.eviction_policy: lru`` is the default and vLLM's order: byte-identical golden traces."""
    from sim.trace.diff import diff_traces

    fresh = _trace_with(scenario, ["cache.eviction_policy=lru"], tmp_path)
    report = diff_traces(scenario.golden_dir, fresh, tables=golden.GOLDEN_TABLES)
    assert report.identical, "\n" + report.format()


def test_a_what_if_eviction_policy_changes_the_golden_pressure_trace(tmp_path: Path) -> None:
    """The seam is live: group_coherent evicts other blocks than lru on the pressure scenario."""
    from sim.trace.diff import diff_traces

    scenario = next(s for s in SCENARIOS if s.name == "golden-pressure")
    fresh = _trace_with(scenario, ["cache.eviction_policy=group_coherent"], tmp_path)
    events = pd.read_csv(fresh / "kv_events.csv")
    assert (events["cause"] == "evict_policy").any() and not (events["cause"] == "evict_lru").any()
    assert not diff_traces(scenario.golden_dir, fresh, tables=golden.GOLDEN_TABLES).identical
    # Here it keeps more usable prefixes than vLLM's LRU (dead FA tails and orphaned states go first).
    lru_local = pd.read_csv(scenario.golden_dir / "admissions.csv")["local_tokens"].sum()
    assert pd.read_csv(fresh / "admissions.csv")["local_tokens"].sum() > lru_local


def test_golden_pressure_exercises_eviction_in_both_groups_and_divergence() -> None:
    d = golden.GOLDEN_ROOT / "golden-pressure"
    events = pd.read_csv(d / "kv_events.csv")
    admissions = pd.read_csv(d / "admissions.csv")
    evicted = events[(events["kind"] == "removed") & (events["cause"] == "evict_lru")]
    evicted_groups = set(evicted["group"])
    assert evicted_groups == {0, 1}
    assert len(admissions) == 200
    assert (admissions["hit_g0"] != admissions["hit_g1"]).sum() > 0


def test_golden_csvs_are_not_git_ignored() -> None:
    files = [str(p.relative_to(golden.REPO_ROOT)) for p in golden.GOLDEN_ROOT.rglob("*.csv")]
    assert len(files) == 2 * len(SCENARIOS)
    done = subprocess.run(["git", "check-ignore", *files], cwd=golden.REPO_ROOT, capture_output=True, text=True)
    assert done.stdout == "", f"git ignores golden files:\n{done.stdout}"


def test_check_reports_a_tampered_trace_and_regenerate_restores_it(tmp_path: Path, monkeypatch) -> None:
    name = "pr48425-fa-deeper-ext0"
    shutil.copytree(golden.GOLDEN_ROOT / name, tmp_path / name)
    monkeypatch.setattr(golden, "GOLDEN_ROOT", tmp_path)
    adm = tmp_path / name / "admissions.csv"
    lines = adm.read_text().splitlines(keepends=True)
    last = lines[-1].split(",")
    last[2] = "somebody-else"  # request_id of the last admission
    adm.write_text("".join(lines[:-1]) + ",".join(last))

    out = io.StringIO()
    assert golden.check([name], out=out) == 1
    assert "admissions: DIFFERENT" in out.getvalue()
    assert "request_id" in out.getvalue()

    out = io.StringIO()
    assert golden.regenerate([name], out=out) == 0
    assert f"== {name}: CHANGED" in out.getvalue()
    assert golden.check([name], out=io.StringIO()) == 0


def test_check_without_golden_dir_exits_2_and_unknown_name_is_rejected(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(golden, "GOLDEN_ROOT", tmp_path)
    out = io.StringIO()
    assert golden.check(["taint-propagation"], out=out) == 2
    assert "no golden trace" in out.getvalue()
    assert golden.main(["check", "--scenario", "nope"]) == 2
