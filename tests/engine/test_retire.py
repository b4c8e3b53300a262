"""Finished requests are retired (``Request.retire``: prompt segments, block hashes and hasher let go) where
nothing reads them after their step; the bundle is the same as with every request held whole."""

from __future__ import annotations

from pathlib import Path

import pytest

from sim.api import RunOptions
from sim.config import load_scenario
from sim.engine.run import build_run
from sim.results.finalize import finalize
from sim.results.write import write_bundle

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"


def _run(path: Path, out: Path, retire: bool):
    run = build_run(load_scenario(path), RunOptions(write_plots=False, retire_finished=retire))
    record = run.execute()
    write_bundle(finalize(record), out)
    return run


@pytest.mark.parametrize("scenario", ["golden-pressure.yaml", "demo-pressure.yaml"])
def test_retired_requests_leave_the_bundle_as_it_was(tmp_path: Path, scenario: str) -> None:
    retired = _run(SCENARIOS / scenario, tmp_path / "retired", True)
    held = _run(SCENARIOS / scenario, tmp_path / "held", False)
    assert retired.loop.retire_finished and not held.loop.retire_finished
    finished = [r for r in retired.components.requests if r.is_finished()]
    assert finished and all(r.prompt == () and r.block_hashes == [] for r in finished)
    assert all(r.num_prompt_tokens > 0 for r in finished)  # the counts stay
    assert any(r.prompt for r in held.components.requests)
    for name in sorted(p.name for p in (tmp_path / "held").iterdir()):
        assert (tmp_path / "retired" / name).read_bytes() == (tmp_path / "held" / name).read_bytes(), name


def test_requests_are_not_retired_where_they_are_read_after_the_run() -> None:
    """The ideal hit rate reads every request's prompt after the run: its requests stay whole."""
    scenario = load_scenario(SCENARIOS / "golden-pressure.yaml").model_copy(deep=True)
    scenario.outputs.ideal_hit_rate = True
    run = build_run(scenario, RunOptions(write_plots=False))
    assert not run.loop.retire_finished
