"""BlockPool and free-queue mechanics."""

from __future__ import annotations

import pytest

from sim.core.kv.block_pool import BlockPool, KVEvent


def test_null_block_and_initial_queue():
    pool = BlockPool(6, enable_caching=True, hash_block_size=16)
    assert pool.null_block.block_id == 0 and pool.null_block.is_null
    assert pool.free_block_queue.block_ids() == [1, 2, 3, 4, 5]
    assert pool.get_usage() == 0.0


def test_free_order_touch_and_lazy_eviction():
    pool = BlockPool(6, enable_caching=True, hash_block_size=16)
    a, b, c = pool.get_new_blocks(3, "r")
    pool.cache_full_blocks("r", [a, b, c], [11, 22, 33], 0, 2, 16, 0)
    assert pool.take_events() == [KVEvent("stored", 0, 1, 11, "r", "cache"), KVEvent("stored", 0, 2, 22, "r", "cache")]
    pool.free_blocks([c, b, a])
    assert pool.free_block_queue.block_ids() == [3, 4, 5, 2, 1]
    assert pool.get_cached_block(22, [0]) == [b] and pool.get_cached_block(22, [1]) is None
    pool.touch([b])
    assert b.ref_cnt == 1 and pool.free_block_queue.block_ids() == [3, 4, 5, 1]
    pool.free_blocks([b])
    assert pool.free_block_queue.block_ids() == [3, 4, 5, 1, 2]
    got = pool.get_new_blocks(4, "x")
    assert [g.block_id for g in got] == [3, 4, 5, 1]
    assert pool.take_events() == [KVEvent("removed", 0, 1, 11, "x", "evict_lru")]
    assert pool.get_cached_block(11, [0]) is None and pool.get_cached_block(22, [0]) == [b]
    with pytest.raises(ValueError, match="^Cannot get 2 free blocks from the pool$"):
        pool.get_new_blocks(2)


def test_duplicate_content_is_stored_twice_and_lookup_returns_first():
    pool = BlockPool(5, enable_caching=True, hash_block_size=16)
    a, b = pool.get_new_blocks(2)
    pool.cache_full_blocks("r0", [a], [7], 0, 1, 16, 0)
    pool.cache_full_blocks("r1", [b], [7], 0, 1, 16, 0)
    assert [e.block_id for e in pool.take_events()] == [1, 2]
    assert pool.get_cached_block(7, [0]) == [a]
    pool.evict_blocks([1])
    assert pool.get_cached_block(7, [0]) == [b]
    assert pool.num_cached_entries(0) == 1


def test_forced_eviction_keeps_queue_position_and_clears_taint():
    pool = BlockPool(5, enable_caching=True, hash_block_size=16)
    a, b = pool.get_new_blocks(2)
    pool.cache_full_blocks("r", [a, b], [1, 2], 0, 2, 16, 3)
    a.taint = "r9"
    pool.free_blocks([b, a])
    before = pool.free_block_queue.block_ids()
    pool.take_events()
    pool.evict_blocks({1}, request_id="r", cause="load_error")
    assert pool.free_block_queue.block_ids() == before
    assert a.block_hash is None and a.taint is None
    assert pool.take_events() == [KVEvent("removed", 3, 1, 1, "r", "load_error")]
    with pytest.raises(ValueError, match="outside 0..4"):
        pool.evict_blocks([9])


def test_event_log_keeps_columns_aligned_and_a_take_starts_a_new_log():
    pool = BlockPool(6, enable_caching=True, hash_block_size=16)
    a, b = pool.get_new_blocks(2, "r")
    pool.cache_full_blocks("r", [a, b], [11, 22], 0, 2, 16, 1)
    assert pool.num_pending_events == 2
    log = pool.take_event_log()
    assert pool.num_pending_events == 0 and len(pool.take_event_log()) == 0
    assert (log.kind, log.group, log.block_id, log.block_hash, log.request_id, log.cause) == (
        ["stored", "stored"],
        [1, 1],
        [1, 2],
        [11, 22],
        ["r", "r"],
        ["cache", "cache"],
    )
    # a connector's records join the log after the pool's own, in order; rows() reads them back
    log.extend([KVEvent("stored", 0, -1, 5, "r", "offload_store")])
    assert len(log) == 3
    assert log.rows() == [
        KVEvent("stored", 1, 1, 11, "r", "cache"),
        KVEvent("stored", 1, 2, 22, "r", "cache"),
        KVEvent("stored", 0, -1, 5, "r", "offload_store"),
    ]
    pool.free_blocks([b, a])
    assert pool.reset_prefix_cache()
    assert pool.take_events() == [KVEvent("cleared", -1, -1, 0, "", "reset")]
