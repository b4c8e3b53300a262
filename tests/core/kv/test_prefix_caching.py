"""vLLM's test_prefix_caching.py scenarios, with expectations re-derived from vLLM 0.33's code."""

from __future__ import annotations

import pytest
from support.kv import ids, make_manager, make_request

from sim.core.kv.block_pool import KVEvent
from sim.core.kv.kv_cache_manager import check_invariants


def test_prefill_full_attention_ids_free_order_and_eviction():
    m = make_manager(["full_attention"], num_blocks=11)
    req0 = make_request("0", ("common", 48), ("u0", 7))
    blocks, hit, boundary = m.get_computed_blocks(req0)
    assert (hit, boundary) == (0, 0) and blocks is m.empty_kv_cache_blocks
    assert ids(m.allocate_slots(req0, 55, 0, blocks)) == ([1, 2, 3, 4],)
    assert [b.block_hash_num_tokens for b in m.coordinator.single_type_managers[0].req_to_blocks["0"]] == [
        16,
        32,
        48,
        None,
    ]
    stored = m.take_events()
    assert [(e.kind, e.block_id, e.request_id) for e in stored] == [("stored", i, "0") for i in (1, 2, 3)]

    req1 = make_request("1", ("common", 48), ("u1", 5))
    blocks, hit, _ = m.get_computed_blocks(req1)
    assert ids(blocks) == ([1, 2, 3],) and hit == 48
    assert ids(m.allocate_slots(req1, 53 - 48, 48, blocks)) == ([5],)
    assert [b.ref_cnt for b in blocks.blocks[0]] == [2, 2, 2]
    assert m.take_events() == []  # hits are never re-stored
    assert m.block_pool.get_num_free_blocks() == 5

    m.free(req0)
    m.free(req1)
    assert m.block_pool.free_block_queue.block_ids() == [5, 4, 6, 7, 8, 9, 10, 3, 2, 1]
    check_invariants(m)

    req2 = make_request("2", ("common", 48), ("u2", 6))
    blocks, hit, _ = m.get_computed_blocks(req2)
    assert ids(blocks) == ([1, 2, 3],) and hit == 48
    assert ids(m.allocate_slots(req2, 6, 48, blocks)) == ([5],)
    assert m.block_pool.get_num_free_blocks() == 6
    m.free(req2)
    assert m.block_pool.free_block_queue.block_ids() == [5, 4, 6, 7, 8, 9, 10, 3, 2, 1]

    req3 = make_request("3", ("other", 160))
    blocks, hit, _ = m.get_computed_blocks(req3)
    assert hit == 0
    assert ids(m.allocate_slots(req3, 160, 0, blocks)) == ([5, 4, 6, 7, 8, 9, 10, 3, 2, 1],)
    events = m.take_events()
    removed = [(e.block_id, e.cause, e.request_id) for e in events if e.kind == "removed"]
    assert removed == [(3, "evict_lru", "3"), (2, "evict_lru", "3"), (1, "evict_lru", "3")]
    assert sum(e.kind == "stored" for e in events) == 10
    check_invariants(m)


def test_full_prompt_hit_is_capped_one_token_short():
    m = make_manager(["full_attention"], num_blocks=11)
    req0 = make_request("0", ("doc", 64))
    m.allocate_slots(req0, 64)
    m.free(req0)
    req1 = make_request("1", ("doc", 64))
    blocks, hit, _ = m.get_computed_blocks(req1)
    assert hit == 48 and ids(blocks) == ([1, 2, 3],)


def test_prefill_hybrid_sliding_window():
    m = make_manager(
        ["full_attention", {"type": "sliding_window", "window": 32}] * 1 + [{"type": "sliding_window", "window": 32}],
        num_blocks=21,
    )
    req0 = make_request("0", ("common", 48), ("u0", 7))
    blocks, hit, _ = m.get_computed_blocks(req0)
    assert hit == 0
    assert ids(m.allocate_slots(req0, 55, 0, blocks)) == ([1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12])
    req1 = make_request("1", ("common", 48), ("u1", 5))
    blocks, hit, boundary = m.get_computed_blocks(req1)
    assert ids(blocks) == ([1, 2, 3], [0, 6, 7], [0, 10, 11])
    assert (hit, boundary) == (48, 0)
    # The skipped SWA block is not touched; the new hit blocks are.
    new = m.allocate_slots(req1, 5, 48, blocks)
    assert ids(new) == ([13], [14], [15])
    assert m.get_block_ids("1") == ([1, 2, 3, 13], [0, 6, 7, 14], [0, 10, 11, 15])
    assert [m.block_pool.blocks[i].ref_cnt for i in (5, 6, 7)] == [1, 2, 2]
    check_invariants(m)


def test_sliding_window_evicted_tail_block_shortens_hit():
    m = make_manager(["full_attention", {"type": "sliding_window", "window": 32}], num_blocks=21)
    req0 = make_request("0", ("common", 64), ("u0", 7))
    m.allocate_slots(req0, 71)  # FA [1..5], SWA [6..10]
    m.free(req0)
    m.evict_blocks({8})  # SWA block 2 of the prompt
    req1 = make_request("1", ("common", 64), ("u1", 3))
    # FA hits 64; SWA scans right to left: blocks 3 hit but block 2 missing breaks the run,
    # blocks 1 and 0 form a 2-block run -> hit 32, FA trimmed to it.
    blocks, hit, boundary = m.get_computed_blocks(req1)
    assert ids(blocks) == ([1, 2], [6, 7])
    assert (hit, boundary) == (32, 64)
    _, per_group = m.coordinator.find_longest_cache_hit_per_group(req1.block_hashes, 66)
    assert per_group == (64, 32)


def _seed_hybrid_mamba(m, stream="doc", tokens=64, chunk=16):
    """Prefill ``tokens`` in block-sized chunks as the align-mode scheduler would;
    return the FA ids and the Mamba state ids per boundary."""
    req = make_request("seed", (stream, tokens))
    mamba_ids = []
    done = 0
    while done < tokens:
        m.remove_skipped_blocks(req.request_id, done)
        new = m.allocate_slots(req, chunk)
        mamba_ids.extend(b for b in new.get_block_ids()[1] if b != 0)
        done += chunk
        req.num_computed_tokens = done
    fa_ids = m.get_block_ids(req.request_id)[0]
    m.free(req)
    return fa_ids, mamba_ids


def test_hybrid_mamba_seed_ids_and_free_order():
    m = make_manager(["full_attention", "mamba"], num_blocks=100)
    fa, mamba = _seed_hybrid_mamba(m)
    assert fa == [1, 3, 5, 7]
    assert mamba == [2, 4, 6, 8]
    # Mamba states 2 and 4 were freed while running (cached -> back of queue), then
    # the request frees FA tail-first, then Mamba tail-first.
    q = m.block_pool.free_block_queue.block_ids()
    assert q[-8:] == [2, 4, 7, 5, 3, 1, 8, 6]
    check_invariants(m)


@pytest.mark.parametrize(
    "evict,hits,reconciled,boundary",
    [
        ({5, 7, 4, 6}, (32, 64), 16, 32),  # FA blocks 2-3 and Mamba blocks 1-2 evicted
        ({4, 6, 8}, (64, 16), 16, 64),  # Mamba blocks 1-3 evicted
    ],
)
def test_pr48425_divergence_cache_manager_part(evict, hits, reconciled, boundary):
    m = make_manager(["full_attention", "mamba"], num_blocks=100)
    _seed_hybrid_mamba(m)
    m.evict_blocks(evict)
    removed = [e for e in m.take_events() if e.kind == "removed"]
    assert sorted(e.block_id for e in removed) == sorted(evict)
    assert all(e.cause == "evict_forced" for e in removed)
    req = make_request("r1", ("doc", 80))
    assert m.find_per_group_hits(req) == hits
    blocks, hit, spb = m.get_computed_blocks(req)
    assert (hit, spb) == (reconciled, boundary)
    assert ids(blocks) == ([1], [2])
    c_blocks, local, c_spb, diverged = m.get_computed_blocks_for_connector(req)
    if hits[1] > hits[0]:
        # A group hit deeper than FA: reconciled fallback, no divergence flag.
        assert (ids(c_blocks), local, c_spb, diverged) == (([1], [2]), 16, 32, False)
    else:
        assert (ids(c_blocks), local, c_spb, diverged) == (([1, 3, 5, 7], [2]), 64, 0, True)


def test_mamba_same_step_guard_defers_hit_on_state_cached_this_step():
    m = make_manager(["full_attention", "mamba"], num_blocks=100)
    m.new_step_starts()
    r0 = make_request("r0", ("doc", 40))
    m.allocate_slots(r0, 32)
    r1 = make_request("r1", ("doc", 40))
    blocks, hit, _ = m.get_computed_blocks(r1)
    assert hit == 32
    assert m.allocate_slots(r1, 8, 32, blocks, full_sequence_must_fit=True) is None
    m.new_step_starts()
    assert m.allocate_slots(r1, 8, 32, blocks, full_sequence_must_fit=True) is not None
    check_invariants(m)


def test_mamba_retention_zero_keeps_only_replay_state():
    m = make_manager(["full_attention", "mamba"], num_blocks=100, retention_interval=0)
    fa, mamba = _seed_hybrid_mamba(m, tokens=64)
    stored = [(e.group, e.block_id) for e in m.take_events() if e.kind == "stored"]
    # FA caches every block; Mamba only the state at floor((64-1)/16)*16 = 48 (block 2).
    # Uncached Mamba states freed while running go to the queue front and are reused first.
    assert mamba == [2, 4, 5, 6] and fa == [1, 3, 2, 4]
    assert stored == [(0, 1), (0, 3), (0, 2), (1, 5), (0, 4)]
    req = make_request("r1", ("doc", 80))
    assert m.find_per_group_hits(req) == (64, 48)
    blocks, hit, spb = m.get_computed_blocks(req)
    assert (hit, spb) == (48, 64)
    assert ids(blocks) == ([1, 3, 2], [0, 0, 5])


def test_external_tokens_undercount_raises_like_vllm_and_corrected_refuses():
    for corrected in (False, True):
        m = make_manager(["full_attention", "mamba"], num_blocks=7, corrected_mamba_accounting=corrected)
        req = make_request("r", ("doc", 80))
        if not corrected:
            with pytest.raises(ValueError, match="^Cannot get 1 free blocks from the pool$"):
                m.allocate_slots(req, 16, 0, None, num_external_computed_tokens=64, full_sequence_must_fit=True)
            assert m.get_block_ids("r") == ([1, 2, 3, 4, 6], [0, 0, 0, 5])
        else:
            assert (
                m.allocate_slots(req, 16, 0, None, num_external_computed_tokens=64, full_sequence_must_fit=True) is None
            )
            check_invariants(m)


def test_external_tokens_allocate_two_mamba_blocks_when_room():
    m = make_manager(["full_attention", "mamba"], num_blocks=20)
    req = make_request("r", ("doc", 80))
    new = m.allocate_slots(req, 16, 0, None, num_external_computed_tokens=64, delay_cache_blocks=True)
    assert m.get_block_ids("r") == ([1, 2, 3, 4, 6], [0, 0, 0, 5, 7])
    assert ids(new) == ([6], [7])
    assert m.take_events() == []  # delay_cache_blocks: nothing cached yet
    check_invariants(m)


def test_truncate_computed_blocks_clamps_mamba_only():
    m = make_manager(["full_attention", "mamba"], num_blocks=100)
    _seed_hybrid_mamba(m)
    m.evict_blocks({4, 6, 8})
    req = make_request("r1", ("doc", 80))
    blocks, local, _, _ = m.get_computed_blocks_for_connector(req)
    assert ids(m.truncate_computed_blocks(blocks, 48)) == ([1, 3, 5], [2])
    with pytest.raises(AssertionError, match="num_blocks <= len"):
        m.truncate_computed_blocks(m.get_computed_blocks(req)[0], 48)


def test_reset_prefix_cache_only_when_all_free():
    m = make_manager(["full_attention"], num_blocks=11)
    req = make_request("0", ("doc", 40))
    m.allocate_slots(req, 40)
    m.take_events()
    assert m.reset_prefix_cache() is False
    m.free(req)
    assert m.reset_prefix_cache() is True
    assert m.take_events() == [KVEvent("cleared", -1, -1, 0, "", "reset")]
    assert m.get_computed_blocks(make_request("1", ("doc", 40)))[1] == 0
    check_invariants(m)


def test_no_prefix_cache_never_hits_and_mamba_none_takes_one_block():
    from sim.core.kv.kv_cache_manager import KVCacheManager
    from sim.core.kv.specs import kv_cache_config_from_groups

    cfg = kv_cache_config_from_groups(
        ["full_attention", "mamba"], block_size=16, num_blocks=20, enable_prefix_caching=False, max_model_len=256
    )
    assert cfg.block_sizes == (16, 256) and cfg.scheduler_block_size == 256
    m = KVCacheManager(cfg)
    req = make_request("0", ("doc", 40), block_size=256)
    assert ids(m.allocate_slots(req, 40)) == ([1, 2, 3], [4])
    assert m.take_events() == []
    assert m.get_computed_blocks(req)[1] == 0
    m.free(req)
    assert m.block_pool.free_block_queue.block_ids()[:5] == [4, 3, 2, 1, 5]


@pytest.mark.parametrize("checkpoints", [True, False])
def test_mamba_prefill_checkpoint_block_holds_replay_state(checkpoints):
    m = make_manager(
        ["full_attention", {"type": "mamba", "prefill_checkpoints": checkpoints}], num_blocks=40, retention_interval=0
    )
    req = make_request("r0", ("doc", 100))
    m.allocate_slots(req, 100, full_sequence_must_fit=True)
    stored = [(e.group, e.block_id) for e in m.take_events() if e.kind == "stored"]
    sibling = make_request("r1", ("doc", 100))
    if checkpoints:
        # State at floor(99/16)*16 = 96 exported into reserved block index 5.
        assert m.get_block_ids("r0") == ([1, 2, 3, 4, 5, 6, 7], [0, 0, 0, 0, 0, 8, 9])
        assert stored == [(0, i) for i in range(1, 7)] + [(1, 8)]
        assert m.find_per_group_hits(sibling) == (96, 96)
    else:
        assert m.get_block_ids("r0") == ([1, 2, 3, 4, 5, 6, 7], [0, 0, 0, 0, 0, 0, 8])
        assert stored == [(0, i) for i in range(1, 7)]
        assert m.find_per_group_hits(sibling) == (96, 0)
    check_invariants(m)
