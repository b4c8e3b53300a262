"""``verify`` on a cluster with a shared tier or P/D roles: each instance's connector answers are recorded during
the cluster run (sim/verify/replay.py) and replayed to that instance's vLLM engine by the harness's replay
connector.

The recording must change nothing and hold what the scheduler was told; the replay must give vLLM's decisions
on both supported releases, and a tampered or missing answer must make the verdict ``differ``, never crash."""

from __future__ import annotations

import copy
from typing import Any

import pandas as pd
import pytest

import sim
from sim.config import scenario_from_text
from sim.verify import cluster as verify_cluster_module
from sim.verify.compare import first_difference
from sim.verify.replay import replay_script, step_runs
from sim.verify.run import VerifyStatus, verify_scenario
from sim.verify.vllm_side import DecisionTrace

#: Two instances behind a round robin share a small tier; a tight pool makes the tier answer ``None``
#: (a preempted request's store in flight), loads wait behind full pools, and finished requests keep their
#: blocks until their stores land (``delay_free``).
TIER = """
name: tier-replay
seed: 5
clock: steps
cache: {block_size: 16, num_blocks: 40, groups: [full_attention, mamba]}
scheduler: {max_num_seqs: 8, max_num_batched_tokens: 256, max_model_len: 4096, prefix_policy: pr48425}
outputs: {plots: false}
workload:
  generator:
    arrivals: {process: poisson, rate: 2}
    count: 80
    structure:
      kind: shared_system
      system: {num_prompts: 3, length: {dist: uniform, low: 60, high: 200}, zipf: 1.0}
      user_len: {dist: lognormal, mean: 40, sigma: 0.5}
    output: {dist: uniform, low: 2, high: 40}
cluster:
  instances: 2
  router: {policy: round_robin}
  tier: {capacity_gb: 0.01, chunk_tokens: 32, transfer_steps: 3}
"""


def _recorded(text: str = TIER) -> tuple[Any, list[Any]]:
    scenario = scenario_from_text(text)
    run = scenario.model_copy(update={"outputs": scenario.outputs.model_copy(update={"schedule_table": True})})
    result, recordings = verify_cluster_module.run_recorded(run, True)
    assert recordings is not None
    return result, recordings


def test_recording_changes_nothing_and_holds_what_the_scheduler_was_told() -> None:
    result, recordings = _recorded()
    scenario = scenario_from_text(TIER)
    plain = sim.run_scenario(
        scenario.model_copy(update={"outputs": scenario.outputs.model_copy(update={"schedule_table": True})})
    )
    for name in ("requests", "admissions", "schedule", "kv_events", "steps"):
        pd.testing.assert_frame_equal(result.tables[name], plain.tables[name])
    admissions = result.tables["admissions"]
    for i, rec in enumerate(recordings):
        mine = admissions[admissions["instance"] == i]
        # Every "not ready" answer left an attempt waiting as connector_not_ready, and nothing else did.
        nones = sum(1 for calls in rec.lookups.values() for c in calls if c[2] is None)
        assert nones == int((mine["reason"] == "connector_not_ready").sum()) and nones > 0
        # The admitted attempts took exactly the recorded answers: each request's last lookup before it was admitted.
        asked = {rid: calls for rid, calls in rec.lookups.items()}
        loads = [c for calls in asked.values() for c in calls if c[2]]
        assert loads and all(c[3] for c in loads)  # the tier's loads are asynchronous
        # One delay_free answer per finished request; some waited for their stores.
        requests = result.tables["requests"]
        finished = requests[(requests["instance"] == i) & requests["finished_s"].notna()]
        assert sorted(rec.delay_free) == sorted(finished["request_id"])
        assert all(len(a) == 1 for a in rec.delay_free.values()) and any(a[0] for a in rec.delay_free.values())
        # Each delayed free was released by a finished_sending; every async load by a finished_recving.
        sent = [rid for f in rec.finished for rid in f[2]]
        assert sorted(sent) == sorted(rid for rid, a in rec.delay_free.items() if a[0])
        assert rec.steps == sorted(rec.steps) and len(rec.steps) == len(set(rec.steps))
        assert len(rec.steps) == int((result.tables["steps"]["instance"] == i).sum())


def test_step_runs_are_compact_and_exact() -> None:
    assert step_runs([0, 1, 2, 5, 7, 8]) == [[0, 2], [5, 5], [7, 8]]
    assert step_runs([]) == []


def _trace(steps: list[Any], mismatches: list[Any] | None = None) -> DecisionTrace:
    trace: DecisionTrace = {"steps": steps, "crash": None, "finished": {}, "num_steps": 10, "stopped": ""}
    if mismatches is not None:
        trace["replay_mismatches"] = mismatches
    return trace


def test_a_replay_mismatch_is_a_difference_unless_the_decisions_differ_first() -> None:
    step = {"step": 4, "scheduled": [["a", 16]], "preempted": [], "admissions": [], "kv_events": []}
    other = dict(step, scheduled=[["a", 32]])
    mismatch = [{"step": 6, "message": "vLLM asked the connector about request b (call 2, local 0)"}]
    diff = first_difference(_trace([step]), _trace([step], mismatch))
    assert diff is not None and diff.step == 6 and diff.what == "connector replay"
    assert "request b" in diff.theirs
    diff = first_difference(_trace([step]), _trace([other], mismatch))
    assert diff is not None and diff.step == 4 and diff.what.startswith("scheduled")
    later = dict(step, step=6)
    diff = first_difference(_trace([later]), _trace([dict(later, scheduled=[["a", 32]])], mismatch))
    assert diff is not None and diff.what == "connector replay"  # at the same step the mismatch is the cause
    assert first_difference(_trace([step]), _trace([step], [])) is None


def _verify(vllm: str) -> Any:
    return verify_scenario(scenario_from_text(TIER + f"vllm_version: '{vllm}'\n"))


@pytest.mark.slow
def test_each_tier_instance_decides_as_vllm_with_its_recorded_answers(vllm: str) -> None:
    verdict = _verify(vllm)
    assert verdict.status is VerifyStatus.IDENTICAL, (verdict.reason, verdict.difference)
    assert "instance 0: identical (40 requests)" in verdict.reason
    assert "instance 1: identical (40 requests)" in verdict.reason


def _tampered(monkeypatch: pytest.MonkeyPatch, change: Any) -> None:
    """Replay instance 1's recording changed by ``change(script)``."""
    calls = {"n": 0}

    def tampered(rec: Any) -> Any:
        script = replay_script(rec)
        calls["n"] += 1
        if calls["n"] == 2:
            change(script)
        return script

    monkeypatch.setattr(verify_cluster_module, "replay_script", tampered)


@pytest.mark.slow
def test_a_tampered_answer_makes_verify_say_different(vllm: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Instance 1's first tier hit is replayed as a miss: vLLM then admits that request without the load."""
    seen: dict[str, Any] = {}

    def miss(script: Any) -> None:
        rid, n = min(
            ((rid, n) for rid, calls in script["lookups"].items() for n, c in enumerate(calls) if c[2]),
            key=lambda x: script["lookups"][x[0]][x[1]][0],
        )
        seen["call"] = copy.deepcopy(script["lookups"][rid][n])
        seen["request"] = rid
        script["lookups"][rid][n][2:] = [0, False]

    _tampered(monkeypatch, miss)
    verdict = _verify(vllm)
    assert verdict.status is VerifyStatus.DIFFER, verdict.reason
    assert "instance 0: identical" in verdict.reason and "instance 1: differs" in verdict.reason
    assert verdict.difference is not None and verdict.difference.step == seen["call"][0]
    assert verdict.difference.what.startswith("admissions")


@pytest.mark.slow
def test_an_answer_missing_from_the_record_makes_verify_say_different(
    vllm: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request asked about twice in hybridsim is recorded once: vLLM's second question has no answer."""

    def drop(script: Any) -> None:
        rid = next(rid for rid, calls in script["lookups"].items() if len(calls) > 1)
        del script["lookups"][rid][-1]

    _tampered(monkeypatch, drop)
    verdict = _verify(vllm)
    assert verdict.status is VerifyStatus.DIFFER, verdict.reason
    assert verdict.difference is not None and verdict.difference.what == "connector replay"
    assert "hybridsim's scheduler asked it" in verdict.difference.theirs
    assert "instance 1: differs" in verdict.reason


#: Two prefill and two decode instances: the legs run on the prefill instances and keep their blocks until the
#: decode instance's pull is done (delay_free, then finished_sending); a decode instance's request reaches its
#: scheduler when its leg is done, its connector answers the pull and reports it in finished_recving.
PD = TIER.replace("name: tier-replay", "name: pd-replay").replace(
    """  instances: 2
  router: {policy: round_robin}
  tier: {capacity_gb: 0.01, chunk_tokens: 32, transfer_steps: 3}""",
    """  instances: [{role: prefill}, {role: prefill}, {role: decode}, {role: decode}]
  router: {policy: least_loaded}
  pd: {transfer_steps: 2}""",
)


def test_a_pd_recording_holds_the_hand_overs() -> None:
    result, recordings = _recorded(PD)
    requests = result.tables["requests"]
    for i, rec in enumerate(recordings):
        mine = requests[requests["instance"] == i]
        if i < 2:  # prefill: every leg's free waits for its pull, released by a finished_sending
            assert mine["request_id"].str.endswith("@prefill").all()
            assert all(a == [True] for a in rec.delay_free.values())
            assert sorted(rid for f in rec.finished for rid in f[2]) == sorted(rec.delay_free)
        else:  # decode: each request reached the scheduler after its arrival, and pulled asynchronously
            arrival = dict(zip(mine["request_id"], mine["arrival_s"]))
            assert set(rec.added) == set(arrival)
            assert all(rec.added[rid] >= arrival[rid] for rid in rec.added)
            assert any(rec.added[rid] > arrival[rid] for rid in rec.added)
            assert sum(len(f[1]) for f in rec.finished) > 0


@pytest.mark.slow
def test_each_pd_instance_decides_as_vllm_with_its_recorded_answers(vllm: str) -> None:
    verdict = verify_scenario(scenario_from_text(PD + f"vllm_version: '{vllm}'\n"))
    assert verdict.status is VerifyStatus.IDENTICAL, (verdict.reason, verdict.difference)
    for i in range(4):
        assert f"instance {i}: identical" in verdict.reason
