"""The SimPy engine: clock semantics, time accounting, steps-vs-time equivalence."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import sim
from sim.engine.run import build_run
from sim.trace.tables import tables_from_recorder

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "scenarios" / "demo-pressure.yaml"

SCRIPT = """
name: loop-script
clock: steps
cache: {block_size: 16, num_blocks: 40, groups: [full_attention, mamba]}
scheduler: {max_num_seqs: 2, max_num_batched_tokens: 64, prefix_policy: reconciled}
workload:
  requests:
    - {id: a, at: 0, prompt: [{content: doc, tokens: 100}], max_tokens: 3}
    - {id: b, at: 1, prompt: [{content: doc, tokens: 120}], max_tokens: 2}
    - {id: c, at: 9, prompt: [{content: other, tokens: 40}], max_tokens: 2}
outputs: {schedule_table: true}
actions:
  - {at: 4, evict: {prefix_of: a, group: full_attention, blocks: [1]}}
"""


def _run_loop(clock: str, step_seconds: float = 1.0):
    # clock: time needs a model preset for its step-time model; ``step_duration`` replaces that model.
    timed = "clock: time\nmodel: {preset: nemotron-h-8b}\nhardware: {preset: h100-80g}"
    text = SCRIPT if clock == "steps" else SCRIPT.replace("clock: steps", timed)
    scenario = sim.config.scenario_from_text(text, "loop-script.yaml")
    run = build_run(scenario, step_duration=lambda output, sched: step_seconds)
    record = run.execute()
    return run.loop, tables_from_recorder(record.recorder)


def test_steps_clock_numbers_steps_by_time_and_jumps_idle_gaps():
    loop, tables = _run_loop("steps")
    steps = tables["steps"]
    # Every step row sits at time == step (one time unit per step).
    assert (steps["time_s"] == steps["step"]).all()
    # Request c arrives at 9, after a and b are done: the engine idles, then its first row is step 9.
    sched = tables["schedule"]
    assert sched.loc[sched["request_id"] == "c", "step"].min() == 9
    # The step-4 action's events are stamped step 4.
    removed = tables["kv_events"][tables["kv_events"]["kind"] == "removed"]
    assert list(removed["step"]) == [4] and list(removed["cause"]) == ["evict_action"]


def test_steps_and_time_clocks_make_the_same_decisions():
    """With one second per step and arrivals on whole seconds, both clocks decide identically."""
    _, by_steps = _run_loop("steps")
    _, by_time = _run_loop("time", step_seconds=1.0)
    for name, cols in (
        ("schedule", ["request_id", "kind", "num_scheduled_tokens", "num_computed_tokens", "preempted"]),
        ("kv_events", ["kind", "group", "block_id", "block_hash", "request_id", "cause"]),
        ("admissions", ["request_id", "hit_g0", "hit_g1", "local_tokens", "outcome", "num_computed_tokens"]),
    ):
        pd.testing.assert_frame_equal(
            by_steps[name][cols].reset_index(drop=True), by_time[name][cols].reset_index(drop=True)
        )
    # Same simulated times for every step that ran.
    assert list(by_steps["steps"]["time_s"]) == list(by_time["steps"]["time_s"])


@pytest.mark.slow
def test_time_clock_ttft_is_queueing_plus_the_steps_until_the_first_token():
    scenario = sim.load_scenario(
        DEMO, ["workload.generator.count=6", "outputs.plots=false", "outputs.schedule_table=true"]
    )
    result = sim.run_scenario(scenario)
    req, steps, sched = result.requests, result.steps, result.schedule
    assert len(req) > 6  # multi-turn: several turns per conversation
    step_start = dict(zip(steps["step"], steps["time_s"]))
    step_dur = dict(zip(steps["step"], steps["duration_s"]))
    assert (steps["duration_s"] > 0).all()
    for row in req.itertuples():
        ran = sched[sched["request_id"] == row.request_id]
        first_step = int(ran["step"].min())
        assert row.first_scheduled_s == step_start[first_step]
        # The first token exists at the end of the step that completed the prompt.
        done = ran[ran["num_computed_tokens"] + ran["num_scheduled_tokens"] >= row.prompt_tokens]
        token_step = int(done["step"].min())
        assert np.isclose(row.first_token_s, step_start[token_step] + step_dur[token_step])
        queueing = row.first_scheduled_s - row.arrival_s
        between = sum(step_dur[s] for s in steps["step"] if first_step <= s <= token_step)
        # TTFT = queueing + the durations of the steps from first scheduled to first token
        # (the engine never idles while a request is running).
        assert np.isclose(row.first_token_s - row.arrival_s, queueing + between)


ASYNC_LOAD_ALONE = """
name: async-load-alone
clock: steps
cache: {block_size: 16, num_blocks: 40, groups: [full_attention]}
scheduler: {max_num_seqs: 4, max_num_batched_tokens: 64, prefix_policy: pr48425}
connector: {type: scripted, matched_tokens: {r0: 32}, load_async: true, async_load_steps: 3}
workload:
  requests:
    - {id: r0, at: 0, prompt: [{content: doc, tokens: 100}], max_tokens: 2}
"""


def test_engine_keeps_stepping_during_a_step_counted_async_load():
    """vLLM 0.33's answer (its real Scheduler on CPU with a MockKVConnector-like
    scripted connector, ``is_async``, and ``finished_recving`` reported in the
    output of step 2, i.e. 3 steps after the load started): the load starts at
    step 0, steps 1 and 2 schedule nothing, step 3 resumes r0 at 32 computed
    tokens with 64, step 4 finishes the prefill (4 tokens), step 5 decodes 1."""
    result = sim.run(sim.config.scenario_from_text(ASYNC_LOAD_ALONE, "async-load-alone.yaml"))
    assert result.summary["status"] == "complete"
    sched = result.schedule
    assert list(sched["step"]) == [3, 4, 5]
    assert list(sched["num_scheduled_tokens"]) == [64, 4, 1]
    assert list(sched["num_computed_tokens"]) == [32, 96, 100]
    adm = result.admissions
    assert list(adm["step"]) == [0, 3]
    assert list(adm["kind"]) == ["first", "after_async_load"]
    assert list(adm["external_tokens"]) == [32, 0]
    # The engine stepped through the load (vLLM steps while a request waits for remote KV).
    assert list(result.steps["step"]) == [0, 1, 2, 3, 4, 5]
