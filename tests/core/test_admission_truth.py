"""The admission truth checker: verdicts, taint propagation, taint cleared on eviction."""

from __future__ import annotations

from sim.connector import ScriptedConnector
from sim.core.admission import AdmissionAttempt
from sim.core.admission_truth import make_truth_checker
from sim.core.kv.hashing import RequestBlockHasher
from sim.core.kv.kv_cache_manager import KVCacheManager
from sim.core.kv.specs import kv_cache_config_from_groups
from sim.core.policy.prefix import PrefixLookup
from sim.core.request import Request
from sim.core.tokens import StreamSegment

B = 16


def _req(rid: str, tokens: int = 80) -> Request:
    r = Request(rid, [StreamSegment("doc", 0, tokens)], max_tokens=1)
    r.set_block_hasher(RequestBlockHasher(B))
    return r


def _cache_each(kv, hashes, per_group):
    """Cache block ``i`` of the document in group ``gid`` for every ``i`` of ``per_group[gid]``, each in
    its own free block; returns ``{(gid, i): block}``."""
    pool = kv.block_pool
    out = {}
    for gid, idxs in enumerate(per_group):
        for i in idxs:
            blk = pool.get_new_blocks(1)[0]
            pool.cache_full_blocks("seed", [pool.null_block] * i + [blk], hashes, i, i + 1, B, gid)
            pool.free_blocks([blk])
            out[gid, i] = blk
    return out


def _seeded(fa_blocks, mamba_states):
    """FA + Mamba pool; the document's FA blocks / Mamba states are cached (each in its own block)."""
    kv = KVCacheManager(
        kv_cache_config_from_groups(
            ["full_attention", "mamba"], block_size=B, num_blocks=40, mamba_cache_mode="align", retention_interval=None
        )
    )
    return kv, _cache_each(kv, _req("probe").block_hashes, (fa_blocks, mamba_states))


def _admit(kv, request, blocks, local, ext=0, hits=(0, 0), kind="first", load_async=False):
    lookup = PrefixLookup(kv.create_kv_cache_blocks(blocks), local, 0, False)
    return AdmissionAttempt(
        request=request,
        kind=kind,
        hits=hits,
        blocks=lookup.blocks,
        lookup=lookup,
        local=local,
        ext=ext,
        load_async=load_async,
    )


def test_consistent_claim_is_ok_and_a_shallower_one_is_recompute():
    kv, b = _seeded((0, 1, 2), (0, 2))
    check = make_truth_checker(kv)
    null = kv.block_pool.null_block
    assert check(_admit(kv, _req("a"), ([b[0, 0], b[0, 1], b[0, 2]], [null, null, b[1, 2]]), 48, hits=(48, 48))) == (
        "ok",
        0,
        "",
    )
    # Resuming at 16 although FA runs to 48 and a Mamba state sits at 48: 32 tokens recomputed.
    assert check(_admit(kv, _req("b"), ([b[0, 0]], [b[1, 0]]), 16, hits=(48, 48))) == ("recompute", 32, "")


def test_unbacked_fa_and_missing_mamba_state_are_corrupt():
    kv, b = _seeded((0, 1), (0, 3))
    check = make_truth_checker(kv)
    null = kv.block_pool.null_block
    # #44243: local 64 with only FA blocks 0-1.
    assert (
        check(_admit(kv, _req("a"), ([b[0, 0], b[0, 1]], [null, null, null, b[1, 3]]), 64, hits=(32, 64)))[0]
        == "corrupt"
    )
    assert check.bad["a"] == ("a", 32)
    # #45804: local 32 with the Mamba list cut to nulls.
    assert check(_admit(kv, _req("c"), ([b[0, 0], b[0, 1]], [null, null]), 32, hits=(32, 64)))[0] == "corrupt"
    assert check.bad["c"] == ("c", 32)


def test_a_connector_answer_supplies_the_mamba_state_unless_it_opts_out():
    kv, b = _seeded((0, 1), (0,))
    null = kv.block_pool.null_block
    blocks = ([b[0, 0], b[0, 1]], [null, null])
    assert (
        make_truth_checker(kv, ScriptedConnector())(_admit(kv, _req("a"), blocks, 32, ext=16, hits=(32, 16)))[0] == "ok"
    )
    conn = ScriptedConnector()
    conn.supplies_mamba_state = False
    assert make_truth_checker(kv, conn)(_admit(kv, _req("a"), blocks, 32, ext=16, hits=(32, 16)))[0] == "corrupt"


def test_connector_candidate_counts_as_the_best_valid_boundary():
    kv, b = _seeded((0, 1, 2, 3), (0,))
    conn = ScriptedConnector(matched_tokens={"a": 16})
    got = make_truth_checker(kv, conn)(_admit(kv, _req("a", 96), ([b[0, 0]], [b[1, 0]]), 16, ext=16, hits=(64, 16)))
    assert got == ("recompute", 48, "")  # shown the FA hit (64) it would answer 16: resume at 80, not 32


def test_taint_is_set_beyond_the_bad_point_propagates_and_ends_with_eviction():
    kv, b = _seeded((0, 1), (0, 3))
    pool = kv.block_pool
    check = make_truth_checker(kv)
    null = pool.null_block
    hashes = _req("probe").block_hashes
    check(_admit(kv, _req("a"), ([b[0, 0], b[0, 1]], [null, null, null, b[1, 3]]), 64, hits=(32, 64)))
    fresh = pool.get_new_blocks(3, "a")
    for i, blk in zip((1, 2, 3), fresh):  # what "a" caches later: FA blocks 1 (clean: ends at 32), 2, 3
        pool.cache_full_blocks("a", [null] * i + [blk], hashes, i, i + 1, B, 0)
    assert [blk.taint for blk in fresh] == [None, "a", "a"]
    other = pool.get_new_blocks(1, "x")[0]
    pool.cache_full_blocks("x", [null] * 4 + [other], hashes, 4, 5, B, 0)
    assert other.taint is None  # only the corrupt request's blocks
    # A later admission reusing a tainted block is corrupt with the origin; it becomes a carrier of "a".
    got = check(_admit(kv, _req("z"), ([b[0, 0], b[0, 1], fresh[1]], [null, null, b[1, 3]]), 48, hits=(48, 48)))
    assert got == ("corrupt", 0, "a")
    assert check.bad["z"] == ("a", 32)
    # Eviction of the cache entry ends the taint.
    pool.free_blocks(fresh)
    pool.evict_blocks([fresh[1].block_id])
    assert fresh[1].taint is None and fresh[2].taint == "a"


def test_readmission_forgets_the_old_bad_point_and_async_resume_repeats_the_verdict():
    kv, b = _seeded((0, 1), (0,))
    check = make_truth_checker(kv, ScriptedConnector())
    null = kv.block_pool.null_block
    r = _req("a")
    assert check(_admit(kv, r, ([b[0, 0], b[0, 1]], [null, null]), 32, hits=(32, 16), load_async=False))[0] == "corrupt"
    assert "a" in check.bad
    got = check(_admit(kv, r, ([b[0, 0]], [b[1, 0]]), 16, ext=16, hits=(32, 16), load_async=True))
    assert got == ("ok", 0, "") and "a" not in check.bad
    resume = AdmissionAttempt(request=r, kind="after_async_load", hits=(0, 0), blocks=kv.empty_kv_cache_blocks)
    assert check(resume) == ("ok", 0, "")


def _seeded_swa(fa_blocks, swa_blocks, window=32):
    """FA + sliding-window pool; the document's FA / SWA blocks are cached (each in its own block)."""
    kv = KVCacheManager(
        kv_cache_config_from_groups(
            ["full_attention", {"type": "sliding_window", "window": window}],
            block_size=B,
            num_blocks=40,
            retention_interval=None,
        )
    )
    return kv, _cache_each(kv, _req("probe", 160).block_hashes, (fa_blocks, swa_blocks))


def test_sliding_window_reads_only_the_window_of_the_resume_boundary():
    """The rule: to continue at b = local + external a W=32 window reads [b - 31, b);
    the connector writes [local, b); only the rest must be resident."""
    kv, b = _seeded_swa(range(5), (2, 3))
    null = kv.block_pool.null_block
    fa = [b[0, i] for i in range(5)]
    conn = ScriptedConnector()
    # No external tokens, b = 64: blocks 2-3 (positions 32-63) read and resident: ok.
    assert make_truth_checker(kv, conn)(
        _admit(kv, _req("a", 160), (fa[:4], [null, null, b[1, 2], b[1, 3]]), 64, hits=(80, 64))
    )[:2] == ("ok", 0)
    # Block 3 missing (a real unbacked case): corrupt at position 48.
    check = make_truth_checker(kv, conn)
    assert check(_admit(kv, _req("c", 160), (fa[:4], [null, null, b[1, 2], null]), 64, hits=(80, 64)))[0] == "corrupt"
    assert check.bad["c"] == ("c", 48)
    # With 16 external tokens, b = 80: block 2 is out of the window, block 4 is written by the
    # connector; block 3 is still read from the cache.
    assert make_truth_checker(kv, conn)(
        _admit(kv, _req("d", 160), (fa[:4], [null, null, null, b[1, 3]]), 64, ext=16, hits=(80, 64))
    )[:2] == ("ok", 0)
    check = make_truth_checker(kv, conn)
    assert (
        check(_admit(kv, _req("e", 160), (fa[:4], [null, null, b[1, 2], null]), 64, ext=16, hits=(80, 64)))[0]
        == "corrupt"
    )
    assert check.bad["e"] == ("e", 48)


SWA_EXTERNAL = """
name: swa-external-window
clock: steps
cache: {block_size: 16, num_blocks: 15, retention_interval: null, groups: [full_attention, {type: sliding_window, window: 32}]}
scheduler: {max_num_seqs: 4, max_num_batched_tokens: 8192, prefix_policy: pr48425}
connector: {type: scripted, matched_tokens: {r1: 32}}
workload:
  requests:
    - {id: r0, at: 0, prompt: [{content: doc, tokens: 96}], max_tokens: 1}
    - {id: r1, at: 1, prompt: [{content: doc, tokens: 160}], max_tokens: 1}
"""


def test_valid_sliding_window_admission_with_external_tokens_is_ok():
    """vLLM 0.33's decisions for this run, from its real Scheduler on CPU (hand-built
    KVCacheConfig, a MockKVConnector-like connector answering 32, fabricated output):
    r1's lookup claims FA [1..6] and SWA [0, 0, 0, 0, 11, 12]; the connector is asked at
    96 and answers 32, so b = 128 and the window reads [97, 128), all external.
    allocate_slots leaves SWA hits 0-5 untouched (out of the window of 128) and, in a
    pool of 14 usable blocks, evicts and reuses them in the same allocation: removed
    10, 9, 8, 7, 12, 11; r1's tables end as FA [1..6, 13, 14, 8, 7] and SWA
    [0 x 6, 10, 9, 12, 11]. The reused claimed blocks 11 and 12 are not read, so the
    admission is valid: ``ok`` (it was ``corrupt`` when the window was checked before
    ``local``)."""
    import sim
    from sim.config import scenario_from_text

    result = sim.run(scenario_from_text(SWA_EXTERNAL, "swa-external-window.yaml"))
    adm = result.admissions.set_index("request_id")
    assert (adm.loc["r1", "local_tokens"], adm.loc["r1", "external_tokens"]) == (96, 32)
    assert (adm.loc["r1", "outcome"], adm.loc["r1", "tokens_lost"]) == ("ok", 0)
    ev = result.kv_events[result.kv_events["step"] == 1]
    removed = ev[ev["kind"] == "removed"]
    assert list(removed["block_id"]) == [10, 9, 8, 7, 12, 11]
    stored = ev[ev["kind"] == "stored"]
    assert list(zip(stored["group"], stored["block_id"])) == [
        (0, 13),
        (0, 14),
        (0, 8),
        (0, 7),
        (1, 10),
        (1, 9),
        (1, 12),
        (1, 11),
    ]


def test_prefix_caching_off_with_a_mamba_group_runs_and_nothing_is_resident(tmp_path) -> None:
    # Regression: with caching off the Mamba group's block is max_model_len, the hash granularity no
    # longer divides the FA block size, and the checker (and an evict action) raised ValueError.
    from sim.api import run_scenario
    from sim.config import load_scenario

    path = tmp_path / "nocache.yaml"
    path.write_text(
        "name: nocache\nclock: steps\n"
        "cache: {block_size: 16, num_blocks: 40, groups: [full_attention, mamba], enable_prefix_caching: false}\n"
        "scheduler: {prefix_policy: pr48425}\n"
        "workload:\n  requests:\n"
        "    - {id: r0, at: 0, prompt: [{content: doc, tokens: 40}], max_tokens: 2}\n"
        "    - {id: r1, at: 3, prompt: [{content: doc, tokens: 40}], max_tokens: 2}\n"
        "actions:\n  - {at: 2, evict: {prefix_of: r0, group: full_attention, blocks: [0]}}\n"
    )
    result = run_scenario(load_scenario(path))
    adm = result.admissions
    assert list(adm["outcome"]) == ["ok", "ok"] and list(adm["local_tokens"]) == [0, 0]
    assert result.summary["status"] == "complete"
    # Nothing was cached, so nothing is stored or evicted (vLLM's evict_blocks finds no entry either).
    assert result.kv_events.empty
