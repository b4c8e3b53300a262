"""workload_stats: counts, percentiles and the ideal prefix-hit rate on hand-computed cases."""

import pytest

from sim.core.request import Request
from sim.core.tokens import StreamSegment, output_stream
from sim.workload import workload_stats
from sim.workload.stats import ideal_hit_tokens


def req(rid, at, segments, out=1, **kw):
    return Request(rid, [StreamSegment(*s) for s in segments], max_tokens=out, arrival_time=at, **kw)


def test_identical_prompts_hit_all_but_the_last_block():
    # 64 tokens = 4 full blocks of 16; a hit is capped at 63 tokens -> 3 blocks.
    reqs = [req("a", 0.0, [("doc", 0, 64)]), req("b", 2.0, [("doc", 0, 64)]), req("c", 4.0, [("doc", 0, 70)])]
    assert ideal_hit_tokens(reqs, 16) == [0, 48, 64]
    s = workload_stats(reqs, 16)
    assert s["requests"] == 3 and s["duration"] == 4.0 and s["rate"] == 0.75
    assert s["ideal_hit_tokens"] == 112 and s["prompt_tokens"] == 198
    assert s["ideal_prefix_hit_rate"] == pytest.approx(112 / 198)
    assert s["prompt_len"]["max"] == 70 and s["prompt_len"]["p50"] == 64


def test_hits_follow_arrival_order_not_list_order():
    reqs = [req("late", 5.0, [("doc", 0, 40)]), req("early", 1.0, [("doc", 0, 40)])]
    assert workload_stats(reqs, 16)["ideal_hit_tokens"] == 32


def test_a_hit_stops_at_the_first_miss_and_salt_and_lora_separate():
    base = req("a", 0.0, [("doc", 0, 64)])
    diverged = req("b", 1.0, [("doc", 0, 16), ("other", 0, 16), ("doc", 32, 32)])
    salted = req("c", 2.0, [("doc", 0, 64)], cache_salt="s")
    lora = req("d", 3.0, [("doc", 0, 64)], lora_name="l")
    assert ideal_hit_tokens([base, diverged, salted, lora], 16) == [0, 16, 0, 0]


def test_generated_tokens_are_cached_except_the_last():
    # a: 40 prompt + 9 output; it computes 40 + 9 - 1 = 48 tokens -> 3 cached blocks.
    a = req("a", 0.0, [("u", 0, 40)], out=9)
    b = Request(
        "b", [StreamSegment("u", 0, 40), StreamSegment(output_stream("a"), 0, 9), StreamSegment("v", 0, 30)], 1, 1.0
    )
    assert ideal_hit_tokens([a, b], 16) == [0, 48]
    a8 = req("a", 0.0, [("u", 0, 40)], out=8)  # 47 computed tokens -> only 2 full blocks
    assert ideal_hit_tokens([a8, b], 16) == [0, 32]


def test_requests_are_not_modified():
    reqs = [req("a", 0.0, [("doc", 0, 64)])]
    workload_stats(reqs, 16)
    assert reqs[0].block_hashes == [] and reqs[0].num_output_tokens == 0


# ------------------------------------------------------------------ the ideal under a Mamba state placement
def _rag_tree():
    """S(40) then D1(50) or D2(30), then a question: four requests on one shared system prompt (B = 16).

    a: S D1 q1 (99), b: S D2 q2 (90), c: S D1 q3 (99), d: S D2 q4 (90).
    """
    return [
        req("a", 0.0, [("S", 0, 40), ("D1", 0, 50), ("q1", 0, 9)]),
        req("b", 1.0, [("S", 0, 40), ("D2", 0, 30), ("q2", 0, 20)]),
        req("c", 2.0, [("S", 0, 40), ("D1", 0, 50), ("q3", 0, 9)]),
        req("d", 3.0, [("S", 0, 40), ("D2", 0, 30), ("q4", 0, 20)]),
    ]


def test_vllm_placement_needs_a_state_at_the_hit_and_keeps_the_junction_from_the_second_request_on():
    from sim.workload.stats import placement_hit_tokens

    reqs = _rag_tree()
    # FA alone: b shares S (32 at B = 16), c shares S+D1 (80), d shares S+D2 (64).
    assert ideal_hit_tokens(reqs, 16) == [0, 32, 80, 64]
    # vLLM: a leaves a state at 96 only; b finds FA 32 but no state (saves the junction at 32);
    # c finds FA 80, the deepest state within it is b's junction at 32 (saves the junction at 80);
    # d finds FA 64 and the state at 32.
    assert placement_hit_tokens(reqs, 16, None) == [0, 0, 32, 32]


def test_each_placement_on_the_rag_tree():
    from sim.core.policy.checkpoint import create_checkpoint_policy
    from sim.workload.stats import placement_hit_tokens

    def hits(name, **options):
        return placement_hit_tokens(_rag_tree(), 16, create_checkpoint_policy(name, options))

    # branch_points: a saves at 32 (end of S) and 80 (end of D1), b at 64 (end of D2): every branch in time.
    assert hits("branch_points") == [0, 32, 80, 64]
    assert hits("every_block") == [0, 32, 80, 64]
    # every second block: states at 32, 64 (and 96); c's FA hit 80 resumes at 64.
    assert hits("every_block", stride=2) == [0, 32, 64, 64]
    # frequency k=2: b saves S's blocks (seen twice), c saves S+D1's; D2's blocks had been seen once when b
    # was admitted, so nobody saved them and d resumes at 32 (b's junction), as under vLLM.
    assert hits("frequency", k=2) == [0, 0, 32, 32]


def test_retention_adds_states_every_interval_as_an_upper_bound():
    from sim.workload.stats import placement_hit_tokens

    reqs = _rag_tree()
    assert placement_hit_tokens(reqs, 16, None, retention_interval=32) == [0, 32, 64, 64]
    assert placement_hit_tokens(reqs, 16, None, retention_interval=None) == ideal_hit_tokens(reqs, 16)
