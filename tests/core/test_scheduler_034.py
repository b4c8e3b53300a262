"""vLLM 0.34's admission and async-load knobs in the scheduler, pinned.

The scenario tests (``PINNED``) hold the admissions vLLM 0.34's own scheduler
makes (``hybridsim verify`` says identical: :func:`test_pinned_scenarios_are_vllms`
checks it again whenever vLLM 0.34 is installed). The harness tests cover what a
step-clock scenario cannot express against vLLM: a load started from the plain
queue, aborted loads, and the knobs' off switches.
"""

from __future__ import annotations

import pytest
from support.scheduler import Harness, req

from sim.api import run_scenario
from sim.config.load import scenario_from_text
from sim.connector import ScriptedConnector
from sim.core.request import RequestStatus
from sim.core.scheduler import SchedulerConfig

REORDER = """
name: {name}
clock: steps
vllm_version: "0.34"
cache: {{block_size: 16, num_blocks: 30, groups: [full_attention]}}
scheduler: {{max_num_seqs: 1, max_num_batched_tokens: 256, cache_aware_admission_window: {window},
  cache_aware_admission_threshold: {threshold}}}
workload:
  requests:
    - {{id: r0, at: 0, prompt: [{{content: a, tokens: 64}}], max_tokens: 3}}
    - {{id: r1, at: 1, prompt: [{{content: b, tokens: 48}}], max_tokens: 2}}
    - {{id: r2, at: 1, prompt: [{{content: a, tokens: 32}}, {{content: t2, tokens: 8}}], max_tokens: 2}}
    - {{id: r3, at: 1, prompt: [{{content: a, tokens: 64}}, {{content: t3, tokens: 8}}], max_tokens: 2}}
"""

LOADS = """
name: {name}
clock: steps
vllm_version: "0.34"
cache: {{block_size: 16, num_blocks: 40, groups: [full_attention]}}
scheduler: {{max_num_seqs: 1, max_num_batched_tokens: 256{cap}}}
connector: {{type: scripted, matched_tokens: {{r1: 32, r2: 32}}, load_async: {{r1: true, r2: true}}, async_load_steps: 2}}
workload:
  requests:
    - {{id: r0, at: 0, prompt: [{{content: a, tokens: 64}}], max_tokens: 6}}
    - {{id: r1, at: 1, prompt: [{{content: b, tokens: 48}}], max_tokens: 2}}
    - {{id: r2, at: 1, prompt: [{{content: c, tokens: 48}}], max_tokens: 2}}
    - {{id: r3, at: 2, prompt: [{{content: d, tokens: 40}}], max_tokens: 1}}
"""

CAP = "kv_load_cap"
#: scenario text -> vLLM 0.34's admission attempts (step, request, kind, outcome, reason).
PINNED = {
    # r2 and r3 share r0's cached prefix: with a window of 2, r2 (32 cached) goes before r1 (none), and then
    # r3 (64) before r1; with 4, r3 (64) first, then r2; ties keep their order.
    REORDER.format(name="w2", window=2, threshold=0.0): [
        (0, "r0", "first", "ok", ""),
        (3, "r2", "first", "ok", ""),
        (5, "r3", "first", "ok", ""),
        (7, "r1", "first", "ok", ""),
    ],
    REORDER.format(name="w4", window=4, threshold=0.0): [
        (0, "r0", "first", "ok", ""),
        (3, "r3", "first", "ok", ""),
        (5, "r2", "first", "ok", ""),
        (7, "r1", "first", "ok", ""),
    ],
    # Below the usage threshold nothing moves: arrival order.
    REORDER.format(name="threshold", window=4, threshold=1.0): [
        (0, "r0", "first", "ok", ""),
        (3, "r1", "first", "ok", ""),
        (5, "r2", "first", "ok", ""),
        (7, "r3", "first", "ok", ""),
    ],
    # Cap 1, batch full (one seat, r0 decoding): r1's load starts at once ("loads only"); r2's is refused while
    # r1 loads and while r1 has loaded but waits for the seat; at step 6 r1 runs and r2's load starts.
    # r3 (no load) needs the seat and waits.
    LOADS.format(name="cap1", cap=", max_num_inflight_kv_loads: 1"): [
        (0, "r0", "first", "ok", ""),
        (1, "r1", "first", "ok", ""),
        *[(s, "r2", "first", "not_admitted", CAP) for s in range(1, 6)],
        (6, "r1", "after_async_load", "ok", ""),
        (6, "r2", "first", "ok", ""),
        (8, "r2", "after_async_load", "ok", ""),
        (10, "r3", "first", "ok", ""),
    ],
    LOADS.format(name="cap2", cap=", max_num_inflight_kv_loads: 2"): [
        (0, "r0", "first", "ok", ""),
        (1, "r1", "first", "ok", ""),
        (1, "r2", "first", "ok", ""),
        (6, "r1", "after_async_load", "ok", ""),
        (8, "r2", "after_async_load", "ok", ""),
        (10, "r3", "first", "ok", ""),
    ],
    # No cap: loads start only once a seat is free (0.33's behaviour).
    LOADS.format(name="nocap", cap=""): [
        (0, "r0", "first", "ok", ""),
        (6, "r1", "first", "ok", ""),
        (6, "r2", "first", "ok", ""),
        (6, "r3", "first", "ok", ""),
        (8, "r1", "after_async_load", "ok", ""),
        (10, "r2", "after_async_load", "ok", ""),
    ],
}


def _admissions(text: str) -> list[tuple]:
    result = run_scenario(scenario_from_text(text, "pinned.yaml"))
    frame = result.tables["admissions"]
    return list(frame[["step", "request_id", "kind", "outcome", "reason"]].itertuples(index=False, name=None))


@pytest.mark.parametrize("text", list(PINNED), ids=[t.split("\n")[1][6:] for t in PINNED])
def test_vllm_034_admissions_are_pinned(text):
    assert _admissions(text) == PINNED[text]


@pytest.mark.slow
def test_pinned_scenarios_are_vllms(vllm):
    from sim.verify.run import VerifyStatus, verify_scenario

    if vllm != "0.34":
        pytest.skip("the knobs exist from vLLM 0.34 on")
    for text in PINNED:
        verdict = verify_scenario(scenario_from_text(text, "pinned.yaml"))
        assert verdict.status is VerifyStatus.IDENTICAL, verdict.difference.describe() if verdict.difference else ""


# ------------------------------------------------------------------ cache-aware admission, harness level


def _queue(h: Harness) -> list[str]:
    return [r.request_id for r in h.sched.waiting.head(len(h.sched.waiting))]


def _cached_prefix_harness(**sched) -> Harness:
    """r0 computed and cached 64 tokens of ``a``; then cold r1, r2 with 32 of them, r3 with all 64 wait."""
    h = Harness(num_blocks=30, max_num_seqs=1, **sched)
    h.add(req("r0", 64, max_tokens=3, content="a"))
    h.run_step()
    h.add(req("r1", 48, content="b"), req("r2", 40, content="a"), req("r3", 72, content="a"))
    return h


def test_the_window_reorders_among_plain_waiting_requests_only():
    h = _cached_prefix_harness(cache_aware_admission_window=4, cache_aware_admission_threshold=0.0)
    r1 = h.sched.requests["r1"]
    r1.status = RequestStatus.PREEMPTED  # a preempted request keeps its slot (position 0)
    h.sched._reorder_waiting_by_cached_prefix()
    assert _queue(h) == ["r1", "r3", "r2"]
    r1.status = RequestStatus.WAITING
    h.sched._reorder_waiting_by_cached_prefix()
    assert _queue(h) == ["r3", "r2", "r1"]


def test_the_window_is_off_under_priority_scheduling_and_without_prefix_caching():
    from sim.core.kv.kv_cache_manager import KVCacheManager
    from sim.core.kv.specs import kv_cache_config_from_groups
    from sim.core.scheduler import Scheduler

    assert Harness(cache_aware_admission_window=4).sched.cache_aware_window == 4
    assert Harness(cache_aware_admission_window=4, sched_policy="priority").sched.cache_aware_window == 0
    cfg = kv_cache_config_from_groups(("full_attention",), block_size=16, num_blocks=30, enable_prefix_caching=False)
    assert Scheduler(SchedulerConfig(cache_aware_admission_window=4), KVCacheManager(cfg)).cache_aware_window == 0


def test_no_reorder_on_a_step_that_preempted():
    """vLLM runs the reorder inside the waiting phase, which a step that preempted skips."""
    h = Harness(num_blocks=6, max_num_seqs=2, cache_aware_admission_window=4, cache_aware_admission_threshold=0.0)
    calls: list[int] = []
    reorder = h.sched._reorder_waiting_by_cached_prefix

    def spy() -> None:
        calls.append(h.sched.step)
        reorder()

    h.sched._reorder_waiting_by_cached_prefix = spy  # type: ignore[method-assign]
    h.add(req("r0", 30, max_tokens=12), req("r1", 30, max_tokens=12), req("r2", 20, max_tokens=2))
    preempting = [out.step for out in (h.run_step() for _ in range(12)) if out.preempted_req_ids]
    assert preempting and calls
    assert not set(preempting) & set(calls)


# ------------------------------------------------------------------ the in-flight load cap, harness level


class _PlainQueueLoads(ScriptedConnector):
    """Loads asynchronously but never says so in advance (``may_load_async`` no), like an offload connector."""

    def may_load_async(self, request):
        return False


def test_a_load_refused_by_the_cap_blocks_the_head_of_the_plain_queue():
    conn = _PlainQueueLoads(matched_tokens={"a": 32, "b": 32}, load_async=True, async_load_steps=3)
    h = Harness(connector=conn, max_num_inflight_kv_loads=1)
    h.add(req("a", 48), req("b", 48), req("c", 40))
    h.run_step()
    # a's load starts; b's is refused and, coming from the plain queue, stops the phase: c waits behind it.
    assert h.admission_rows("step", "request_id", "outcome", "reason") == [
        (0, "a", "ok", ""),
        (0, "b", "not_admitted", CAP),
    ]
    assert h.schedule_rows() == []


def test_an_aborted_load_counts_until_its_transfer_reports_done():
    conn = ScriptedConnector(matched_tokens={"a": 32, "b": 32}, load_async=True, async_load_steps=3)
    h = Harness(connector=conn, max_num_inflight_kv_loads=1)
    h.add(req("a", 48))
    h.run_step()
    assert h.sched.requests["a"].status is RequestStatus.WAITING_FOR_REMOTE_KVS
    h.sched.finish_requests("a", RequestStatus.FINISHED_ABORTED)
    assert h.sched._aborted_kv_loads == {"a"} and not h.sched._admits_inflight_kv_load()
    h.add(req("b", 48))
    h.run_step()  # the aborted load still holds its blocks: b's load is refused
    assert h.admission_rows("step", "request_id", "outcome", "reason")[-1] == (1, "b", "not_admitted", CAP)
    h.sched.update_from_kv_xfer_finished(finished_recving=["a"])
    assert h.sched._aborted_kv_loads == set() and h.sched._admits_inflight_kv_load()


def test_loads_start_when_the_token_budget_is_spent():
    conn = ScriptedConnector(matched_tokens={"b": 32}, load_async={"b": True}, async_load_steps=2)
    h = Harness(connector=conn, max_num_batched_tokens=64, max_num_inflight_kv_loads=2)
    h.add(req("a", 64), req("b", 48))
    h.run_step()
    # a takes the whole budget; b's load starts in the same step ("loads only").
    assert h.admission_rows("step", "request_id", "outcome")[:2] == [(0, "a", "ok"), (0, "b", "ok")]
    assert h.sched.requests["b"].status is RequestStatus.WAITING_FOR_REMOTE_KVS
    assert conn.loads == [("b", 32)]


def test_the_knobs_are_checked():
    for bad in ({"cache_aware_admission_window": -1}, {"cache_aware_admission_threshold": 1.5}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            SchedulerConfig(**bad)
    with pytest.raises(ValueError, match="max_num_inflight_kv_loads"):
        SchedulerConfig(max_num_inflight_kv_loads=0)
