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
from support.interrupt import interrupt_at

from sim.api import RunOptions
from sim.cluster.run import build_cluster_run
from sim.config import MODEL_PRESETS, load_scenario, scenario_from_text
from sim.engine.loop import EngineLoop
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
        got = time_model.decode_run(requests, context, 12.5, math.inf, 600)  # (past a chunk of steps)
        want = [time_model.step_time_of_batch(requests, context + i * requests, ()) for i in range(600)]
        assert got == want
        # Cut by ``until`` in a later chunk: the steps that start before it, their starts added one by one.
        t, starts = 12.5, []
        for d in want:
            starts.append(t)
            t += d
        assert time_model.decode_run(requests, context, 12.5, starts[300], 10**6) == want[:300]
        assert (
            time_model.decode_run(requests, context, 12.5, math.nextafter(starts[300], math.inf), 10**6) == want[:301]
        )
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


# ---------------------------------------------------------------- cuts: an arrival routed to an instance in a stretch

#: Router policies, each with its reads of an instance inside a stretch: a prefix-aware view published with a
#: delay (``view_delay``: steps on this clock), queue lengths and KV usage (least_loaded), and both.
POLICIES = {
    "round_robin": "{policy: round_robin}",
    "least_loaded": "{policy: least_loaded}",
    "session_affinity": "{policy: session_affinity}",
    "prefix_aware": "{policy: prefix_aware}",
    "prefix_aware_group_aware_stale": "{policy: prefix_aware, group_aware: true, view_delay: 3, load_weight: 0.5}",
}


#: demo-pressure's rate and blocks for eight instances under pressure (preemptions).
PRESSURE8 = ["workload.generator.arrivals.rate=8", "cache.num_blocks=40"]


def _steps8(policy: str):
    """Eight instances on the step clock: every arrival is at a whole step and every step starts at one, so every
    cut falls exactly on a step start (the step starting at the arrival is dropped, the one before is kept)."""
    text = (
        STEPS.replace("rate: 0.15", "rate: 0.5")
        .replace("count: 40", "count: 110")
        .replace("cluster: {instances: 3, router: {policy: prefix_aware, group_aware: true}}", "")
    )
    return scenario_from_text(text + f"cluster: {{instances: 8, router: {POLICIES[policy]}}}\n")


def _cuts(run) -> int:
    return sum(i.loop.num_cuts for i in run.instances if isinstance(i.loop, StretchLoop))


def _count_cuts(scenario, max_steps: int | None = None) -> int:
    run = build_cluster_run(scenario, RunOptions(write_plots=False, max_steps=max_steps))
    run.execute()
    return _cuts(run)


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_eight_instances_cut_stretches_identically_on_the_step_clock(policy: str) -> None:
    """Every router on eight instances: arrivals routed elsewhere do not end a stretch, an arrival routed to an
    instance inside one cuts it, and every table is byte-identical to the plain core's."""
    scenario = _steps8(policy)
    taken, result = _assert_identical(scenario)
    assert taken > 0.3 * len(result.tables["steps"])
    assert _count_cuts(scenario) >= 15, "hardly any cut: the case does not exercise StretchLoop.release"


@pytest.mark.parametrize(
    "policy",
    [
        pytest.param("round_robin", marks=pytest.mark.slow),
        pytest.param("least_loaded", marks=pytest.mark.slow),
        "prefix_aware_group_aware_stale",
    ],
)
def test_eight_instances_cut_stretches_identically_on_the_time_clock(policy: str) -> None:
    """As above on the time clock, under block pressure (preemptions on every instance)."""
    delay = ["cluster.router.view_delay=0.05", "cluster.router.group_aware=true"] if "stale" in policy else []
    scenario = _demo(8, f"cluster.router.policy={policy.split('_group')[0]}", *PRESSURE8, *delay)
    taken, result = _assert_identical(scenario)
    assert taken > 0.3 * len(result.tables["steps"])
    assert result.tables["requests"]["preemptions"].sum() > 0
    assert _count_cuts(scenario) >= 15


@pytest.mark.parametrize("clock, max_steps", [("steps", 57), ("steps", 90), ("time", 241), ("time", 500)])
def test_eight_instances_stop_after_cuts(clock: str, max_steps: int) -> None:
    """``max_steps`` on one of eight instances stops the cluster after stretches were cut: settled or rerun as
    the plain loop leaves it."""
    scenario = (
        _steps8("least_loaded") if clock == "steps" else _demo(8, "cluster.router.policy=round_robin", *PRESSURE8)
    )
    _, result = _assert_identical(scenario, max_steps=max_steps)
    assert result.summary["status"] == "stopped"
    assert _count_cuts(scenario, max_steps) > 0


def _interrupted(scenario, *, fast: bool, at: float):
    """A cluster run interrupted (a ``KeyboardInterrupt`` from a SimPy event) at time ``at``: its tables, and
    whether an instance was inside a cut stretch then."""
    run = build_cluster_run(scenario, RunOptions(write_plots=False, fast_paths=fast))
    interrupt_at(run.env, at)
    inside: list[bool] = []
    for instance in run.instances:
        loop = instance.loop
        if isinstance(loop, StretchLoop):
            original = loop.settle

            def spy(original=original, loop=loop) -> bool:
                inside.append(loop._stretch is not None and loop.num_cuts > 0)
                return original()

            loop.settle = spy  # type: ignore[method-assign]
    result = finalize_cluster(run.execute())
    tables = {name: df.to_csv(index=False) for name, df in result.tables.items()}
    tables["summary"] = json.dumps(result.summary, sort_keys=True, default=str)
    return tables, any(inside)


def _cut_times(scenario) -> list[float]:
    """The arrival times at which some instance's stretch was cut."""
    run = build_cluster_run(scenario, RunOptions(write_plots=False))
    times: list[float] = []
    for instance in run.instances:
        loop = instance.loop
        assert isinstance(loop, StretchLoop)
        original = loop.release

        def spy(request, original=original, loop=loop) -> None:
            before = loop.num_cuts
            original(request)
            if loop.num_cuts > before:
                times.append(float(request.arrival_time))

        loop.release = spy  # type: ignore[method-assign]
    run.execute()
    return sorted(times)


def test_an_interrupt_inside_a_cut_stretch_is_settled() -> None:
    """Interrupted just after an arrival cut an instance's stretch (inside the step in flight then), the
    cluster is left as the plain loop leaves it."""
    scenario = _demo(8, "cluster.router.policy=round_robin", *PRESSURE8)
    times = _cut_times(scenario)
    assert len(times) > 10
    for at in (times[3] + 1e-7, times[len(times) // 2] + 1e-7):
        plain, _ = _interrupted(scenario, fast=False, at=at)
        fast, inside = _interrupted(scenario, fast=True, at=at)
        assert inside, "no instance was inside a cut stretch at the interrupt"
        assert json.loads(plain["summary"])["status"] == "interrupted"
        assert plain == fast


def test_a_cut_that_cannot_be_timed_exactly_runs_again_without_stretches(monkeypatch) -> None:
    """When SimPy cannot land exactly on a cut stretch's new end (forced here), the run stops and is redone
    without stretches: the tables are the plain core's. (Time clock: the other instances' stretches settle at the
    stop, so only the cut asks for the rerun.)"""
    scenario = _demo(8, "cluster.router.policy=round_robin", *PRESSURE8)
    monkeypatch.setattr(StretchLoop, "_cut_delay", lambda self, plan: None)
    run = build_cluster_run(scenario, RunOptions(write_plots=False))
    rebuild = run.rebuild
    assert rebuild is not None
    calls: list[int] = []

    def again():
        calls.append(1)
        return rebuild()

    run.rebuild = again
    result = finalize_cluster(run.execute())
    assert calls == [1]
    _, plain, _ = _fingerprint(scenario, fast=False, stretches=False)
    got = {name: hashlib.sha256(df.to_csv(index=False).encode()).hexdigest() for name, df in result.tables.items()}
    assert got == {name: plain[name] for name in result.tables}
    assert result.summary["status"] == "complete"


def test_closed_sessions_take_the_plain_loop() -> None:
    """Closed-loop sessions release a turn when a finish frees it, at a time other instances' steps share (what
    those steps see then depends on SimPy's order of equal-time events): their instances take the plain loop."""
    text = STEPS.replace("workload:\n", "workload:\n  sessions: {mode: closed}\n")
    loops = [i.loop for i in build_cluster_run(scenario_from_text(STEPS), RunOptions()).instances]
    assert {type(loop) for loop in loops} == {StretchLoop}
    loops = [i.loop for i in build_cluster_run(scenario_from_text(text), RunOptions()).instances]
    assert {type(loop) for loop in loops} == {EngineLoop}
