"""Scripted actions: ``evict`` drops every cache entry of the named hash in the named group."""

from __future__ import annotations

import pytest

import sim
from sim.config import ScenarioError, scenario_from_text

EQUAL_CONTENT_TWICE = """
name: evict-equal-content-twice
clock: steps
cache: {block_size: 16, num_blocks: 100, retention_interval: null, groups: [full_attention, mamba]}
scheduler: {max_num_seqs: 4, max_num_batched_tokens: 8192, prefix_policy: pr48425}
workload:
  requests:
    - {id: r0, at: 0, prompt: [{content: doc, tokens: 64}], max_tokens: 1}
    - {id: r1, at: 2, prompt: [{content: doc, tokens: 64}], max_tokens: 1}
actions:
  - {at: 2, evict: {prefix_of: r0, group: mamba, blocks: [2, 3]}}
  - {at: 4, evict: {prefix_of: r0, group: full_attention, blocks: [0]}}
"""


def test_evict_drops_every_block_cached_under_the_hash():
    """vLLM 0.33's answer, from its real Scheduler + BlockPool on CPU (same layout,
    hand-built KVCacheConfig, dense retention, fabricated output; the evictions
    through ``KVCacheManager.evict_blocks`` with the ids cached under the hash):
    with r0's Mamba states (blocks 4, 6) evicted, r1's Mamba hit is 0, so it
    recomputes the FA prefix and caches equal content again in blocks 7, 8, 9, 11
    (r0's are 1, 2, 3, 5). Evicting FA block 0 then drops both blocks cached
    under that hash, 1 and 7: two ``BlockRemoved`` events, the key is gone."""
    result = sim.run(scenario_from_text(EQUAL_CONTENT_TWICE, "evict-equal-content-twice.yaml"))
    ev = result.kv_events
    stored_fa = ev[(ev["kind"] == "stored") & (ev["group"] == 0)]
    assert list(stored_fa["block_id"]) == [1, 2, 3, 5, 7, 8, 9, 11]
    # r1 stored the same FA hashes again (equal content, two blocks each).
    assert list(stored_fa["block_hash"].iloc[:4]) == list(stored_fa["block_hash"].iloc[4:])
    removed = ev[ev["kind"] == "removed"]
    assert list(zip(removed["step"], removed["group"], removed["block_id"])) == [
        (2, 1, 4),
        (2, 1, 6),
        (4, 0, 1),
        (4, 0, 7),
    ]
    assert set(removed["cause"]) == {"evict_action"}
    assert removed["block_hash"].iloc[2] == removed["block_hash"].iloc[3] == stored_fa["block_hash"].iloc[0]


FAULT_LATER = """
name: fault-action
clock: steps
cache: {block_size: 16, num_blocks: 40, groups: [full_attention]}
scheduler: {max_num_seqs: 4, max_num_batched_tokens: 64, prefix_policy: pr48425}
connector: {type: faulty, wraps: {type: scripted, matched_tokens: {r0: 32, r1: 32}, load_async: true,
            async_load_steps: 1}}
workload:
  requests:
    - {id: r0, at: 0, prompt: [{content: doc, tokens: 100}], max_tokens: 2}
    - {id: r1, at: 10, prompt: [{content: other, tokens: 100}], max_tokens: 2}
"""


def _faults(actions: str) -> dict:
    result = sim.run(scenario_from_text(FAULT_LATER + actions, "fault-action.yaml"))
    return {k: v for k, v in result.summary["connector_metrics"].items() if k.startswith("fault_")}


def test_connector_fault_action_changes_the_faults_from_its_step_on():
    """Both requests load 32 tokens (2 blocks); only r1's load starts after the action, so only it fails."""
    assert _faults("")["fault_failed_loads"] == 0
    got = _faults("actions:\n  - {at: 5, connector_fault: {fail_loads: [r1], load_failure_prob: 0.0}}\n")
    assert (got["fault_loads_seen"], got["fault_failed_loads"], got["fault_error_blocks"]) == (2, 1, 2)
    # An action after r1's load started changes nothing for it.
    assert _faults("actions:\n  - {at: 11, connector_fault: {fail_loads: [r1]}}\n")["fault_failed_loads"] == 0


def test_connector_fault_action_with_a_bad_option_names_it_and_the_valid_ones():
    with pytest.raises(ScenarioError) as err:
        sim.run(
            scenario_from_text(
                FAULT_LATER + "actions:\n  - {at: 5, connector_fault: {fail_load: [r1]}}\n", "fault-action.yaml"
            )
        )
    assert "actions.0.connector_fault.fail_load: not a fault option of 'faulty'" in str(err.value)
    assert "fail_loads" in str(err.value)
    with pytest.raises(ScenarioError, match=r"actions.0.connector_fault.load_failure_prob: expected a probability"):
        sim.run(
            scenario_from_text(
                FAULT_LATER + "actions:\n  - {at: 5, connector_fault: {load_failure_prob: 2}}\n", "fault-action.yaml"
            )
        )


def test_connector_fault_action_needs_the_faulty_wrapper():
    text = FAULT_LATER.replace("{type: faulty, wraps: {type: scripted", "{type: scripted").replace(
        "async_load_steps: 1}}", "async_load_steps: 1}"
    )
    with pytest.raises(ScenarioError, match="connector 'scripted' takes no faults"):
        sim.run(scenario_from_text(text + "actions:\n  - {at: 5, connector_fault: {fail_loads: [r1]}}\n", "f.yaml"))


# `big` is longer than max_model_len, so it is rejected; it shares `doc` with r0, and an action evicts the FA
# entries of its prompt blocks 2 and 3 (r0's blocks 2 and 3).
EVICT_A_REJECTED_REQUEST = """
name: evict-rejected
clock: steps
cache: {block_size: 16, num_blocks: 40, groups: [full_attention, mamba]}
scheduler: {max_model_len: 100}
workload:
  requests:
    - {id: r0, at: 0, prompt: [{content: doc, tokens: 64}], max_tokens: 2}
    - {id: big, at: 1, prompt: [{content: doc, tokens: 160}], max_tokens: 2}
    - {id: r1, at: 4, prompt: [{content: doc, tokens: 64}], max_tokens: 2}
actions:
  - {at: 3, evict: {prefix_of: big, group: full_attention, blocks: [2, 3]}}
"""


def test_evict_names_a_request_rejected_as_too_long():
    """The action's hashes come from the prompt: a rejected request's prompt names cacheable content too (it was
    'no request big in the workload', though the workload holds it)."""
    result = sim.run(scenario_from_text(EVICT_A_REJECTED_REQUEST, "evict-rejected.yaml"))
    outcomes = dict(zip(result.requests["request_id"], result.requests["outcome"]))
    assert outcomes == {"r0": "ok", "big": "rejected", "r1": "ok"}
    ev = result.kv_events
    stored = ev[(ev["kind"] == "stored") & (ev["group"] == 0) & (ev["request_id"] == "r0")]
    removed = ev[ev["kind"] == "removed"]
    assert list(removed["step"]) == [3, 3] and set(removed["request_id"]) == {"big"}
    assert list(removed["block_hash"]) == list(stored["block_hash"].iloc[2:4])
    admissions = result.admissions
    assert admissions.loc[admissions["request_id"] == "r1", "hit_g0"].iloc[0] == 32  # blocks 0-1 still cached


def test_evict_naming_a_script_request_dropped_by_sampling_says_so():
    text = EVICT_A_REJECTED_REQUEST.replace("prefix_of: big", "prefix_of: r1").replace(
        "workload:\n", "workload:\n  time_window: [0, 3]\n"
    )
    with pytest.raises(
        ScenarioError,
        match=r"actions.0.evict.prefix_of: no request 'r1' in the workload \(the "
        r"script's request was dropped by workload.time_window, sample or limit\)",
    ):
        sim.run(scenario_from_text(text, "evict-dropped.yaml"))


def test_verify_refuses_an_eviction_named_by_a_rejected_request():
    from sim.verify.lower import NotVerifiable, lower

    with pytest.raises(NotVerifiable, match="request big is rejected as longer than max_model_len"):
        lower(scenario_from_text(EVICT_A_REJECTED_REQUEST, "evict-rejected.yaml"))
