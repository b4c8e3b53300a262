"""The speed layer's entry counters (sim.accel.counters) answer what the core counts in the cached map.

Direct pool sequences, each step compared with the core's count of the same map, including the paths the
engine's runs rarely take (a block keyed again under the key it holds, a refused second key, a shared entry,
a reset with events pending) and the policy pool. The held-block counters are compared with the core's count of the tables in
tests/accel/test_quiet.py and tests/accel/test_replicas.py (and, through the steps table, in
tests/test_fastpath_differential.py).
"""

from __future__ import annotations

import pytest

from sim.accel.counters import CountingBlockPool, CountingPolicyBlockPool, make_counting_block_pool
from sim.core.kv.block_pool import BlockPool
from sim.core.kv.specs import kv_cache_config_from_groups
from sim.core.policy.eviction import create_eviction_policy


def _core_counts(pool: BlockPool) -> list[int]:
    return [BlockPool.num_cached_entries(pool, g) for g in range(3)]


def _counts(pool: BlockPool) -> list[int]:
    return [pool.num_cached_entries(g) for g in range(3)]


@pytest.mark.parametrize("events", [True, False])
@pytest.mark.parametrize("policy", [None, "group_coherent"])
def test_entry_counters_follow_the_cached_map(policy: str | None, events: bool) -> None:
    """Each step against the core's count, with the events taken at some steps and not others (the counters
    fold them when asked and before a take), and with events off (the core's count)."""
    config = kv_cache_config_from_groups(["full_attention", "mamba"], block_size=16, num_blocks=12)
    pool = make_counting_block_pool(config, True, events, create_eviction_policy(policy, {}) if policy else None)
    assert type(pool) is (CountingPolicyBlockPool if policy else CountingBlockPool)
    seen = []

    def check() -> None:
        seen.append(_counts(pool))
        assert _counts(pool) == _core_counts(pool)
        assert isinstance(pool, CountingBlockPool | CountingPolicyBlockPool)
        assert pool.cached_entries_per_group(3) == tuple(_core_counts(pool))

    a, b, c, d = pool.get_new_blocks(4, "r")
    pool.cache_full_blocks("r", [a, b], [11, 22], 0, 2, 16, 0)
    check()
    pool.cache_full_blocks("r", [a, b, c], [11, 22, 33], 0, 3, 16, 0)  # a and b already hold these keys
    pool.take_event_log()
    check()
    with pytest.raises(AssertionError, match="already cached"):
        pool.cache_full_blocks("r", [a], [99], 0, 1, 16, 0)
    check()
    pool.cache_full_blocks("s", [d], [11], 0, 1, 16, 0)  # equal content twice: a shared entry
    pool.cache_partial_block("r", c, 44, 48, 1)  # re-keyed into group 1
    check()
    pool.take_event_log()
    pool.evict_blocks([a.block_id, d.block_id, 7])  # 7 holds no key
    check()
    pool.free_blocks([d, c, b, a])
    pool.get_new_blocks(11, "x")  # every usable block: evicts every cached one
    check()
    assert seen == [[2, 0, 0], [3, 0, 0], [3, 0, 0], [3, 1, 0], [1, 1, 0], [0, 0, 0]]


def test_a_reset_clears_the_counters() -> None:
    pool = CountingBlockPool(6, True, True, hash_block_size=16)
    a, b = pool.get_new_blocks(2, "r")
    pool.cache_full_blocks("r", [a, b], [1, 2], 0, 2, 16, 2)
    assert not pool.reset_prefix_cache() and pool.num_cached_entries(2) == 2  # blocks in use: refused
    pool.free_blocks([b, a])
    assert pool.num_cached_entries(2) == 2
    (extra,) = pool.get_new_blocks(1, "s")
    pool.cache_full_blocks("s", [extra], [3], 0, 1, 16, 1)
    pool.free_blocks([extra])
    assert pool.reset_prefix_cache()
    assert _counts(pool) == _core_counts(pool) == [0, 0, 0]
    (c,) = pool.get_new_blocks(1, "s")
    pool.cache_full_blocks("s", [c], [5], 0, 1, 16, 0)
    assert _counts(pool) == _core_counts(pool) == [1, 0, 0]
