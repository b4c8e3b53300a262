"""``sim.core.kv.fastpath``: the lookup memo answers exactly what a fresh lookup answers.

(The quiet horizons are pinned by ``test_quiet_path.py``; both fast paths
end to end by ``tests/test_fastpath_differential.py``.)
"""

from __future__ import annotations

from support.kv import ids, make_manager, make_request

from sim.core.kv.fastpath import LookupMemo
from sim.core.kv.managers import FullAttentionManager
from sim.core.request import RequestStatus


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


def test_hit_length_follows_an_eviction_between_two_lookups():
    """The hits-only lookup (the admissions table's per-group hits) must not answer from a memo
    the cache map has moved past: an eviction between two identical lookups changes the hit."""
    m = make_manager(["full_attention"], num_blocks=20)
    owner = _cache_prompt(m, "a", "doc", 48)
    probe = make_request("p", ("doc", 48), ("x", 16))
    memo = LookupMemo(m.block_pool)
    spec = m.kv_cache_config.groups[0].spec
    assert memo.find_hit_length(FullAttentionManager, probe.block_hashes, 63, (0,), spec, 16) == 48
    assert memo.find_hit_length(FullAttentionManager, probe.block_hashes, 63, (0,), spec, 16) == 48
    second = m.get_block_ids("a")[0][1]
    m.free(owner)
    m.evict_blocks([second])
    assert memo.find_hit_length(FullAttentionManager, probe.block_hashes, 63, (0,), spec, 16) == 16
    blocks, hit = memo.find_longest_cache_hit(FullAttentionManager, probe.block_hashes, 63, (0,), spec, 16)
    assert hit == 16 and len(blocks[0]) == 1


def test_hit_length_then_full_lookup_hands_out_a_copy_of_the_kept_lists():
    """``find_hit_length`` keeps the lists it found uncopied; the full lookup that reuses them must
    hand out copies, so a caller trimming its answer in place cannot shorten the next answer."""
    m = make_manager(["full_attention"], num_blocks=20)
    _cache_prompt(m, "a", "doc", 48)
    probe = make_request("p", ("doc", 48), ("x", 16))
    memo = LookupMemo(m.block_pool)
    spec = m.kv_cache_config.groups[0].spec
    scans: list[int] = []
    fresh = FullAttentionManager.find_longest_cache_hit

    class Counting(FullAttentionManager):
        @staticmethod
        def find_longest_cache_hit(*args):
            scans.append(args[1])
            return fresh(*args)

    assert memo.find_hit_length(Counting, probe.block_hashes, 63, (0,), spec, 16) == 48
    for _ in range(2):
        blocks, hit = memo.find_longest_cache_hit(Counting, probe.block_hashes, 63, (0,), spec, 16)
        assert hit == 48 and len(blocks[0]) == 3
        del blocks[0][1:]
    assert memo.find_hit_length(Counting, probe.block_hashes, 63, (0,), spec, 16) == 48
    assert scans == [63]  # one scan: every later answer came from the memo


def test_per_group_hits_equal_the_per_group_lookups_on_both_paths():
    """``find_per_group_hits`` (hits only, through the memo) equals the hits of the plain
    ``find_longest_cache_hit_per_group``, for a hybrid layout whose groups disagree."""
    for fast in (True, False):
        m = make_manager(["full_attention", "mamba"], num_blocks=40, fast_paths=fast)
        req = make_request("a", ("doc", 64))
        assert m.allocate_slots(req, 32, 0, None) is not None  # FA blocks up to 32, a Mamba state at 32
        req.status = RequestStatus.RUNNING
        req.num_computed_tokens = 32
        probe = make_request("p", ("doc", 64), ("x", 32))
        _, plain_hits = m.coordinator.find_longest_cache_hit_per_group(probe.block_hashes, probe.num_tokens - 1)
        assert m.find_per_group_hits(probe) == plain_hits == (32, 32)
        mamba_ids = m.get_block_ids("a")[1]
        m.free(req)
        m.evict_blocks(mamba_ids)  # the state goes, the attention blocks stay: the groups now disagree
        _, plain_hits = m.coordinator.find_longest_cache_hit_per_group(probe.block_hashes, probe.num_tokens - 1)
        assert m.find_per_group_hits(probe) == plain_hits == (32, 0)


# --------------------------------------------------------------------------- the decode cohort


def _cohort_run(fast: bool, schedule: bool) -> tuple[object, list[int]]:
    """Six short requests decode side by side; once (fast path) all six are parked, the token budget
    drops to 3, so the running loop stops after three parked decodes and must unpark the other three
    unscheduled. Returns the harness and, per step, how many decodes were parked after it."""
    import dataclasses

    from support.scheduler import Harness, req

    h = Harness(max_num_batched_tokens=64, max_num_seqs=8, fast_paths=fast)
    h.rec.schedule_enabled = schedule
    h.add(*(req(f"r{i}", 3, max_tokens=40, content=f"c{i}") for i in range(6)))
    members: list[int] = []
    shrunk = False
    while h.sched.has_unfinished_requests():
        if not shrunk and h.step == 4:
            h.sched.config = dataclasses.replace(h.sched.config, max_num_batched_tokens=3)
            shrunk = True
        h.run_step()
        members.append(len(h.sched.cohort.members))
    h.sched.settle()
    return h, members


def test_cohort_budget_cut_unparks_the_rest_and_matches_the_plain_path():
    for schedule in (True, False):
        fast, members = _cohort_run(True, schedule)
        plain, plain_members = _cohort_run(False, schedule)
        assert members[3] == 6, members  # all six parked before the budget drops
        assert members[4] == 3, members  # the cut unparked the three the budget did not reach
        assert not any(plain_members)
        assert fast.finished == plain.finished
        assert fast.schedule_rows() == plain.schedule_rows()
        if schedule:
            steps_of = {}
            for step, rid, *_ in fast.schedule_rows():
                steps_of.setdefault(step, []).append(rid)
            assert steps_of[4] == ["r0", "r1", "r2"]  # the budget's three, in running order


def test_memo_reuses_a_mamba_answer_for_shorter_caps_and_equals_fresh_lookups(monkeypatch):
    """Mamba's answer (the deepest cached state under the cap) is reused for a shorter cap
    that still covers it; every answer equals a fresh lookup, for Mamba and full attention."""
    from sim.core.kv.managers import MambaManager

    m = make_manager(["full_attention", "mamba"], num_blocks=40)
    req = make_request("a", ("doc", 64))
    for chunk in (32, 32):  # Mamba states at 32 and 64
        assert m.allocate_slots(req, chunk, 0, None) is not None
        req.status = RequestStatus.RUNNING
        req.num_computed_tokens += chunk
    probe = make_request("p", ("doc", 64), ("x", 32))
    pool = m.block_pool
    memo = LookupMemo(pool)
    for cls, gid in ((MambaManager, 1), (FullAttentionManager, 0)):
        spec = m.kv_cache_config.groups[gid].spec
        fresh_scan = cls.find_longest_cache_hit
        scans: list[int] = []
        monkeypatch.setattr(cls, "find_longest_cache_hit", lambda *a, f=fresh_scan, s=scans: s.append(a[1]) or f(*a))
        for cap in (95, 80, 64, 63, 40, 32, 20, 95, 10):
            got = memo.find_longest_cache_hit(cls, probe.block_hashes, cap, (gid,), spec, 16)
            want = fresh_scan(probe.block_hashes, cap, (gid,), pool, spec, 16)
            assert (ids_of(got[0]), got[1]) == (ids_of(want[0]), want[1]), (cls.__name__, cap)
        if cls is MambaManager:  # hit 64 under 95: 80 and 64 reuse it; 63 scans (hit 32), 40 and 32 reuse that
            assert scans == [95, 63, 20, 95, 10]
        else:
            assert scans == [95, 80, 64, 63, 40, 32, 20, 95, 10]
        monkeypatch.undo()


def ids_of(lists):
    return [[b.block_id for b in lst] for lst in lists]


def test_cohort_materialize_due_returns_exactly_the_members_it_unparked():
    from support.scheduler import req

    from sim.core.kv.fastpath import DecodeCohort

    cohort = DecodeCohort(enabled=True)
    a, b, c = (req(rid, 16, max_tokens=50) for rid in "abc")
    for r, steps in ((a, 2), (b, 5), (c, 2)):
        r.num_computed_tokens = r.num_prompt_tokens
        cohort.park(r, steps)
    cohort.materialize("c")  # unparked early: its heap entry is stale
    assert cohort.materialize_due() == []
    cohort.sched_clock = 2
    assert cohort.materialize_due() == [a]
    cohort.park(a, 1)  # parked again: due at 3, its old entry is gone
    cohort.sched_clock = 5
    assert cohort.materialize_due() == [a, b]
    assert not cohort.members and a.num_computed_tokens == b.num_computed_tokens == 16 + 5


def test_cohort_counters_follow_both_clocks_and_the_due_buckets_keep_parking_order():
    from support.scheduler import req

    from sim.core.kv.fastpath import DecodeCohort

    cohort = DecodeCohort(enabled=True)
    cohort.sched_clock, cohort.out_clock = 7, 4
    a, b, c, d = (req(rid, 16, max_tokens=50) for rid in "abcd")
    for r, computed, output in ((a, 16, 0), (b, 20, 4), (c, 30, 14), (d, 17, 1)):
        r.num_computed_tokens, r.num_output_tokens = computed, output
    cohort.park(b, 3)
    cohort.park(a, 3)  # the same due step as b, parked after it
    cohort.park(c, 4)
    cohort.park(d, 3)
    assert cohort.decode_totals() == (4, 16 + 20 + 30 + 17)
    assert cohort.members["c"].computed_base == 30 - 7
    cohort.materialize("d")  # early: its bucket entry goes stale
    cohort.sched_clock, cohort.out_clock = 9, 6
    assert cohort.materialize_due() == []
    assert cohort.decode_totals() == (3, 16 + 20 + 30 + 3 * 2)
    cohort.sched_clock, cohort.out_clock = 10, 7
    assert cohort.materialize_due() == [b, a]  # parking order within the step
    assert (a.num_computed_tokens, a.num_output_tokens) == (16 + 3, 0 + 3)
    assert (b.num_computed_tokens, b.num_output_tokens) == (20 + 3, 4 + 3)
    assert list(cohort.members) == ["c"]
    cohort.sched_clock = 11
    assert cohort.materialize_due() == [c] and c.num_computed_tokens == 34
    assert cohort.decode_totals() == (0, 0)


def test_quiet_steps_is_the_least_of_its_four_bounds():
    """The comparisons stand for ``min`` of the four bounds, also when a horizon bound is
    ``QUIET_NO_BOUND`` (beyond a compiled short int)."""
    import numpy as np
    from support.scheduler import req

    from sim.core.kv.fastpath import DecodeCohort, QuietHorizon
    from sim.core.kv.managers import QUIET_NO_BOUND

    rng = np.random.default_rng(5)
    for _ in range(2000):
        r = req("r", int(rng.integers(1, 200)), max_tokens=int(rng.integers(1, 300)))
        r.num_output_tokens = int(rng.integers(0, r.output_len + 1))
        c = r.num_prompt_tokens + r.num_output_tokens - 1
        r.num_computed_tokens = c
        main = QUIET_NO_BOUND if rng.random() < 0.2 else c + int(rng.integers(-3, 60))
        processed = QUIET_NO_BOUND if rng.random() < 0.5 else c + int(rng.integers(-3, 60))
        max_model_len = c + int(rng.integers(0, 400))
        expected = min(max_model_len - c - 2, main - c, processed - c + 1, r.output_len - r.num_output_tokens - 1)
        horizon = QuietHorizon([], main, processed)
        assert DecodeCohort.quiet_steps(r, horizon, max_model_len) == expected
    assert DecodeCohort.quiet_steps(r, None, 10**6) == 0
