"""Quiet stretches (sim/engine/stretch.py) change nothing: a cluster's tables are byte-identical with them,
without them and on the plain core (fast paths off), on both clocks, under block pressure, and when the run
stops inside a stretch (``max_steps`` on one instance while the others are in one).

Each case also checks that stretches were taken (the mechanism under test ran) and that arrivals fell inside
what would otherwise have been a stretch (the bound was what kept it exact)."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import pytest

from sim.api import RunOptions
from sim.cluster.run import build_cluster_run
from sim.config import MODEL_PRESETS, load_scenario, scenario_from_text
from sim.engine.stretch import StretchLoop, unit_steps
from sim.engine.timing import StepTimeModel
from sim.results.cluster import finalize_cluster

ROOT = Path(__file__).resolve().parents[2]

#: Step clock: arrivals at whole steps, so a step can start exactly at an arrival.
STEPS = """
name: stretch-steps
seed: 11
clock: steps
cache: {block_size: 16, num_blocks: 400, groups: [full_attention, mamba]}
scheduler: {max_num_seqs: 8, max_num_batched_tokens: 256, max_model_len: 4096, prefix_policy: pr48425}
outputs: {plots: false, schedule_table: true}
workload:
  generator:
    arrivals: {process: poisson, rate: 0.15}
    count: 40
    structure:
      kind: shared_system
      system: {num_prompts: 3, length: {dist: uniform, low: 40, high: 120}, zipf: 1.0}
      user_len: {dist: lognormal, mean: 30, sigma: 0.5}
    output: {dist: uniform, low: 5, high: 90}
cluster: {instances: 3, router: {policy: prefix_aware, group_aware: true}}
"""


def _demo(instances: int, *extra: str):
    """demo-pressure (time clock) on ``instances`` instances, at twice its rate on a quarter of its blocks
    each (preemptions on every instance)."""
    overrides = [
        "outputs.plots=false",
        "outputs.schedule_table=true",
        f"cluster.instances={instances}",
        "cache.num_blocks=60",
        "workload.generator.arrivals.rate=3",
        *extra,
    ]
    return load_scenario(ROOT / "scenarios" / "demo-pressure.yaml", overrides)


def _fingerprint(scenario, *, fast: bool, stretches: bool, max_steps: int | None = None):
    options = RunOptions(write_plots=False, fast_paths=fast, max_steps=max_steps)
    run = build_cluster_run(scenario, options, stretches=stretches)
    record = run.execute()
    loops = [i.loop for i in run.instances]
    taken = sum(loop.num_stretch_steps for loop in loops if isinstance(loop, StretchLoop))
    result = finalize_cluster(record)
    tables = {name: hashlib.sha256(df.to_csv(index=False).encode()).hexdigest() for name, df in result.tables.items()}
    tables["summary"] = json.dumps(result.summary, sort_keys=True, default=str)
    return taken, tables, result


def _assert_identical(scenario, max_steps: int | None = None):
    plain_taken, plain, _ = _fingerprint(scenario, fast=False, stretches=False, max_steps=max_steps)
    off_taken, off, _ = _fingerprint(scenario, fast=True, stretches=False, max_steps=max_steps)
    taken, fast, result = _fingerprint(scenario, fast=True, stretches=True, max_steps=max_steps)
    assert plain_taken == off_taken == 0
    assert plain.keys() == fast.keys() == off.keys()
    for name in plain:
        assert fast[name] == plain[name], f"{scenario.name}: table {name} differs with quiet stretches"
        assert off[name] == plain[name], f"{scenario.name}: table {name} differs on the fast path"
    return taken, result


def _arrivals_inside_decodes(result) -> int:
    """Arrivals that came while the instance they went to had requests decoding (a stretch had to stop)."""
    requests = result.tables["requests"]
    routed = requests[requests["instance"] >= 0]
    count = 0
    for row in routed.itertuples():
        same = routed[(routed["instance"] == row.instance) & (routed["request_id"] != row.request_id)]
        count += int(((same["first_token_s"] < row.arrival_s) & (same["finished_s"] > row.arrival_s)).any())
    return count


def test_steps_clock_cluster_is_identical_with_stretches() -> None:
    taken, result = _assert_identical(scenario_from_text(STEPS))
    steps = len(result.tables["steps"])
    assert 0.3 * steps < taken < steps, (taken, steps)
    assert _arrivals_inside_decodes(result) >= 10


def test_time_clock_cluster_under_pressure_is_identical_with_stretches() -> None:
    taken, result = _assert_identical(_demo(3))
    assert result.tables["requests"]["preemptions"].sum() > 0
    assert taken > 0.3 * len(result.tables["steps"])
    assert _arrivals_inside_decodes(result) >= 10


@pytest.mark.slow
def test_eight_instances_identical_with_stretches() -> None:
    taken, _ = _assert_identical(_demo(8, "cluster.router.policy=least_loaded"))
    assert taken > 0


@pytest.mark.parametrize("clock, max_steps", [("time", 150), ("time", 333), ("steps", 100), ("steps", 201)])
def test_a_stop_inside_a_stretch_is_settled(clock: str, max_steps: int) -> None:
    """``max_steps`` stops the cluster when one instance reaches it; the others are inside stretches then
    (time clock: settled; step clock: every stop is on a step boundary, so the run is redone without)."""
    scenario = _demo(3) if clock == "time" else scenario_from_text(STEPS)
    _, result = _assert_identical(scenario, max_steps=max_steps)
    assert result.summary["status"] == "stopped"


def test_settle_applies_the_steps_ended_and_the_one_in_flight() -> None:
    """A stop inside a stretch on the time clock is settled in place (no rerun): the stretch's loop is
    not rebuilt, and some instance was in a stretch when the run stopped."""
    scenario = _demo(3)
    run = build_cluster_run(scenario, RunOptions(write_plots=False, max_steps=150))
    settled: list[bool] = []
    for instance in run.instances:
        loop = instance.loop
        assert isinstance(loop, StretchLoop)
        original = loop.settle

        def spy(original=original, loop=loop) -> bool:
            settled.append(loop._stretch is not None)
            return original()

        loop.settle = spy  # type: ignore[method-assign]
    run.rebuild = None  # a rerun would hide an unsettled stop
    run.execute()
    assert any(settled)


@pytest.mark.parametrize("model", sorted(MODEL_PRESETS))
@pytest.mark.parametrize("hardware", ["h100-80g", "a100-80g"])
def test_decode_run_is_the_step_time_of_each_decode_step(model: str, hardware: str) -> None:
    """A stretch's durations are the step-time model's answer for each of its steps, bit for bit (every
    model preset: hybrids, sliding windows, MoE, several attention kinds; batches past a decode wave)."""
    time_model = StepTimeModel.from_presets(model, hardware)
    for requests, context in [(1, 0), (3, 7_000), (17, 250_000), (200, 1_900_000), (600, 3_000_000)]:
        got = time_model.decode_run(requests, context, 12.5, math.inf, 40)
        want = [time_model.step_time_of_batch(requests, context + i * requests, ()) for i in range(40)]
        assert got == want
    # The steps kept are those that start before `until`.
    durations = time_model.decode_run(4, 100, 1.0, 1.0 + 2.5 * time_model.step_time_of_batch(4, 100, ()), 10**6)
    assert len(durations) == 3
    assert unit_steps(2, 0, 3.0, 6.0, 10) == [1.0, 1.0, 1.0]
    assert unit_steps(2, 0, 3.0, 6.5, 2) == [1.0, 1.0]


def test_a_stop_a_stretch_cannot_settle_runs_again_without_stretches() -> None:
    """When a stretch cannot tell what the plain loop had done at the stop (the stop exactly on one of its step
    boundaries), the cluster runs again without stretches: forced here by a settle that says so."""
    scenario = scenario_from_text(STEPS)
    run = build_cluster_run(scenario, RunOptions(write_plots=False, max_steps=150))
    rebuild = run.rebuild
    assert rebuild is not None
    calls: list[int] = []

    def again():
        calls.append(1)
        return rebuild()

    run.rebuild = again
    loop = run.instances[0].loop
    assert isinstance(loop, StretchLoop)
    loop.settle = lambda: False  # type: ignore[method-assign]
    result = finalize_cluster(run.execute())
    assert calls == [1]
    _, plain, _ = _fingerprint(scenario, fast=False, stretches=False, max_steps=150)
    assert {
        name: hashlib.sha256(df.to_csv(index=False).encode()).hexdigest() for name, df in result.tables.items()
    } == {name: plain[name] for name in result.tables}
    assert build_cluster_run(scenario, RunOptions(fast_paths=False)).rebuild is None
