"""hybridsim's tables as a decision trace (no vLLM needed)."""

from __future__ import annotations

import pytest

from sim.config.load import scenario_from_text
from sim.verify.decisions import admission_result, split_reason
from sim.verify.run import hybridsim_trace

SCENARIO = """
name: dec
clock: steps
cache: {block_size: 16, num_blocks: 12, groups: [full_attention, mamba], retention_interval: null}
scheduler: {max_num_seqs: 4, max_num_batched_tokens: 64, prefix_policy: pr48425}
workload:
  requests:
    - {id: a, at: 0, prompt: [{content: doc, tokens: 48}], max_tokens: 2}
    - {id: b, at: 0, prompt: [{content: doc, tokens: 70}], max_tokens: 2}
    - {id: c, at: 6, prompt: [{content: doc, tokens: 40}], max_tokens: 1}
actions:
  - {at: 5, evict: {prefix_of: a, group: full_attention, blocks: [1]}}
"""


@pytest.mark.parametrize(
    "outcome, reason, result",
    [
        ("ok", "", "admitted"),
        ("recompute", "", "admitted"),
        ("corrupt", "", "admitted"),
        ("crash", "", "crash"),
        ("not_admitted", "no_blocks", "no_blocks"),
        ("not_admitted", "connector_not_ready", "skipped"),
        ("not_admitted", "no_aligned_chunk", "skipped"),
    ],
)
def test_admission_result(outcome, reason, result):
    assert admission_result(outcome, reason) == result


def test_admission_result_rejects_unknown_outcomes():
    with pytest.raises(ValueError):
        admission_result("rejected", "")


def test_split_reason():
    assert split_reason("ValueError: Cannot get 1 free blocks from the pool") == (
        "ValueError",
        "Cannot get 1 free blocks from the pool",
    )
    assert split_reason("AssertionError") == ("AssertionError", "")


def test_trace_of_a_run():
    trace = hybridsim_trace(scenario_from_text(SCENARIO, "dec.yaml"), max_steps=1000)
    first = trace["steps"][0]
    assert first["step"] == 0
    assert [a["request"] for a in first["admissions"]][:1] == ["a"]
    assert first["scheduled"][0][0] == "a" and first["scheduled"][0][1] > 0
    kinds = {e["kind"] for s in trace["steps"] for e in s["kv_events"]}
    assert "stored" in kinds and "removed" in kinds
    # Hashes are numbered by first appearance: the first stored event is hash 0.
    assert trace["steps"][0]["kv_events"][0]["hash"] == 0
    evict_step = next(s for s in trace["steps"] if s["step"] == 5)
    assert [e["kind"] for e in evict_step["kv_events"]] == ["removed"]
    assert trace["finished"] == {"a": 2, "b": 2, "c": 1}
    assert trace["crash"] is None
