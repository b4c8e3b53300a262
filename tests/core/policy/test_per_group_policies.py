"""max_per_group (#44243) and trim_to_min (#45804): their gate and the blocks they claim."""

from __future__ import annotations

import pytest

from sim.connector import ScriptedConnector
from sim.core.kv.hashing import RequestBlockHasher
from sim.core.kv.kv_cache_manager import KVCacheManager
from sim.core.kv.specs import kv_cache_config_from_groups
from sim.core.policy.prefix import MaxPerGroupPolicy, TrimToMinPolicy, get_prefix_policy, prefix_policy_names
from sim.core.request import Request
from sim.core.tokens import StreamSegment

B = 16


def _req(rid: str, tokens: int) -> Request:
    r = Request(rid, [StreamSegment("doc", 0, tokens)], max_tokens=1)
    r.set_block_hasher(RequestBlockHasher(B))
    return r


def _cache(groups=("full_attention", "mamba"), fa_blocks=(), mamba_states=()) -> KVCacheManager:
    """A pool where the document's FA blocks ``fa_blocks`` and Mamba states ``mamba_states`` are cached."""
    kv = KVCacheManager(
        kv_cache_config_from_groups(
            list(groups), block_size=B, num_blocks=40, mamba_cache_mode="align", retention_interval=None
        )
    )
    hashes = _req("probe", 80).block_hashes
    pool = kv.block_pool
    cached = {0: set(fa_blocks), 1: set(mamba_states)}
    for gid in range(len(groups)):
        for i in sorted(cached[gid]):
            blk = pool.get_new_blocks(1)[0]
            pool.cache_full_blocks("seed", [pool.null_block] * i + [blk], hashes, i, i + 1, B, gid)
            pool.free_blocks([blk])
    return kv


def _ids(lookup):
    return [[b.block_id for b in g] for g in lookup.blocks.blocks]


def test_both_are_registered():
    assert {"max_per_group", "trim_to_min"} <= set(prefix_policy_names())
    assert isinstance(get_prefix_policy("max_per_group"), MaxPerGroupPolicy)
    assert isinstance(get_prefix_policy("trim_to_min"), TrimToMinPolicy)


def test_max_per_group_mamba_deeper_claims_the_mamba_hit_with_only_the_fa_run():
    # FA blocks 0-1 (ids 1, 2) and Mamba states 0 and 3 (ids 3, 4): per-group hits (32, 64).
    kv = _cache(fa_blocks=(0, 1), mamba_states=(0, 3))
    got = MaxPerGroupPolicy().lookup(kv, _req("r", 80), ScriptedConnector())
    assert (got.local_tokens, got.shared_prefix_boundary, got.hit_diverged) == (64, 0, False)
    assert _ids(got) == [[1, 2], [0, 0, 0, 4]]


def test_max_per_group_fa_deeper():
    kv = _cache(fa_blocks=(0, 1, 2, 3), mamba_states=(0,))
    got = MaxPerGroupPolicy().lookup(kv, _req("r", 80), ScriptedConnector())
    assert got.local_tokens == 64 and not got.hit_diverged
    assert _ids(got) == [[1, 2, 3, 4], [5]]


def test_trim_to_min_drops_the_only_mamba_state():
    # #46453 part 2: [null, null, null, s3] cut to the dense minimum (32) -> [null, null].
    kv = _cache(fa_blocks=(0, 1), mamba_states=(0, 3))
    got = TrimToMinPolicy().lookup(kv, _req("r", 80), ScriptedConnector())
    assert (got.local_tokens, got.shared_prefix_boundary, got.hit_diverged) == (32, 0, False)
    assert _ids(got) == [[1, 2], [0, 0]]


def test_trim_to_min_fa_deeper_keeps_the_fa_hit():
    kv = _cache(fa_blocks=(0, 1, 2, 3), mamba_states=(0,))
    got = TrimToMinPolicy().lookup(kv, _req("r", 80), ScriptedConnector())
    assert got.local_tokens == 64
    assert _ids(got) == [[1, 2, 3, 4], [5]]


@pytest.mark.parametrize("policy", [MaxPerGroupPolicy(), TrimToMinPolicy()])
def test_without_a_connector_they_are_the_reconciled_lookup(policy):
    kv = _cache(fa_blocks=(0, 1), mamba_states=(0, 3))
    got = policy.lookup(kv, _req("r", 80), None)
    assert (got.local_tokens, got.shared_prefix_boundary) == (16, 32)
    assert _ids(got) == [[1], [3]]


@pytest.mark.parametrize("policy", [MaxPerGroupPolicy(), TrimToMinPolicy()])
def test_without_mamba_they_are_the_reconciled_lookup(policy):
    kv = _cache(groups=("full_attention",), fa_blocks=(0, 1, 2))
    got = policy.lookup(kv, _req("r", 80), ScriptedConnector())
    assert got.local_tokens == 48 and _ids(got) == [[1, 2, 3]]


def test_a_zero_prefix_cache_hit_limit_gives_no_hit():
    """vLLM 0.34's ``prefix_cache_hit_limit = 0`` is 0.33's ``skip_reading_prefix_cache``: no lookup at all."""
    kv = _cache(fa_blocks=(0, 1), mamba_states=(0, 3))
    r = _req("r", 80)
    r.prefix_cache_hit_limit = 0
    for policy in (MaxPerGroupPolicy(), TrimToMinPolicy()):
        got = policy.lookup(kv, r, ScriptedConnector())
        assert got.local_tokens == 0 and _ids(got) == [[], []]
    assert kv.get_num_cached_tokens(r) == 0 and r.skip_reading_external_kv


def test_a_prefix_cache_hit_limit_bounds_every_lookup():
    """A limit N (0.34: prompt logprobs from token N) caps the local hit at N and skips external KV."""
    kv = _cache(groups=("full_attention",), fa_blocks=(0, 1, 2))
    r = _req("r", 80)
    assert kv.get_computed_blocks(r)[1] == 48 and kv.get_num_cached_tokens(r) == 48
    assert not r.skip_reading_external_kv
    r.prefix_cache_hit_limit = 20
    assert r.get_max_cache_hit_length() == 20 and r.get_max_cache_hit_length(10) == 10
    assert kv.get_computed_blocks(r)[1] == 16 and r.skip_reading_external_kv
    assert MaxPerGroupPolicy().lookup(kv, r, ScriptedConnector()).local_tokens == 16
    # get_num_cached_tokens probes at num_tokens - 1, as vLLM 0.34's does (the limit is not applied there).
    assert kv.get_num_cached_tokens(r) == 48
