"""Lowering a scenario for the vLLM side (no vLLM needed)."""

from __future__ import annotations

import pytest

from sim.config.load import scenario_from_text
from sim.verify.lower import MAX_TOKEN_ID, NotVerifiable, lower, not_verifiable_reason

BASE = """
name: low
clock: steps
cache: {block_size: 16, num_blocks: 64, groups: [full_attention, mamba], retention_interval: null}
scheduler: {max_num_seqs: 2, max_num_batched_tokens: 64, prefix_policy: pr48425}
connector: {type: scripted, matched_tokens: {b: 16}, load_async: {b: true}, async_load_steps: 2}
workload:
  requests:
    - {id: a, at: 0, prompt: [{content: doc, tokens: 40}], max_tokens: 3}
    - {id: b, at: 2, prompt: [{content: doc, tokens: 20}, {output_of: a, tokens: 2}, {content: x, tokens: 5}], max_tokens: 1}
actions:
  - {at: 4, evict: {prefix_of: a, group: mamba, blocks: [0, 1]}}
  - {at: 5, reset_prefix_cache: true}
"""


def _scenario(text: str = BASE, **over: str):
    return scenario_from_text(text, "low.yaml", overrides=[f"{k}={v}" for k, v in over.items()])


def test_equal_content_equal_ids_and_outputs_quoted_as_generated():
    script = lower(_scenario())
    a, b = script["requests"]
    assert a["prompt_token_ids"][:20] == b["prompt_token_ids"][:20]
    # b quotes a's first two generated tokens: exactly what vLLM's request a samples.
    assert b["prompt_token_ids"][20:22] == [a["output_token_base"], a["output_token_base"] + 1]
    tail = b["prompt_token_ids"][22:]
    assert len(tail) == 5 and not set(tail) & set(a["prompt_token_ids"])
    assert a["output_token_base"] != b["output_token_base"]
    assert all(t >= script["token_stride"] for t in a["prompt_token_ids"])
    everything = [t for r in script["requests"] for t in r["prompt_token_ids"]]
    assert max(everything) <= MAX_TOKEN_ID and script["token_stride"] == 1 << 16


def test_layout_connector_and_actions_are_hybridsims():
    script = lower(_scenario())
    assert [g["type"] for g in script["groups"]] == ["full_attention", "mamba"]
    assert script["retention_interval"] is None and script["num_blocks"] == 64
    assert script["connector"] == {
        "matched_tokens": {"b": 16},
        "holds": {},
        "load_async": {"b": True},
        "async_load_steps": 2,
        "supports_divergent_local_hybrid_hits": False,
    }
    assert script["actions"] == [
        {"at_step": 4, "kind": "evict", "request": "a", "groups": [1], "block_indices": [0, 1]},
        {"at_step": 5, "kind": "reset_prefix_cache"},
    ]
    assert script["max_steps"] > 5


def test_same_step_arrivals_keep_the_engines_order():
    # The engine adds requests by a stable sort on arrival time: workload order breaks ties, not the id.
    text = BASE.replace("{id: a, at: 0,", "{id: c9, at: 0,").replace("output_of: a", "output_of: c9")
    text = text.replace("{id: b, at: 2,", "{id: c10, at: 0,").replace("prefix_of: a", "prefix_of: c9")
    text = text.replace("{b: 16}", "{c10: 16}").replace("{b: true}", "{c10: true}")
    text = text.replace("{content: doc, tokens: 20}, {output_of: c9, tokens: 2}, ", "{content: doc, tokens: 20}, ")
    script = lower(_scenario(text))
    assert [r["id"] for r in script["requests"]] == ["c9", "c10"]
    assert [r["arrival_step"] for r in script["requests"]] == [0, 0]


@pytest.mark.parametrize(
    "override, needle",
    [
        ({"scheduler.prefix_policy": "reconciled"}, "scheduler.prefix_policy"),
        ({"cache.corrected_mamba_accounting": "true"}, "corrected_mamba_accounting"),
        ({"scheduler.assert_no_external_kv_in_mamba_split": "true"}, "vLLM 0.22.1's assertion"),
        ({"connector.supports_hma": "false"}, "supports_hma"),
        ({"cache.mamba_checkpoint_policy": "branch_points"}, "'branch_points' is a what-if checkpoint placement"),
        ({"cache.mamba_checkpoint_policy": "every_block"}, "'every_block' is a what-if checkpoint placement"),
        ({"cache.mamba_checkpoint_policy": "frequency"}, "'frequency' is a what-if checkpoint placement"),
        ({"workload.sessions": "{mode: closed}"}, "closed-loop arrivals depend on the run"),
    ],
)
def test_not_verifiable_reasons(override, needle):
    scenario = _scenario(**override)
    reason = not_verifiable_reason(scenario)
    assert reason is not None and needle in reason
    with pytest.raises(NotVerifiable):
        lower(scenario)


def test_time_clock_and_unmapped_connector_are_not_verifiable():
    text = BASE.replace(
        "connector: {type: scripted, matched_tokens: {b: 16}, load_async: {b: true}, async_load_steps: 2}",
        "connector: {type: offload, capacity_gb: 1}",
    )
    assert "connector.type" in not_verifiable_reason(_scenario(text))
    assert not_verifiable_reason(_scenario()) is None
    assert not_verifiable_reason(_scenario(**{"cache.mamba_checkpoint_policy": "vllm"})) is None


def test_hash_block_prompts_lower_as_their_per_block_segments():
    """A trace prompt held as one StreamBlocksSegment lowers to the ids of its per-block StreamSegments."""
    from sim.core.request import Request
    from sim.core.tokens import StreamBlocksSegment
    from sim.verify.lower import _token_ids

    run = StreamBlocksSegment("mc:", (7, 8, 7), 16, 40)
    compact = Request("r", [run], 1)
    spelled = Request("r", list(run.pieces()), 1)
    ids = _token_ids(compact, {}, 1 << 16)
    assert ids == _token_ids(spelled, {}, 1 << 16)
    assert len(ids) == 40
    assert ids[32:] == ids[:8]  # the third block (8 tokens) repeats the first block's id: the same tokens
    assert not set(ids[16:32]) & set(ids[:16])  # another id: other tokens


def test_token_ids_fit_32_bits_and_streams_too_long_for_them_are_not_verifiable():
    """vLLM 0.34 keeps token ids in an int32 buffer: the stride grows with the longest stream, and a workload
    whose streams cannot all fit is refused instead of overflowing."""
    long_doc = BASE.replace(
        "{content: doc, tokens: 40}], max_tokens: 3}", "{content: doc, tokens: 70000}], max_tokens: 3}"
    )
    script = lower(_scenario(long_doc, **{"scheduler.max_model_len": "80000"}))
    assert script["token_stride"] == 1 << 17
    assert max(t for r in script["requests"] for t in r["prompt_token_ids"]) <= MAX_TOKEN_ID
    from sim.core.request import Request
    from sim.core.tokens import StreamSegment
    from sim.verify.lower import token_stride

    # Each request is two streams (its prompt's and its output's); with ranges of 2**20 ids, the explicit range
    # and 2047 streams fit in 31 bits, 2049 do not.
    deep = [Request(f"q{i}", [StreamSegment(f"d{i}", (1 << 20) - 8, 8)], 1) for i in range(1023)]
    assert token_stride(deep) == 1 << 20
    with pytest.raises(NotVerifiable, match="32-bit token ids"):
        token_stride(deep + [Request(f"x{i}", [StreamSegment(f"x{i}", 0, 8)], 1) for i in range(1)])
