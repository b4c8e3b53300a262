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
