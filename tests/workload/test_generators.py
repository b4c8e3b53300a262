"""Prefix structures: which blocks requests share, and the statistics of what is generated."""

from collections import Counter

import numpy as np
import pytest

from sim.core.kv.hashing import RequestBlockHasher
from sim.core.tokens import StreamSegment, output_stream
from sim.workload import workload_stats
from sim.workload.generators import zipf_probabilities

B = 16


def gen(structure, *, count=200, output=32, arrivals=None, **extra):
    return {
        "generator": {
            "arrivals": arrivals or {"process": "poisson", "rate": 2.0},
            "count": count,
            "structure": structure,
            "output": output,
            **extra,
        }
    }


def hashes(req, with_output=False):
    req.set_block_hasher(RequestBlockHasher(B))
    if with_output:
        req.append_output_tokens(req.output_len)
    return list(req.block_hashes)


def test_unique_shares_nothing_and_is_sorted(build):
    reqs = build(gen({"kind": "unique", "prompt": {"dist": "uniform", "low": 50, "high": 150}}))
    assert len(reqs) == 200
    assert [r.arrival_time for r in reqs] == sorted(r.arrival_time for r in reqs)
    assert len({r.request_id for r in reqs}) == 200
    assert workload_stats(reqs, B)["ideal_hit_tokens"] == 0
    assert np.mean([r.num_prompt_tokens for r in reqs]) == pytest.approx(100, rel=0.06)


def test_output_lengths_are_capped_by_max_tokens(build):
    reqs = build(
        gen(
            {"kind": "unique", "prompt": 10},
            count=2000,
            output={"dist": "lognormal", "mean": 100, "sigma": 1.0},
            max_tokens=150,
        )
    )
    assert all(r.max_tokens == 150 and 1 <= r.output_len <= 150 for r in reqs)
    assert any(r.output_len == 150 for r in reqs)
    free = build(
        gen({"kind": "unique", "prompt": 10}, count=2000, output={"dist": "lognormal", "mean": 100, "sigma": 0.5})
    )
    assert all(r.max_tokens == r.output_len for r in free)
    assert np.mean([r.output_len for r in free]) == pytest.approx(100, rel=0.04)


def test_shared_system_prompts_follow_zipf_and_share_blocks(build):
    structure = {"kind": "shared_system", "system": {"num_prompts": 5, "length": 100, "zipf": 1.2}, "user_len": 40}
    reqs = build(gen(structure, count=4000))
    picks = Counter(r.metadata["system_prompt"] for r in reqs)
    expected = zipf_probabilities(5, 1.2)
    for k in range(5):
        assert picks[k] / 4000 == pytest.approx(expected[k], abs=0.02)
    by_prompt = {}
    for r in reqs[:200]:
        by_prompt.setdefault(r.metadata["system_prompt"], []).append(hashes(r))
    for group in by_prompt.values():
        for h in group[1:]:
            assert h[:6] == group[0][:6]  # 100 // 16 = 6 full system blocks
            assert h[6] != group[0][6]  # block 6 mixes in the unique user message
    firsts = [g[0][0] for g in by_prompt.values()]
    assert len(set(firsts)) == len(firsts)


def test_multi_turn_prompt_is_previous_prompt_plus_answer_plus_message(build):
    structure = {
        "kind": "multi_turn",
        "turns": {"dist": "uniform", "low": 2, "high": 4},
        "first_len": 70,
        "user_len": {"dist": "uniform", "low": 5, "high": 30},
        "think_time": {"dist": "fixed", "value": 30.0},
    }
    reqs = build(gen(structure, count=30, output={"dist": "uniform", "low": 3, "high": 40}))
    by_id = {r.request_id: r for r in reqs}
    convs = Counter(r.metadata["conversation"] for r in reqs)
    assert set(convs.values()) <= {2, 3, 4} and len(convs) == 30
    checked = 0
    for r in reqs:
        parent = r.metadata["parent"]
        if parent is None:
            assert r.metadata["turn"] == 1
            continue
        prev = by_id[parent]
        assert r.arrival_time == pytest.approx(prev.arrival_time + 30.0)
        # Content: the previous prompt, then exactly what the previous turn generated.
        assert r.prompt[: len(prev.prompt)] == prev.prompt
        assert r.prompt[len(prev.prompt)] == StreamSegment(output_stream(parent), 0, prev.output_len)
        # Blocks: every full block the previous turn holds after decoding (prompt + answer)
        # hash-matches this turn's prompt.
        prev_h = hashes(prev, with_output=True)
        cur_h = hashes(r)
        assert len(prev_h) == (prev.num_prompt_tokens + prev.output_len) // B
        assert cur_h[: len(prev_h)] == prev_h
        checked += 1
    assert checked >= 30


def test_multi_turn_ideal_hits_include_the_previous_answer(build):
    # Turn 2 = 64-token message + 32-token answer + 20-token message = 116 tokens.
    structure = {"kind": "multi_turn", "turns": 2, "first_len": 64, "user_len": 20, "think_time": 10.0}
    reqs = build(gen(structure, count=1, output=32))
    hits = workload_stats(reqs, B)
    # Turn 1 caches floor((64 + 32 - 1) / 16) = 5 blocks; turn 2 looks up (116 - 1) // 16 = 7 -> hits 5.
    assert hits["ideal_hit_tokens"] == 5 * B


def test_fanout_branches_share_the_context(build):
    structure = {
        "kind": "fanout",
        "context_len": 200,
        "branches": {"dist": "uniform", "low": 2, "high": 5},
        "branch_len": 30,
        "spacing": 0.5,
    }
    reqs = build(gen(structure, count=20))
    tasks = {}
    for r in reqs:
        tasks.setdefault(r.metadata["task"], []).append(r)
    assert len(tasks) == 20
    for branches in tasks.values():
        branches.sort(key=lambda r: r.metadata["branch"])
        assert 2 <= len(branches) <= 5
        ctx = hashes(branches[0])[:12]  # 200 // 16 = 12
        for j, b in enumerate(branches):
            assert b.arrival_time == pytest.approx(branches[0].arrival_time + 0.5 * j)
            h = hashes(b)
            assert h[:12] == ctx and len(h) == 230 // B
        assert len({tuple(hashes(b)) for b in branches}) == len(branches)


def test_rag_picks_distinct_documents_in_random_order(build):
    structure = {"kind": "rag", "num_documents": 4, "doc_len": 64, "docs_per_prompt": 2, "query_len": 10}
    reqs = build(gen(structure, count=3000))
    firsts = Counter()
    for r in reqs:
        docs = r.metadata["documents"]
        assert len(set(docs)) == 2
        assert [s.stream for s in r.prompt[:2]] == [f"gen:doc{d}" for d in docs]
        firsts[docs[0]] += 1
    for d in range(4):
        assert firsts[d] / 3000 == pytest.approx(0.25, abs=0.03)
    # Two prompts with the same leading document share its 4 blocks, and no more unless
    # the second document is also the same.
    a, b = [r for r in reqs if r.metadata["documents"][0] == 0][:2]
    ha, hb = hashes(a), hashes(b)
    assert ha[:4] == hb[:4]
    assert (ha[4] == hb[4]) == (a.metadata["documents"][1] == b.metadata["documents"][1])


def test_same_seed_same_workload_and_different_seed_differs(build):
    structure = {
        "kind": "rag",
        "num_documents": 50,
        "doc_len": {"dist": "uniform", "low": 10, "high": 90},
        "docs_per_prompt": 3,
        "zipf": 1.0,
        "query_len": 10,
    }
    a = build(gen(structure, count=50), seed=3)
    b = build(gen(structure, count=50), seed=3)
    c = build(gen(structure, count=50), seed=4)

    def key(reqs):
        return [(r.request_id, r.arrival_time, r.prompt, r.output_len) for r in reqs]

    assert key(a) == key(b)
    assert key(a) != key(c)
