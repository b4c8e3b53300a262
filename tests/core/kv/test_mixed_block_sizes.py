"""Prefix caching with KV-cache groups of different block sizes.

Expectations re-derived by hand from vLLM 0.33 (``kv_cache_coordinator.py``
Hybrid fixed point with ``_cache_hit_alignment_tokens`` = LCM,
``single_type_kv_cache_manager.py`` lookups over ``resolve_block_hashes``,
``block_pool.cache_full_blocks`` keyed by ``BlockHashListWithBlockSize``):
the hash block is the GCD of the group block sizes, group blocks are keyed by
the fine hash at their last hash boundary, hits are aligned down to the LCM.
"""

from __future__ import annotations

import pytest
from support.kv import ids, make_manager, make_request

from sim.core.kv.hash_view import BlockHashesAtBlockSize, block_hashes_at
from sim.core.kv.kv_cache_manager import check_invariants
from sim.core.kv.specs import FullAttentionSpec, MambaSpec, SlidingWindowSpec, kv_cache_config_from_groups
from sim.core.request import RequestStatus

SWA32 = {"type": "sliding_window", "window": 64, "block_size": 32}
FA32 = {"type": "full_attention", "block_size": 32}


def _stored(m, hashes):
    """``(group, block id, index of the stored hash in the fine list)`` of each stored event."""
    events = m.take_events()
    assert all(e.kind == "stored" for e in events)
    return [(e.group, e.block_id, hashes.index(e.block_hash)) for e in events]


# ------------------------------------------------------------------ the view
def test_view_takes_the_last_fine_hash_of_each_block_and_grows_with_the_request():
    req = make_request("r", ("doc", 100))
    fine = req.block_hashes
    assert len(fine) == 6
    view = block_hashes_at(fine, 16, 32)
    assert isinstance(view, BlockHashesAtBlockSize)
    assert [view[i] for i in range(len(view))] == [fine[1], fine[3], fine[5]]
    assert block_hashes_at(fine, 16, 16) is fine
    with pytest.raises(IndexError):
        view[3]
    req.append_output_tokens(28)  # 128 tokens: two more fine hashes, one more coarse block
    assert len(view) == 4 and view[3] == req.block_hashes[7]
    with pytest.raises(ValueError, match="not a multiple"):
        BlockHashesAtBlockSize(fine, 16, 40)


# ----------------------------------------------------------------- layouts
def test_per_group_block_size_key_gives_lcm_scheduler_and_gcd_hash_block():
    c = kv_cache_config_from_groups(["full_attention", SWA32], block_size=16, num_blocks=30)
    assert [g.spec for g in c.groups] == [FullAttentionSpec(16), SlidingWindowSpec(32, 64)]
    assert (c.scheduler_block_size, c.hash_block_size) == (32, 16)
    c = kv_cache_config_from_groups([FA32, {"type": "mamba", "block_size": 16}], block_size=8, num_blocks=30)
    assert [g.spec for g in c.groups] == [FullAttentionSpec(32), MambaSpec(16)]
    assert (c.scheduler_block_size, c.hash_block_size, c.partial_hash_hits_enabled) == (32, 16, False)
    c = kv_cache_config_from_groups(
        ["full_attention", SWA32], block_size=16, num_blocks=30, enable_prefix_caching=False
    )
    assert c.hash_block_size == 32


def test_layouts_vllm_would_give_fine_grained_hits_are_rejected():
    """FA 16 + Mamba 32 (align): hash block 16 < Mamba block and both managers
    support fine-grained lookups, so vLLM 0.33 turns on partial hash hits."""
    with pytest.raises(ValueError, match=r"cache.groups: block sizes \(full_attention=16, mamba=32\).*fine-grained"):
        kv_cache_config_from_groups(
            ["full_attention", {"type": "mamba", "block_size": 32}], block_size=16, num_blocks=30
        )
    # A sliding-window group at a block size other than the GCD keeps vLLM on LCM-aligned hits.
    c = kv_cache_config_from_groups(
        ["full_attention", SWA32, {"type": "mamba", "block_size": 64}], block_size=16, num_blocks=30
    )
    assert (c.scheduler_block_size, c.hash_block_size, c.partial_hash_hits_enabled) == (64, 16, False)
    # Without prefix caching nothing is hashed finer than the scheduler block.
    kv_cache_config_from_groups(["full_attention", SWA32], block_size=16, num_blocks=30, enable_prefix_caching=False)


@pytest.mark.parametrize(
    "item, message",
    [
        (
            {"type": "full_attention", "block_size": 0},
            r"cache.groups\[1\].block_size: must be a positive integer, got 0",
        ),
        ({"type": "sliding_window", "window": 8, "block_size": "16"}, r"cache.groups\[1\].block_size"),
        ({"type": "full_attention", "block": 16}, r"unknown key\(s\) \['block'\].*valid: \['block_size', 'type'\]"),
    ],
)
def test_bad_group_block_size_names_the_key(item, message):
    with pytest.raises(ValueError, match=message):
        kv_cache_config_from_groups(["full_attention", item], block_size=16, num_blocks=30)


def test_mamba_block_size_without_prefix_caching_is_rejected():
    with pytest.raises(ValueError, match=r"cache.groups\[1\].block_size: a Mamba group without prefix caching"):
        kv_cache_config_from_groups(
            ["full_attention", {"type": "mamba", "block_size": 32}],
            block_size=16,
            num_blocks=30,
            enable_prefix_caching=False,
        )


def test_retention_must_be_a_multiple_of_the_lcm():
    with pytest.raises(ValueError, match=r"retention_interval \(48\) must be .* scheduler block size \(32\)"):
        kv_cache_config_from_groups(["full_attention", SWA32], block_size=16, num_blocks=30, retention_interval=48)


# ------------------------------------------------ (a) FA 16 + SWA 32 (window 64)
def test_full_attention_16_sliding_window_32_dense():
    m = make_manager(["full_attention", SWA32], num_blocks=30)
    r0 = make_request("0", ("common", 80), ("u0", 27))  # P = 107
    h = r0.block_hashes
    assert ids(m.allocate_slots(r0, 107)) == ([1, 2, 3, 4, 5, 6, 7], [8, 9, 10, 11])
    # Cached up to the LCM boundary 96: six FA blocks, three SWA blocks keyed by
    # the fine hash at each 32-token block's end (fine indices 1, 3, 5).
    assert _stored(m, h) == [(0, i, i - 1) for i in range(1, 7)] + [(1, 8, 1), (1, 9, 3), (1, 10, 5)]

    # FA matches 80 tokens (5 blocks), aligned down to the LCM: 64; SWA then
    # needs cdiv(63, 32) = 2 contiguous blocks ending at 64.
    r1 = make_request("1", ("common", 80), ("u1", 20))
    blocks, hit, boundary = m.get_computed_blocks(r1)
    assert (ids(blocks), hit, boundary) == (([1, 2, 3, 4], [8, 9]), 64, 0)
    assert m.find_per_group_hits(r1) == (64, 64)
    assert ids(m.allocate_slots(r1, 36, 64, blocks)) == ([12, 13, 14], [15, 16])
    assert m.get_block_ids("1") == ([1, 2, 3, 4, 12, 13, 14], [8, 9, 15, 16])
    # Caching resumes at block 4 (FA) / 2 (SWA) up to 96. Block 12 repeats r0's
    # block 4 content (a duplicate entry, never merged); 13 and 15 are r1's own.
    e = m.take_events()
    assert [(x.group, x.block_id) for x in e] == [(0, 12), (0, 13), (1, 15)]
    assert [x.block_hash for x in e] == [h[4], r1.block_hashes[5], r1.block_hashes[5]]

    # A resend of r0 hits 96 tokens (an LCM multiple): SWA's skipped block is null.
    r2 = make_request("2", ("common", 80), ("u0", 27))
    blocks, hit, boundary = m.get_computed_blocks(r2)
    assert (ids(blocks), hit, boundary) == (([1, 2, 3, 4, 5, 6], [0, 9, 10]), 96, 0)
    check_invariants(m)


def test_full_attention_16_sliding_window_32_retention_zero_leaves_a_junction():
    m = make_manager(["full_attention", SWA32], num_blocks=30, retention_interval=0)
    r0 = make_request("0", ("common", 80), ("u0", 27))
    h = r0.block_hashes
    m.allocate_slots(r0, 107)
    # SWA keeps only the 2-block tail before the replay boundary floor(106 / 32) * 32 = 96.
    assert _stored(m, h) == [(0, i, i - 1) for i in range(1, 7)] + [(1, 9, 3), (1, 10, 5)]
    r1 = make_request("1", ("common", 80), ("u1", 20))
    blocks, hit, boundary = m.get_computed_blocks(r1)
    # FA 80 -> 64; SWA at 64 finds block 1 but not block 0: no hit, junction at 64.
    assert (ids(blocks), hit, boundary) == (([], []), 0, 64)
    assert m.find_per_group_hits(r1) == (64, 0)
    r2 = make_request("2", ("common", 80), ("u0", 27))
    blocks, hit, _ = m.get_computed_blocks(r2)
    assert (ids(blocks), hit) == (([1, 2, 3, 4, 5, 6], [0, 9, 10]), 96)


# ---------------------------------------------------------- (b) FA 32 + Mamba 16
def test_full_attention_32_mamba_16_chunks_states_and_alignment():
    m = make_manager([FA32, "mamba"], num_blocks=30)
    r0 = make_request("0", ("common", 80), ("u0", 27), max_tokens=4)
    h = r0.block_hashes
    assert ids(m.allocate_slots(r0, 48, 0, None, full_sequence_must_fit=True)) == ([1, 2], [0, 0, 3])
    r0.status = RequestStatus.RUNNING
    r0.num_computed_tokens = 48
    # Cached only up to the LCM boundary 32: FA block 0 (fine hash 1); Mamba slots 0-1 are null.
    assert _stored(m, h) == [(0, 1, 1)]

    assert ids(m.allocate_slots(r0, 16)) == ([], [4])
    r0.num_computed_tokens = 64
    # Up to 64: FA block 1 (fine 3); Mamba block 2 (the state at 48, fine 2) and block 3 (state at 64, fine 3).
    assert _stored(m, h) == [(0, 2, 3), (1, 3, 2), (1, 4, 3)]

    assert ids(m.allocate_slots(r0, 43)) == ([5, 6], [0, 0, 7])  # the 48-state block 3 was retired
    r0.num_computed_tokens = 107
    assert m.get_block_ids("0") == ([1, 2, 5, 6], [0, 0, 0, 4, 0, 0, 7])
    assert _stored(m, h) == [(0, 5, 5)]  # up to 96; Mamba slots 4-5 are null
    check_invariants(m)

    r1 = make_request("1", ("common", 80), ("u1", 20))
    blocks, hit, boundary = m.get_computed_blocks(r1)
    assert (ids(blocks), hit, boundary) == (([1, 2], [0, 0, 0, 4]), 64, 0)

    # 63 tokens: FA hits 32. Mamba finds the cached state at 48 but skips it
    # (not a multiple of the LCM 32), then nothing below: the hybrid hit is 0
    # and FA's 32 is the junction.
    r2 = make_request("2", ("common", 63))
    blocks, hit, boundary = m.get_computed_blocks(r2)
    assert (ids(blocks), hit, boundary) == (([], []), 0, 32)
    assert m.find_per_group_hits(r2) == (32, 0)

    m.free(r0)
    # FA tail first (6 uncached to the front; 5, 2, 1 cached to the back), then Mamba (7 front, 4 back).
    assert m.block_pool.free_block_queue.block_ids() == [7, 6, *range(8, 30), 3, 5, 2, 1, 4]
    check_invariants(m)


# ------------------------------------------- three groups: FA 16 + SWA 32 + Mamba 64
def test_three_groups_fixed_point_and_mamba_keyed_at_its_own_block():
    m = make_manager(
        ["full_attention", SWA32, {"type": "mamba", "block_size": 64, "prefill_checkpoints": True}],
        num_blocks=40,
        retention_interval=0,
    )
    r0 = make_request("0", ("common", 150), ("u0", 50))  # P = 200, LCM 64
    h = r0.block_hashes
    got = m.allocate_slots(r0, 200, 0, None, full_sequence_must_fit=True)
    # Mamba: 2 nulls, the checkpoint block (state at 192, slot 2) and the running state.
    assert ids(got) == (list(range(1, 14)), list(range(14, 21)), [0, 0, 21, 22])
    assert m.coordinator.single_type_managers[2].checkpoints == {"0": (192, 2)}
    assert _stored(m, h) == [(0, i, i - 1) for i in range(1, 13)] + [(1, 18, 9), (1, 19, 11), (2, 21, 11)]

    # FA 144 -> 128; SWA has nothing ending at 128 -> 0; the loop re-runs at 0.
    r1 = make_request("1", ("common", 150), ("u1", 50))
    blocks, hit, boundary = m.get_computed_blocks(r1)
    assert (ids(blocks), hit, boundary) == (([], [], []), 0, 128)
    assert m.find_per_group_hits(r1) == (128, 0, 0)

    r2 = make_request("2", ("common", 150), ("u0", 50))
    blocks, hit, boundary = m.get_computed_blocks(r2)
    assert (ids(blocks), hit, boundary) == ((list(range(1, 13)), [0, 0, 0, 0, 18, 19], [0, 0, 21]), 192, 0)
    check_invariants(m)
