"""The eviction-policy seam of the block pool (sim.core.kv.eviction): what a policy may and may not change."""

from __future__ import annotations

import pytest

from sim.core.kv.block_pool import BlockPool, KVCacheBlock, KVEvent
from sim.core.kv.eviction import (
    EVICT_POLICY_CAUSE,
    EvictionContext,
    PolicyBlockPool,
    make_block_pool,
)
from sim.core.kv.specs import kv_cache_config_from_groups


class Scripted:
    """A policy that evicts the free cached blocks with the given ids, in that order (for seam tests)."""

    name = "scripted"
    mirrors_vllm = False

    def __init__(self, order: list[int]) -> None:
        self.order = order
        self.calls: list[int] = []
        self.cached: list[tuple[int, object]] = []
        self.uncached: list[int] = []
        self.freed: list[list[tuple[int, int]]] = []

    def bind(self, pool, config, context) -> None:
        self.pool = pool

    def on_cached(self, block: KVCacheBlock, parent) -> None:
        self.cached.append((block.block_id, parent))

    def on_uncached(self, block: KVCacheBlock, key) -> None:
        self.uncached.append(block.block_id)

    def on_reset(self) -> None:
        self.cached.clear()

    def on_freed(self, blocks) -> None:
        self.freed.append([(b.block_id, b.ref_cnt) for b in blocks])

    def select(self, num_blocks: int) -> list[KVCacheBlock]:
        self.calls.append(num_blocks)
        free = {b.block_id: b for b in self.pool.free_block_queue if b.block_hash is not None}
        return [free[i] for i in self.order if i in free][:num_blocks]


def _pool(order: list[int], num_blocks: int = 8) -> tuple[PolicyBlockPool, Scripted]:
    config = kv_cache_config_from_groups(["full_attention"], block_size=16, num_blocks=num_blocks)
    policy = Scripted(order)
    pool = make_block_pool(config, True, True, policy, EvictionContext())
    assert isinstance(pool, PolicyBlockPool)
    return pool, policy


def test_lru_is_the_plain_vllm_pool():
    config = kv_cache_config_from_groups(["full_attention"], block_size=16, num_blocks=8)
    assert type(make_block_pool(config, True, True, None)) is BlockPool
    # Caching off: no cached block to choose from, so no policy pool either.
    assert type(make_block_pool(config, False, True, Scripted([]))) is BlockPool


def test_uncached_blocks_go_first_then_the_policy_chooses_among_cached():
    pool, policy = _pool([2, 3, 1])
    a, b, c = pool.get_new_blocks(3, "r")
    pool.cache_full_blocks("r", [a, b, c], [11, 22, 33], 0, 3, 16, 0)
    assert policy.cached == [(1, None), (2, 11), (3, 22)]
    pool.touch([b])
    pool.free_blocks([c, b, a])
    # The policy hears the whole call, in order, after the ref counts dropped (b is still held once).
    assert policy.freed == [[(3, 0), (2, 1), (1, 0)]]
    pool.free_blocks([b])
    assert policy.freed[-1] == [(2, 0)]
    assert pool.free_block_queue.block_ids() == [4, 5, 6, 7, 3, 1, 2]
    pool.take_events()
    got = pool.get_new_blocks(5, "x")
    # The four uncached blocks in queue order, then the policy's first choice (LRU would take 3).
    assert [g.block_id for g in got] == [4, 5, 6, 7, 2]
    assert policy.calls == [1]
    assert pool.take_events() == [KVEvent("removed", 0, 2, 22, "x", EVICT_POLICY_CAUSE)]
    assert pool.free_block_queue.block_ids() == [3, 1]
    assert all(g.ref_cnt == 1 for g in got)
    assert pool.get_cached_block(22, [0]) is None and pool.get_cached_block(33, [0]) == [c]


def test_policy_is_not_asked_when_uncached_blocks_suffice_and_hits_are_not_recounted():
    pool, policy = _pool([1])
    a, b = pool.get_new_blocks(2, "r")
    pool.cache_full_blocks("r", [a, b], [11, 22], 0, 2, 16, 0)
    pool.cache_full_blocks("r2", [a, b], [11, 22], 0, 2, 16, 0)  # already keyed: no new entry
    assert policy.cached == [(1, None), (2, 11)]
    pool.free_blocks([b, a])
    pool.get_new_blocks(5, "x")
    assert policy.calls == []


def test_forced_eviction_of_a_free_block_moves_it_to_the_front():
    pool, policy = _pool([1, 2])
    a, b = pool.get_new_blocks(2, "r")
    pool.cache_full_blocks("r", [a, b], [11, 22], 0, 2, 16, 0)
    pool.free_blocks([b, a])
    assert pool.free_block_queue.block_ids() == [3, 4, 5, 6, 7, 2, 1]
    pool.evict_blocks([2])
    assert policy.uncached == [2]
    assert pool.free_block_queue.block_ids() == [2, 3, 4, 5, 6, 7, 1]


def test_a_policy_that_breaks_the_contract_is_caught():
    pool, _ = _pool([])
    a = pool.get_new_blocks(7, "r")
    pool.cache_full_blocks("r", a, [11, 22, 33, 44, 55, 66, 77], 0, 7, 16, 0)
    pool.free_blocks(a)
    with pytest.raises(AssertionError, match="eviction policy returned 0 blocks"):
        pool.get_new_blocks(1)


def test_reset_reaches_the_policy_and_short_pool_raises_like_vllm():
    pool, policy = _pool([1])
    (a,) = pool.get_new_blocks(1, "r")
    pool.cache_full_blocks("r", [a], [11], 0, 1, 16, 0)
    pool.free_blocks([a])
    assert pool.reset_prefix_cache() and policy.cached == []
    with pytest.raises(ValueError, match="^Cannot get 8 free blocks from the pool$"):
        pool.get_new_blocks(8)
