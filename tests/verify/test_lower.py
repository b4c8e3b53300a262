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
    # Dense: a's 3 outputs, b's 1, then doc's 40 tokens and x's 5, one id each (no explicit ids).
    assert (a["output_token_base"], b["output_token_base"]) == (0, 3)
    assert a["prompt_token_ids"] == list(range(4, 44)) and tail == list(range(44, 49))
    assert script["token_id_end"] == 49


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
    from sim.verify.lower import lowered_token_ids

    run = StreamBlocksSegment("mc:", (7, 8, 7), 16, 40)
    compact = lowered_token_ids([Request("r", [run], 1)]).prompts["r"]
    spelled = lowered_token_ids([Request("r", list(run.pieces()), 1)]).prompts["r"]
    assert compact == spelled
    assert len(compact) == 40
    assert compact[32:] == compact[:8]  # the third block (8 tokens) repeats the first block's id: the same tokens
    assert not set(compact[16:32]) & set(compact[:16])  # another id: other tokens
    # One id per distinct token: the output's 1, then hash 7's 16 tokens and hash 8's 16.
    assert compact == list(range(1, 33)) + list(range(1, 9))


def _token_identity(requests, tokens):
    """Each lowered id -> the token it stands for (``(stream, position)`` or an explicit id), asserting the
    map is a function (no id stands for two tokens) and returning it."""
    from sim.core.tokens import IdsSegment, StreamSegment, basic_segments, output_stream

    meaning: dict[int, object] = {}

    def name(token_id: int, token: object) -> None:
        assert meaning.setdefault(token_id, token) == token, f"id {token_id}: {meaning[token_id]} and {token}"

    for r in requests:
        ids, pos = tokens.prompts[r.request_id], 0
        for seg in basic_segments(r.prompt):
            for k in range(seg.length):
                token = (seg.stream, seg.start + k) if isinstance(seg, StreamSegment) else ("ids", int(seg.ids[k]))
                assert not isinstance(seg, IdsSegment) or ids[pos] == token[1]  # explicit ids kept as they are
                name(ids[pos], token)
                pos += 1
        for j in range(int(r.output_len)):
            name(tokens.output_base[r.request_id] + j, (output_stream(r.request_id), j))
    return meaning


def test_the_lowering_is_one_to_one_on_tokens():
    """Distinct tokens get distinct ids and equal tokens equal ids (streams, hash blocks, quoted outputs,
    explicit ids), and ids are dense: exactly the distinct tokens, each a single id."""
    import numpy as np

    from sim.core.request import Request
    from sim.core.tokens import IdsSegment, StreamBlocksSegment, StreamSegment, output_stream
    from sim.verify.lower import lowered_token_ids

    rng = np.random.default_rng(7)
    requests = []
    for i in range(60):
        prompt = []
        for _ in range(int(rng.integers(1, 4))):
            kind = int(rng.integers(0, 4))
            if kind == 0:
                prompt.append(
                    StreamSegment(f"s{rng.integers(0, 5)}", int(rng.integers(0, 30)), int(rng.integers(1, 40)))
                )
            elif kind == 1:
                ids = [int(h) for h in rng.integers(0, 12, size=int(rng.integers(1, 5)))]
                prompt.append(StreamBlocksSegment("mc:", ids, 8, 8 * len(ids) - int(rng.integers(0, 8))))
            elif kind == 2:
                prompt.append(IdsSegment(rng.integers(0, 50, size=int(rng.integers(1, 6))).astype(np.int64)))
            elif i:
                prompt.append(StreamSegment(output_stream(f"q{int(rng.integers(0, i))}"), 0, int(rng.integers(1, 3))))
        if not prompt:
            prompt.append(StreamSegment("s0", 0, 3))
        requests.append(Request(f"q{i}", prompt, int(rng.integers(2, 6)), arrival_time=float(i)))
    tokens = lowered_token_ids(requests)
    meaning = _token_identity(requests, tokens)
    # One-to-one: as many ids as distinct tokens. Dense: after the explicit ids, each stream holds as many ids
    # as its furthest position reached, no more.
    assert len(set(meaning.values())) == len(meaning)
    furthest: dict[str, int] = {}
    for token in meaning.values():
        furthest[token[0]] = max(furthest.get(token[0], 0), token[1] + 1)
    explicit = furthest.pop("ids")
    assert tokens.end == explicit + sum(furthest.values())


def test_a_collision_is_caught_by_the_identity_check():
    """The one-to-one check above bites: two streams lowered onto one range are reported."""
    from sim.core.request import Request
    from sim.core.tokens import StreamSegment
    from sim.verify.lower import LoweredTokens, lowered_token_ids

    requests = [Request("a", [StreamSegment("x", 0, 4)], 1), Request("b", [StreamSegment("y", 0, 4)], 1)]
    good = lowered_token_ids(requests)
    _token_identity(requests, good)
    collided = LoweredTokens(good.stream_base, good.output_base, {**good.prompts, "b": good.prompts["a"]}, good.end)
    with pytest.raises(AssertionError, match="\\('x', 0\\) and \\('y', 0\\)"):
        _token_identity(requests, collided)


def test_token_ids_fit_32_bits_and_workloads_with_more_distinct_tokens_are_not_verifiable():
    """vLLM 0.34 keeps token ids in an int32 buffer. One id per distinct token: 60,000 hash-block streams (a
    fixed range per stream of 2**16 ids, the lowering before, overflowed at 32,767) fit; a workload with
    more distinct tokens than 31 bits hold is refused instead of overflowing."""
    from sim.core.request import Request
    from sim.core.tokens import StreamBlocksSegment, StreamSegment
    from sim.verify.lower import stream_bases

    trace = [
        Request(f"q{i}", [StreamBlocksSegment("mc:", range(6 * i, 6 * i + 6), 512, 3000)], 1) for i in range(10_000)
    ]
    base, end = stream_bases(trace)
    assert len(base) == 70_000 and end == 10_000 + 60_000 * 512 - 10_000 * 72
    huge = [Request("a", [StreamSegment("d", MAX_TOKEN_ID - 1, 1)], 1)]
    assert stream_bases(huge)[1] - 1 == MAX_TOKEN_ID  # the largest id fits exactly
    with pytest.raises(NotVerifiable, match="32-bit token ids"):
        stream_bases(huge + [Request("b", [StreamSegment("e", 0, 1)], 1)])


def test_a_quoted_output_of_a_request_not_in_the_workload_is_a_stream_of_its_own():
    """A cluster instance's turn quotes its parent's answer, generated on another instance: the tokens are
    numbered like any stream (distinct from every other token, equal in the two turns that quote them)."""
    text = BASE.replace(
        "- {id: a, at: 0, prompt: [{content: doc, tokens: 40}], max_tokens: 3}",
        "- {id: c, at: 0, prompt: [{content: doc, tokens: 20}, {output_of: a, tokens: 2}], max_tokens: 3}",
    )
    script = lower(_scenario(text.split("actions:")[0]))
    c, b = script["requests"]
    assert c["prompt_token_ids"][20:22] == b["prompt_token_ids"][20:22]
    quoted = set(c["prompt_token_ids"][20:22])
    others = set(c["prompt_token_ids"][:20]) | set(b["prompt_token_ids"][22:])
    outputs = {r["output_token_base"] + j for r in (c, b) for j in range(3)}
    assert len(quoted) == 2 and not quoted & (others | outputs)
