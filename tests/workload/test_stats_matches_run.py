"""``hybridsim workload stats SCENARIO`` describes the requests a run of the scenario gets (one seeding path)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.cli import invoke

from sim.api import RunOptions, run_scenario

ROOT = Path(__file__).resolve().parents[2]

# A generator workload that draws from every workload child of the seed: arrivals, structure and lengths
# (generator), `sample` (its own child) and session think times (a third child); some prompts are longer
# than max_model_len and are rejected, as the run rejects them.
DRAWING = """\
name: stats-vs-run
seed: 11
clock: steps
cache: {block_size: 16, num_blocks: 400, groups: [full_attention, mamba]}
scheduler: {max_model_len: 700, max_num_batched_tokens: 4096}
workload:
  generator:
    arrivals: {process: poisson, rate: 0.5}
    count: 12
    structure:
      kind: multi_turn
      system: {num_prompts: 2, length: {dist: uniform, low: 50, high: 300}}
      turns: {dist: uniform, low: 1, high: 4}
      first_len: {dist: lognormal, mean: 200, sigma: 0.8}
      user_len: {dist: lognormal, mean: 60, sigma: 0.5}
      think_time: {dist: exponential, mean: 3.0}
    output: {dist: uniform, low: 1, high: 8}
  sample: 0.8
  sessions: {mode: open, think_time: {dist: exponential, mean: 2.0}, orphans: root}
outputs: {plots: false}
"""


def _stats(scenario: Path) -> dict:
    res = invoke("workload", "stats", scenario)
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def _assert_same_workload(stats: dict, scenario: Path) -> None:
    requests = run_scenario(scenario, None, options=RunOptions(write_plots=False)).tables["requests"]
    assert stats["requests"] == len(requests)
    assert stats["prompt_tokens"] == int(requests["prompt_tokens"].sum())
    assert stats.get("rejected_too_long", 0) == int((requests["outcome"] == "rejected").sum())


def test_stats_of_a_drawing_generator_scenario_match_its_run(tmp_path: Path) -> None:
    scenario = tmp_path / "drawing.yaml"
    scenario.write_text(DRAWING)
    stats = _stats(scenario)
    assert stats["rejected_too_long"] > 0  # the rejected requests are counted, as the run lists them
    _assert_same_workload(stats, scenario)


@pytest.mark.slow
def test_stats_of_the_demo_match_its_run() -> None:
    scenario = ROOT / "scenarios" / "demo-pressure.yaml"
    stats = _stats(scenario)
    assert stats["requests"] == 289
    _assert_same_workload(stats, scenario)
