"""The speed layer's quiet horizons (sim.accel.quiet) decide exactly what the plain manager decides.

A :class:`QuietKVCacheManager` and the core's plain :class:`KVCacheManager` run
the same random operations. After every operation their tables, free queues, events, Mamba bookkeeping
and held-block counters must be identical.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.kv import make_request

from sim.accel import QuietKVCacheManager
from sim.core.kv.kv_cache_manager import KVCacheManager, check_invariants
from sim.core.kv.single_type_kv_cache_manager import MambaManager
from sim.core.kv.specs import kv_cache_config_from_groups
from sim.core.request import RequestStatus

LAYOUTS = [
    ["full_attention", "mamba"],
    ["full_attention", {"type": "mamba", "prefill_checkpoints": True}],
    ["full_attention", "mamba", "mamba"],
    # One common block size given per group: the layer applies (block 32).
    [{"type": "full_attention", "block_size": 32}, {"type": "mamba", "block_size": 32}],
    [{"type": "mamba", "prefill_checkpoints": True}, "full_attention", {"type": "mamba", "prefill_checkpoints": True}],
    # Replica groups (sim.accel.replicas): Nemotron-H's shape, and two classes next to each other.
    [*[{"type": "mamba", "prefill_checkpoints": True}] * 4, "full_attention"],
    [
        "mamba",
        {"type": "mamba", "prefill_checkpoints": True},
        "full_attention",
        "mamba",
        {"type": "mamba", "prefill_checkpoints": True},
    ],
]
#: Mixed block sizes, sliding windows: the quiet rules do not cover them, the build takes the counting manager.
UNSUPPORTED = [
    [{"type": "full_attention", "block_size": 32}, {"type": "mamba", "prefill_checkpoints": True}],
    ["full_attention", {"type": "sliding_window", "window": 64, "block_size": 32}],
]
op = st.one_of(
    st.tuples(st.just("add"), st.sampled_from(["a", "b"]), st.integers(1, 70), st.integers(1, 40)),
    st.tuples(st.just("step"), st.integers(0, 7), st.sampled_from([1, 1, 1, 2, 5, 16, 17, 40])),
    st.tuples(st.just("free"), st.integers(0, 7)),
    st.tuples(st.just("new_step")),
    # A forced eviction drops one block's entry (the horizon's cache bound counts the request's own keys).
    st.tuples(st.just("evict"), st.integers(0, 29)),
)


def _state(m):
    pool = m.block_pool
    out = [pool.free_block_queue.block_ids(), [tuple(e) for e in m.take_events()]]
    for mgr in m.coordinator.single_type_managers:
        out.append(sorted((rid, [b.block_id for b in t]) for rid, t in mgr.req_to_blocks.items()))
        out.append(sorted(mgr.num_cached_block.items()))
        out.append(mgr.num_held_blocks())
        if isinstance(mgr, MambaManager):
            out.append(sorted(mgr.last_state_block_idx.items()))
            out.append(sorted(mgr.num_retired_blocks.items()))
            out.append(sorted(mgr.checkpoints.items()))
    return out


@settings(max_examples=80, deadline=None)
@given(layout=st.sampled_from(LAYOUTS), retention=st.sampled_from([None, 0, 32]), ops=st.lists(op, max_size=60))
def test_quiet_path_matches_full_path(layout, retention, ops):
    _run_against_plain(layout, retention, ops)


@pytest.mark.parametrize("layout", UNSUPPORTED, ids=str)
def test_unsupported_layouts_are_refused_and_built_plain(layout):
    config = kv_cache_config_from_groups(layout, block_size=16, num_blocks=30)
    assert not QuietKVCacheManager.supports(config)
    with pytest.raises(ValueError, match="quiet horizons need"):
        QuietKVCacheManager(config)


def _managers(layout, retention):
    config = kv_cache_config_from_groups(layout, block_size=16, num_blocks=30, retention_interval=retention)
    assert QuietKVCacheManager.supports(config)
    return QuietKVCacheManager(config), KVCacheManager(config)


def _run_against_plain(layout, retention, ops):
    fast, ref = _managers(layout, retention)
    hbs = fast.kv_cache_config.hash_block_size
    waiting, running = [], []
    counter = 0
    for o in ops:
        if o[0] == "add":
            _, stream, n, out = o
            pair = tuple(make_request(f"r{counter}", (stream, n), block_size=hbs, max_tokens=out) for _ in range(2))
            waiting.append(pair)
            counter += 1
        elif o[0] == "step":
            _, idx, chunk = o
            if waiting and (idx % 2 == 0 or not running):
                pair = waiting[idx % len(waiting)]
                results = []
                for m, req in zip((fast, ref), pair):
                    blocks, hit, spb = m.get_computed_blocks(req)
                    req.shared_prefix_boundary = spb
                    n = min(chunk, req.num_tokens - hit)
                    got = m.allocate_slots(req, n, hit, blocks, full_sequence_must_fit=True)
                    results.append(None if got is None else got.get_block_ids())
                    if got is not None:
                        req.status = RequestStatus.RUNNING
                        req.num_computed_tokens = hit + n
                assert results[0] == results[1]
                if results[0] is not None:
                    waiting.remove(pair)
                    running.append(pair)
            elif running:
                pair = running[idx % len(running)]
                results = []
                for m, req in zip((fast, ref), pair):
                    if req.num_computed_tokens == req.num_tokens:
                        if req.num_output_tokens >= req.max_tokens:
                            results.append("done")
                            continue
                        req.append_output_tokens(1)
                    n = min(chunk, req.num_tokens - req.num_computed_tokens)
                    got = m.allocate_slots(req, n)
                    results.append(None if got is None else got.get_block_ids())
                    if got is not None:
                        req.num_computed_tokens += n
                assert results[0] == results[1]
        elif o[0] == "free" and running:
            pair = running.pop(o[1] % len(running))
            fast.free(pair[0])
            ref.free(pair[1])
        elif o[0] == "new_step":
            fast.new_step_starts()
            ref.new_step_starts()
        elif o[0] == "evict":
            fast.evict_blocks([o[1]])
            ref.evict_blocks([o[1]])
        assert _state(fast) == _state(ref)
        check_invariants(fast)


def _bounds(m, rid):
    h = m.quiet.get(rid)
    return h.max_main_tokens, h.max_processed_tokens


def test_quiet_path_skips_decode_inside_held_blocks():
    """Once the full path has retired the skipped Mamba slots, decode tokens inside
    the held blocks take the shortcut: no blocks returned, tables untouched."""
    m = QuietKVCacheManager(kv_cache_config_from_groups(["full_attention", "mamba"], block_size=16, num_blocks=20))
    req = make_request("r", ("a", 20), max_tokens=8)
    got = m.allocate_slots(req, 20, 0, None)
    assert got.get_block_ids() == ([1, 2], [0, 3])
    req.status = RequestStatus.RUNNING
    req.num_computed_tokens = 20
    req.append_output_tokens(1)
    assert _bounds(m, "r") == (31, 16)  # cache bound 2 * 16 - 1; Mamba slot 0 not yet retired
    assert m.allocate_slots(req, 1) is m.empty_kv_cache_blocks  # full path: retires slot 0
    assert _bounds(m, "r") == (31, 32)  # slot 1 (the state being written) retires past 32
    req.num_computed_tokens = 21
    req.append_output_tokens(1)
    assert m.allocate_slots(req, 1) is m.empty_kv_cache_blocks
    assert m.get_block_ids("r") == ([1, 2], [0, 3])
