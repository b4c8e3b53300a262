"""Reusing a waiting request's prefix lookup (``Scheduler._prefix_lookup``) decides
exactly what fresh lookups decide.

Two harnesses run the same random workload, one with ``reuse_prefix_lookups``
off; every schedule row, admissions row (all columns) and KV event must match.
A kv-level property pins the premise: while no cache entry under a request's own
hashes was added or removed (``BlockPool.watch_hashes``), a fresh lookup returns
the same blocks and hits, however much the rest of the cache changed.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from support.scheduler import Harness, req

from sim.core.kv.hashing import RequestBlockHasher
from sim.core.kv.manager import KVCacheManager
from sim.core.request import RequestStatus

LAYOUTS = [
    ("full_attention",),
    ("full_attention", "mamba"),
    ("full_attention", {"type": "mamba", "prefill_checkpoints": True}),
]

workload = st.lists(
    st.tuples(st.integers(0, 3), st.sampled_from(["a", "b", "c"]), st.integers(8, 90), st.integers(1, 6)),
    min_size=1,
    max_size=10,
)


def _columns(cols) -> dict:
    return {k: list(v) for k, v in cols.data.items()}


def _run(layout, retention, num_blocks, arrivals, reuse: bool) -> tuple[Harness, int]:
    h = Harness(groups=layout, num_blocks=num_blocks, retention=retention, max_num_batched_tokens=48)
    h.sched.reuse_prefix_lookups = reuse
    calls = 0
    find = h.kv.find_per_group_hits

    def counting(request):
        nonlocal calls
        calls += 1
        return find(request)

    h.kv.find_per_group_hits = counting
    for step in range(40):
        for i, (at, stream, n, out) in enumerate(arrivals):
            if at == step:
                h.add(req(f"r{i}", n, max_tokens=out, content=stream))
        h.run_step()
    return h, calls


@settings(max_examples=40, deadline=None)
@given(
    layout=st.sampled_from(LAYOUTS),
    retention=st.sampled_from([None, 0]),
    num_blocks=st.integers(6, 14),
    arrivals=workload,
)
def test_reused_lookups_match_fresh_lookups(layout, retention, num_blocks, arrivals):
    fast, _ = _run(layout, retention, num_blocks, arrivals, reuse=True)
    ref, _ = _run(layout, retention, num_blocks, arrivals, reuse=False)
    for table in ("schedule", "admissions", "kv_events"):
        assert _columns(getattr(fast.rec, table)) == _columns(getattr(ref.rec, table)), table


def test_head_of_line_retry_reuses_the_lookup():
    """r1 fails to admit for several steps while r0 decodes inside its blocks (no
    cache change): one lookup serves every attempt, and each attempt still has its row."""
    arrivals = [(0, "a", 100, 6), (0, "b", 48, 1)]
    fast, fast_calls = _run(("full_attention",), None, 10, arrivals, reuse=True)
    ref, ref_calls = _run(("full_attention",), None, 10, arrivals, reuse=False)
    rows = fast.admission_rows("step", "request_id", "outcome", "reason")
    assert rows == ref.admission_rows("step", "request_id", "outcome", "reason")
    # Steps 0-1: r0's prefill chunks take the whole budget; then r1 (3 blocks) waits
    # for r0 (7 of 9 blocks) to finish. No cache entry changes meanwhile: one lookup
    # for r0 and one for r1 serve all eight attempts.
    assert rows == [(0, "r0", "ok", "")] + [(s, "r1", "not_admitted", "no_blocks") for s in range(2, 8)] + [
        (8, "r1", "ok", "")
    ]
    assert (fast_calls, ref_calls) == (2, 8)


def test_only_a_failed_attempt_keeps_its_lookup():
    """An admitted request's lookup is dropped and nothing is watched; a request that fails to
    admit (no cache change since its lookup) keeps its lookup and the pool watches its hashes."""
    h = Harness(groups=("full_attention",), num_blocks=10, max_num_batched_tokens=48)
    pool = h.kv.block_pool
    h.add(req("r0", 100, max_tokens=6, content="a"), req("r1", 48, max_tokens=1, content="b"))
    h.run_step()  # r0 admitted; its chunk takes the whole budget, so r1 is not tried
    assert h.sched._last_lookup is None and pool.watched_changed
    h.run_step()
    h.run_step()  # r1 tried: no blocks
    last = h.sched._last_lookup
    assert last is not None and last[0][0] == "r1" and not pool.watched_changed


@settings(max_examples=60, deadline=None)
@given(
    ops=st.lists(
        st.tuples(
            st.sampled_from(["alloc", "free", "decode"]),
            st.integers(0, 5),
            st.sampled_from(["a", "b"]),
            st.integers(1, 80),
        ),
        max_size=40,
    )
)
def test_unwatched_changes_leave_the_lookup_unchanged(ops):
    kv = Harness(groups=("full_attention", "mamba"), num_blocks=12).kv
    assert isinstance(kv, KVCacheManager)
    pool = kv.block_pool
    probes = [req(f"p{i}", n, content=s) for i, (s, n) in enumerate([("a", 70), ("b", 40), ("a", 33)])]
    for p in probes:
        p.set_block_hasher(RequestBlockHasher(kv.hash_block_size))

    def answer(p):
        blocks, hit, boundary = kv.get_computed_blocks(p)
        return (kv.find_per_group_hits(p), blocks.get_block_ids(), hit, boundary)

    running = []
    watched, remembered = probes[0], answer(probes[0])
    pool.watch_hashes(watched.block_hashes)
    compared = 0
    for step, (kind, idx, stream, n) in enumerate(ops):
        generation = pool.cache_generation
        if kind == "alloc":
            r = req(f"r{step}", n, content=stream, max_tokens=3)  # a fresh id per op
            r.set_block_hasher(RequestBlockHasher(kv.hash_block_size))
            blocks, hit, _ = kv.get_computed_blocks(r)
            if kv.allocate_slots(r, r.num_tokens - hit, hit, blocks, full_sequence_must_fit=True) is not None:
                r.status = RequestStatus.RUNNING
                r.num_computed_tokens = r.num_tokens
                running.append(r)
        elif kind == "free" and running:
            kv.free(running.pop(idx % len(running)))
        elif kind == "decode" and running:
            r = running[idx % len(running)]
            r.append_output_tokens(1)
            if kv.allocate_slots(r, 1) is not None:
                r.num_computed_tokens += 1
        kv.new_step_starts()
        if pool.cache_generation == generation:
            assert not pool.watched_changed  # nothing changed at all
        now = answer(watched)
        if not pool.watched_changed:
            assert now == remembered, (step, watched.request_id)
            compared += 1
        # watch another probe from here on (the pool watches one request's hashes at a time)
        watched = probes[(step + 1) % len(probes)]
        remembered = answer(watched)
        pool.watch_hashes(watched.block_hashes)
    assert answer(watched) == remembered and not pool.watched_changed  # a lookup itself changes nothing


def test_watch_sees_a_change_under_its_hashes_in_any_group():
    kv = Harness(groups=("full_attention", "mamba"), num_blocks=12).kv
    pool = kv.block_pool
    probe = req("p", 40, content="a")
    probe.set_block_hasher(RequestBlockHasher(kv.hash_block_size))
    pool.watch_hashes(probe.block_hashes)
    other = req("o", 40, content="b")  # other tokens: its entries are not watched
    other.set_block_hasher(RequestBlockHasher(kv.hash_block_size))
    assert kv.allocate_slots(other, other.num_tokens, full_sequence_must_fit=True) is not None
    assert pool.cache_generation > 0 and not pool.watched_changed
    same = req("s", 40, content="a")  # the probe's tokens: caching them adds entries under its hashes
    same.set_block_hasher(RequestBlockHasher(kv.hash_block_size))
    assert kv.allocate_slots(same, same.num_tokens, full_sequence_must_fit=True) is not None
    assert pool.watched_changed
    pool.watch_hashes(probe.block_hashes)  # re-armed: the flag starts over
    assert not pool.watched_changed
    kv.free(same)
    kv.free(other)
    assert pool.reset_prefix_cache() and pool.watched_changed
