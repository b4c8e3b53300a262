"""``sim.core.kv.fastpath``: the lookup memo answers exactly what a fresh lookup answers.

(The quiet horizons are pinned by ``test_quiet_path.py``; both fast paths
end to end by ``tests/test_fastpath_differential.py``.)
"""

from __future__ import annotations

from sim.core.kv.fastpath import LookupMemo
from sim.core.kv.managers import FullAttentionManager
from sim.core.request import RequestStatus

from support.kv import ids, make_manager, make_request


def _cache_prompt(m, rid: str, stream: str, tokens: int):
    req = make_request(rid, (stream, tokens))
    assert m.allocate_slots(req, tokens, 0, None) is not None
    req.status = RequestStatus.RUNNING
    req.num_computed_tokens = tokens
    return req


def test_memo_answer_equals_fresh_lookup_and_follows_cache_changes():
    fast = make_manager(["full_attention", "mamba"], num_blocks=40)
    plain = make_manager(["full_attention", "mamba"], num_blocks=40, fast_paths=False)
    assert fast.coordinator.lookups.enabled and not plain.coordinator.lookups.enabled
    owners = {m: _cache_prompt(m, "a", "doc", 64) for m in (fast, plain)}
    probe = {m: make_request("p", ("doc", 64), ("tail", 16)) for m in (fast, plain)}

    def answers(m):
        blocks, hit, boundary = m.get_computed_blocks(probe[m])
        return ids(blocks), hit, boundary, m.find_per_group_hits(probe[m])

    assert answers(fast) == answers(plain)
    assert answers(fast)[1] == 64
    # A cache change (freeing keeps entries; evicting drops them) must not be masked by the memo.
    for m in (fast, plain):
        second_fa_block = m.get_block_ids("a")[0][1]
        m.free(owners[m])
        m.evict_blocks([second_fa_block])
    assert answers(fast) == answers(plain)
    assert answers(fast)[1] < 64


def test_memo_hands_out_copies():
    m = make_manager(["full_attention"], num_blocks=20)
    _cache_prompt(m, "a", "doc", 48)
    probe = make_request("p", ("doc", 48), ("x", 16))
    memo = LookupMemo(m.block_pool)
    spec = m.kv_cache_config.groups[0].spec
    first, hit = memo.find_longest_cache_hit(FullAttentionManager, probe.block_hashes, 63, (0,), spec, 16)
    assert hit == 48 and len(first[0]) == 3
    for _ in range(2):  # callers trim in place: neither the first answer nor a remembered one may leak
        del first[0][1:]
        first, hit = memo.find_longest_cache_hit(FullAttentionManager, probe.block_hashes, 63, (0,), spec, 16)
        assert hit == 48 and len(first[0]) == 3


def test_memo_keys_on_the_request_and_on_max_length():
    m = make_manager(["full_attention"], num_blocks=20)
    _cache_prompt(m, "a", "doc", 48)
    memo = LookupMemo(m.block_pool)
    spec = m.kv_cache_config.groups[0].spec
    long_probe = make_request("p", ("doc", 48), ("x", 16))
    other = make_request("q", ("other", 64))
    assert memo.find_longest_cache_hit(FullAttentionManager, long_probe.block_hashes, 63, (0,), spec, 16)[1] == 48
    assert memo.find_longest_cache_hit(FullAttentionManager, long_probe.block_hashes, 32, (0,), spec, 16)[1] == 32
    assert memo.find_longest_cache_hit(FullAttentionManager, other.block_hashes, 63, (0,), spec, 16)[1] == 0
