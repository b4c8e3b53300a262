"""The pool's bulk operations equal the sequence of single operations they replace.

``BlockPool.free_blocks_groups`` and ``BlockPool.cache_full_blocks_groups`` (used by the
identical-Mamba-groups fast path, sim.core.kv.fastpath) must leave the pool exactly as the
single calls in order would: the same returned counts, ref counts, free-queue order (which
decides future evictions), cache map (entry order included), counters, events and listener calls.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sim.core.kv.pool import BlockPool, KVCacheBlock, KVEvent

NUM_BLOCKS = 20
GROUPS = (0, 1, 2)


def _pool(prelude: list[tuple[int, int, bool]]) -> tuple[BlockPool, list[tuple[KVCacheBlock, str]]]:
    """A pool after a history: take one block per prelude entry, key it (hash, group) or not,
    free the ones marked; a recording listener. Returns the pool and the listener's calls."""
    pool = BlockPool(NUM_BLOCKS, enable_caching=True, hash_block_size=16)
    taken = pool.get_new_blocks(len(prelude), "p")
    for blk, (h, gid, _) in zip(taken, prelude):
        if h:
            pool.cache_full_blocks("p", [blk], [h], 0, 1, 16, gid)
    pool.free_blocks([blk for blk, (_, _, free) in zip(taken, prelude) if free])
    pool.take_events()
    calls: list[tuple[KVCacheBlock, str]] = []
    pool.cache_listener = lambda blk, rid: calls.append((blk, rid))
    return pool, calls


def _state(pool: BlockPool) -> tuple[object, ...]:
    cache_map = {
        gid: {h: (e.block_id if isinstance(e, KVCacheBlock) else list(e)) for h, e in group_map.items()}
        for gid, group_map in pool.cached_block_hash_to_block.items()
    }
    return (
        pool.free_block_queue.block_ids(),
        pool.get_num_free_blocks(),
        [(b.block_id, b.ref_cnt, b.block_hash, b.block_hash_num_tokens) for b in pool.blocks],
        cache_map,
        {gid: pool.num_cached_entries(gid) for gid in GROUPS},
        pool.cache_generation,
        pool.take_events(),
    )


prelude_st = st.lists(
    st.tuples(st.integers(0, 3), st.sampled_from(GROUPS), st.booleans()), min_size=4, max_size=NUM_BLOCKS - 1
)


@settings(max_examples=150, deadline=None)
@given(prelude=prelude_st, data=st.data())
def test_free_blocks_groups_equals_free_blocks_in_order(prelude, data):
    bulk, _ = _pool(prelude)
    single, _ = _pool(prelude)
    owned = [b.block_id for b in bulk.blocks if b.ref_cnt > 0 and not b.is_null]
    twice = data.draw(st.lists(st.sampled_from(owned), unique=True) if owned else st.just([]))
    for pool in (bulk, single):
        pool.touch([pool.blocks[i] for i in twice])
    ids = data.draw(st.permutations(owned + twice + [0]))  # block 0: the null block, skipped
    cuts = sorted(data.draw(st.lists(st.integers(0, len(ids)), max_size=4)))
    chunks = [ids[a:b] for a, b in zip([0, *cuts], [*cuts, len(ids)])]
    counts = bulk.free_blocks_groups([[bulk.blocks[i] for i in chunk] for chunk in chunks])
    expected = [single.free_blocks([single.blocks[i] for i in chunk]) for chunk in chunks]
    assert counts == expected
    assert _state(bulk) == _state(single)
    # The queue decides the next evictions: popping everything evicts in the same order.
    assert [b.block_id for b in bulk.get_new_blocks(bulk.get_num_free_blocks(), "x")] == [
        b.block_id for b in single.get_new_blocks(single.get_num_free_blocks(), "x")
    ]
    assert _state(bulk) == _state(single)


@settings(max_examples=150, deadline=None)
@given(prelude=prelude_st, data=st.data())
def test_cache_full_blocks_groups_equals_cache_full_blocks_per_group(prelude, data):
    bulk, bulk_calls = _pool(prelude)
    single, single_calls = _pool(prelude)
    free_now = bulk.get_num_free_blocks()
    length = data.draw(st.integers(1, 5))
    num_groups = data.draw(st.integers(1, 3))
    hashes = data.draw(st.lists(st.integers(1, 4), min_size=length, max_size=length))
    start = data.draw(st.integers(0, length))
    end = data.draw(st.integers(0, length))
    mask = data.draw(st.none() | st.lists(st.booleans(), min_size=max(end - start, 0), max_size=max(end - start, 0)))
    gids = data.draw(st.lists(st.sampled_from(GROUPS), min_size=num_groups, max_size=num_groups, unique=True))
    # Each group's table: a fresh block, the null block, or (rarely) a fresh block keyed here already.
    kinds = data.draw(
        st.lists(
            st.lists(st.sampled_from(["new", "new", "null", "keyed"]), min_size=length, max_size=length),
            min_size=num_groups,
            max_size=num_groups,
        )
    )
    need = sum(k != "null" for table in kinds for k in table)
    if need > free_now:
        return
    tables: dict[int, list[list[KVCacheBlock]]] = {}
    for pool in (bulk, single):
        fresh = iter(pool.get_new_blocks(need, "r"))
        tables[id(pool)] = []
        for gid, table_kinds in zip(gids, kinds):
            table = []
            for i, kind in enumerate(table_kinds):
                if kind == "null":
                    table.append(pool.null_block)
                    continue
                blk = next(fresh)
                if kind == "keyed":
                    pool.cache_full_blocks("r", [blk], [hashes[i]], 0, 1, (i + 1) * 16, gid)
                table.append(blk)
            tables[id(pool)].append(table)
    bulk_calls.clear()
    single_calls.clear()
    assert _state(bulk)[:-1] == _state(single)[:-1]
    bulk.cache_full_blocks_groups("q", tables[id(bulk)], hashes, start, end, 16, gids, mask)
    for table, gid in zip(tables[id(single)], gids):
        single.cache_full_blocks("q", table, hashes, start, end, 16, gid, mask)
    assert _state(bulk) == _state(single)
    assert [(b.block_id, rid) for b, rid in bulk_calls] == [(b.block_id, rid) for b, rid in single_calls]


def test_free_blocks_groups_queue_order_example():
    """Uncached blocks of a later call go in front of an earlier call's; cached ones behind."""
    pool = BlockPool(8, enable_caching=True, hash_block_size=16)
    a, b, c, d = pool.get_new_blocks(4, "r")
    pool.cache_full_blocks("r", [b, d], [5, 6], 0, 2, 16, 0)
    pool.take_events()
    assert pool.free_blocks_groups([[a, b], [c, d], []]) == [2, 2, 0]
    assert pool.free_block_queue.block_ids() == [c.block_id, a.block_id, 5, 6, 7, b.block_id, d.block_id]
    assert pool.take_events() == []


def test_cache_full_blocks_groups_events_in_group_order():
    pool = BlockPool(8, enable_caching=True, hash_block_size=16)
    a, b, c, d = pool.get_new_blocks(4, "r")
    pool.cache_full_blocks_groups("r", [[a, b], [c, d]], [11, 22], 0, 2, 16, [1, 2], [False, True])
    assert pool.take_events() == [
        KVEvent("stored", 1, b.block_id, 22, "r", "cache"),
        KVEvent("stored", 2, d.block_id, 22, "r", "cache"),
    ]
    assert b.block_hash == (22, 1) and b.block_hash_num_tokens == 32 and a.block_hash is None
    assert pool.num_cached_entries(1) == pool.num_cached_entries(2) == 1
