"""The vLLM 0.33 scheduler step: exact schedules, preemption, connectors, Mamba splits.

Every scenario drives ``schedule()`` + ``update_from_output()`` pairs the way
the step-clock engine does (connector ``get_finished()`` before each step) and
compares the ``schedule`` / ``admissions`` rows the recorder got.
"""

from __future__ import annotations

import numpy as np
import pytest
from support.scheduler import Harness, req

from sim.connector import ScriptedConnector
from sim.core.kv.hashing import RequestBlockHasher
from sim.core.request import RequestStatus
from sim.core.scheduler import EngineCrash


def test_prefill_decode_mix_and_stop():
    h = Harness(max_num_batched_tokens=8192)
    h.add(req("r0", 40, max_tokens=3))
    out0 = h.run_step()
    h.add(req("r1", 20, max_tokens=2), req("r2", 10, max_tokens=5, output_len=1))
    out1 = h.run_step()
    h.run_step()
    assert h.schedule_rows() == [
        (0, "r0", "new", 40, 0, False),
        (1, "r0", "running", 1, 40, False),
        (1, "r1", "new", 20, 0, False),
        (1, "r2", "new", 10, 0, False),
        (2, "r0", "running", 1, 41, False),
        (2, "r1", "running", 1, 20, False),
    ]
    assert (out0.prefill_tokens, out0.decode_tokens) == (40, 0)
    assert (out1.prefill_tokens, out1.decode_tokens) == (30, 1)
    # The batch shape the step-time model reads: decode totals plus each other chunk (new, context).
    assert (out0.decode_context_tokens, out0.prefill_chunks) == (0, [(40, 0)])
    assert (out1.decode_context_tokens, out1.prefill_chunks) == (40, [(20, 0), (10, 0)])
    assert h.finished == {"r2": 1, "r0": 2, "r1": 2}
    assert h.status == {
        "r2": RequestStatus.FINISHED_STOPPED,  # output_len (the workload's EOS) before max_tokens
        "r0": RequestStatus.FINISHED_LENGTH_CAPPED,
        "r1": RequestStatus.FINISHED_LENGTH_CAPPED,
    }
    assert not h.sched.has_unfinished_requests()
    assert h.admission_rows("step", "request_id", "outcome") == [(0, "r0", "ok"), (1, "r1", "ok"), (1, "r2", "ok")]


def test_chunked_prefill_with_a_small_budget():
    h = Harness(max_num_batched_tokens=32)
    h.add(req("r0", 50, max_tokens=2), req("r1", 20, max_tokens=1))
    for _ in range(3):
        h.run_step()
    assert h.schedule_rows() == [
        (0, "r0", "new", 32, 0, False),
        (1, "r0", "running", 18, 32, False),
        (1, "r1", "new", 14, 0, False),
        (2, "r0", "running", 1, 50, False),
        (2, "r1", "running", 6, 14, False),
    ]
    assert h.finished == {"r0": 2, "r1": 2}
    # r1 was not tried in step 0 (no budget left): no admission row.
    assert h.admission_rows("step", "request_id") == [(0, "r0"), (1, "r1")]


def test_long_prefill_token_threshold_only_with_competition():
    h = Harness(max_num_batched_tokens=8192, long_prefill_token_threshold=16)
    h.add(req("r0", 40, max_tokens=1), req("r1", 20, max_tokens=2))
    for _ in range(3):
        h.run_step()
    assert h.schedule_rows() == [
        (0, "r0", "new", 16, 0, False),
        (0, "r1", "new", 16, 0, False),
        (1, "r0", "running", 16, 16, False),
        (1, "r1", "running", 4, 16, False),
        (2, "r0", "running", 8, 32, False),
        (2, "r1", "running", 1, 20, False),
    ]
    alone = Harness(max_num_batched_tokens=8192, long_prefill_token_threshold=16)
    alone.add(req("a", 40))
    alone.run_step()
    assert alone.schedule_rows() == [(0, "a", "new", 40, 0, False)]


def test_max_num_seqs():
    h = Harness(max_num_seqs=2)
    h.add(req("r0", 10, max_tokens=1), req("r1", 10, max_tokens=3), req("r2", 10))
    h.run_step()
    h.run_step()
    assert h.schedule_rows() == [
        (0, "r0", "new", 10, 0, False),
        (0, "r1", "new", 10, 0, False),
        (1, "r1", "running", 1, 10, False),
        (1, "r2", "new", 10, 0, False),
    ]
    assert h.admission_rows("step", "request_id") == [(0, "r0"), (0, "r1"), (1, "r2")]


def test_head_of_line_blocking_on_whole_prompt_admission():
    h = Harness(num_blocks=10)  # 9 usable blocks of 16 tokens
    h.add(req("r0", 100, max_tokens=1), req("r1", 48), req("r2", 16))
    h.run_step()
    h.run_step()
    # r1 (3 blocks) does not fit beside r0 (7 blocks); r2 (1 block) would, but waits behind r1.
    assert h.schedule_rows() == [
        (0, "r0", "new", 100, 0, False),
        (1, "r1", "new", 48, 0, False),
        (1, "r2", "new", 16, 0, False),
    ]
    assert h.admission_rows("step", "request_id", "outcome", "reason") == [
        (0, "r0", "ok", ""),
        (0, "r1", "not_admitted", "no_blocks"),
        (1, "r1", "ok", ""),
        (1, "r2", "ok", ""),
    ]


def test_fcfs_preemption_victim_and_readmission_with_cached_prefix():
    h = Harness(num_blocks=6)  # 5 usable
    h.add(req("r0", 32, max_tokens=3), req("r1", 32, max_tokens=2))
    for _ in range(4):
        h.run_step()
    assert h.schedule_rows() == [
        (0, "r0", "new", 32, 0, False),
        (0, "r1", "new", 32, 0, False),
        (1, "r1", "running", 0, 32, True),  # the last running request preempts itself (rows at preemption)
        (1, "r0", "running", 1, 32, False),
        (2, "r0", "running", 1, 33, False),
        (3, "r1", "resumed", 1, 32, False),  # its two prompt blocks were still cached
    ]
    assert h.admission_rows("step", "request_id", "kind", "hit_g0", "local_tokens", "outcome", "reason") == [
        (0, "r0", "first", 0, 0, "ok", ""),
        (0, "r1", "first", 0, 0, "ok", ""),
        (2, "r1", "after_preemption", 32, 32, "not_admitted", "no_blocks"),
        (3, "r1", "after_preemption", 32, 32, "ok", ""),
    ]
    assert h.sched.num_preemptions == 1
    assert h.finished["r0"] == 2


@pytest.mark.parametrize(
    "policy, expected_step2",
    [
        # FCFS: the last running request (r1) preempts itself.
        ("fcfs", [(2, "r1", "running", 0, 32, True), (2, "r0", "running", 1, 33, False)]),
        # priority: r0 (priority 1) is the victim although it was already scheduled this step.
        ("priority", [(2, "r0", "running", 0, 33, True), (2, "r1", "running", 1, 32, False)]),
    ],
)
def test_preemption_victim_by_policy(policy, expected_step2):
    h = Harness(num_blocks=6, sched_policy=policy)
    h.add(req("r0", 32, max_tokens=10, priority=1))
    h.run_step()
    h.add(req("r1", 32, max_tokens=10, priority=0, arrival_time=1.0))
    h.run_step()
    h.run_step()
    assert [r for r in h.schedule_rows() if r[0] == 2] == expected_step2


def test_async_load_parks_the_request_then_resumes_without_lookup():
    conn = ScriptedConnector(matched_tokens={"r0": 32}, load_async=True, async_load_steps=2)
    h = Harness(connector=conn)
    h.add(req("r0", 64, max_tokens=1))
    outs = [h.run_step() for _ in range(3)]
    assert [o.total_num_scheduled_tokens for o in outs] == [0, 0, 32]
    assert h.schedule_rows() == [(2, "r0", "new", 32, 32, False)]
    assert h.admission_rows(
        "step", "request_id", "kind", "local_tokens", "external_tokens", "num_computed_tokens", "outcome"
    ) == [
        (0, "r0", "first", 0, 32, 32, "ok"),
        (2, "r0", "after_async_load", 0, 0, 32, "ok"),
    ]
    assert conn.loads == [("r0", 32)]
    assert h.finished == {"r0": 2}


def test_sync_external_hit_and_connector_not_ready():
    class NotReadyOnce(ScriptedConnector):
        def __init__(self, **kw):
            super().__init__(**kw)
            self.asked = 0

        def get_num_new_matched_tokens(self, request, num_computed_tokens):
            if request.request_id == "slow" and self.asked == 0:
                self.asked += 1
                return None, False
            return super().get_num_new_matched_tokens(request, num_computed_tokens)

    h = Harness(connector=NotReadyOnce(matched_tokens={"fast": 16}))
    h.add(req("slow", 20), req("fast", 40))
    h.run_step()
    h.run_step()
    assert h.schedule_rows() == [(0, "fast", "new", 24, 16, False), (1, "slow", "new", 20, 0, False)]
    assert h.admission_rows("step", "request_id", "external_tokens", "outcome", "reason") == [
        (0, "slow", 0, "not_admitted", "connector_not_ready"),
        (0, "fast", 16, "ok", ""),
        (1, "slow", 0, "ok", ""),
    ]


@pytest.mark.parametrize(
    "ext, reason",
    [
        (80, "AssertionError: num_new_tokens > 0"),
        (81, "AssertionError: num_computed_tokens <= request.num_tokens"),
    ],
)
def test_over_reported_external_hit_crashes_like_vllm(ext, reason):
    h = Harness(connector=ScriptedConnector(matched_tokens={"r0": ext}))
    h.add(req("r0", 80))
    with pytest.raises(EngineCrash) as info:
        h.run_step()
    assert (info.value.reason, info.value.request_id) == (reason, "r0")
    assert h.admission_rows("request_id", "outcome", "crash_reason") == [("r0", "crash", reason)]


def test_on_crash_record_fails_the_request_and_goes_on():
    h = Harness(connector=ScriptedConnector(matched_tokens={"bad": 80}), on_crash="record")
    h.add(req("bad", 80), req("good", 16))
    h.run_step()
    assert [c.reason for c in h.sched.crashes] == ["AssertionError: num_new_tokens > 0"]
    assert h.schedule_rows() == [(0, "good", "new", 16, 0, False)]
    assert "bad" not in h.sched.requests


MAMBA = ("full_attention", "mamba")


@pytest.mark.parametrize(
    "groups, budget, chunks",
    [
        (MAMBA, 8192, [96, 4]),  # stop at the last cacheable boundary floor(99/16)*16
        (("full_attention", {"type": "mamba", "prefill_checkpoints": True}), 8192, [100]),  # checkpoint block
        (MAMBA, 40, [32, 32, 32, 4]),  # non-final chunks end on block boundaries
        (("full_attention",), 40, [40, 40, 20]),  # no Mamba: plain chunking
    ],
)
def test_mamba_block_aligned_split(groups, budget, chunks):
    h = Harness(groups=groups, max_num_batched_tokens=budget)
    h.add(req("r", 100))
    got = []
    while h.sched.has_unfinished_requests():
        got.append(h.run_step().num_scheduled_tokens.get("r", 0))
    assert got == chunks


def test_mamba_split_with_a_block_wider_than_the_budget():
    h = Harness(groups=MAMBA, max_num_batched_tokens=10)
    h.add(req("r", 40))
    got = []
    while h.sched.has_unfinished_requests():
        got.append(h.run_step().num_scheduled_tokens["r"])
    assert got == [10, 6, 10, 6, 8]


def test_mamba_split_stops_at_the_next_boundary_after_an_unaligned_external_hit():
    h = Harness(groups=MAMBA, connector=ScriptedConnector(matched_tokens={"r": 8}))
    h.add(req("r", 100))
    got = []
    while h.sched.has_unfinished_requests():
        got.append(h.run_step().num_scheduled_tokens["r"])
    assert got == [8, 80, 4]


@pytest.mark.parametrize("load_async", [False, True])
def test_what_if_022_split_asserts_no_external_tokens(load_async):
    """vLLM <= 0.22.1 (before #42554): any external hit on an align-mode hybrid kills the engine, async or not;
    0.23+ (hybridsim's default) takes it. A request without external tokens is unaffected (vLLM #45407)."""
    conn = ScriptedConnector(matched_tokens={"ext": 32}, load_async=load_async)
    h = Harness(groups=MAMBA, connector=conn, assert_no_external_kv_in_mamba_split=True)
    h.add(req("plain", 40))
    h.run_step()
    h.add(req("ext", 48))
    with pytest.raises(EngineCrash) as info:
        h.run_step()
    reason = "AssertionError: External KV connector is not verified yet"
    assert (info.value.reason, info.value.request_id) == (reason, "ext")
    assert h.admission_rows("request_id", "external_tokens", "outcome") == [("plain", 0, "ok"), ("ext", 32, "crash")]
    default = Harness(groups=MAMBA, connector=ScriptedConnector(matched_tokens={"ext": 32}, load_async=load_async))
    default.add(req("ext", 48))
    default.run_step()
    assert default.admission_rows("request_id", "external_tokens", "outcome") == [("ext", 32, "ok")]


def test_what_if_022_split_assert_needs_the_mamba_split():
    """Full attention only: no split, so the what-if never fires."""
    h = Harness(connector=ScriptedConnector(matched_tokens={"ext": 32}), assert_no_external_kv_in_mamba_split=True)
    h.add(req("ext", 48))
    h.run_step()
    assert h.admission_rows("request_id", "external_tokens", "outcome") == [("ext", 32, "ok")]


def test_mamba_split_zero_stops_admission_for_the_step():
    h = Harness(groups=MAMBA, max_num_batched_tokens=20)
    h.add(req("r0", 40), req("r1", 40))
    h.run_step()
    assert h.schedule_rows() == [(0, "r0", "new", 16, 0, False)]
    assert h.admission_rows("request_id", "outcome", "reason") == [
        ("r0", "ok", ""),
        ("r1", "not_admitted", "no_aligned_chunk"),
    ]


def _split_oracle(sched, request, n, local, ext):
    """The split as the stop list it is specified by: the nearest stop strictly inside (start, end)."""
    from sim.core.kv.specs import prefill_checkpoint_position, prefill_checkpoint_valid

    start = request.num_computed_tokens + local + ext
    prefill_end = max(request.num_prompt_tokens, request.num_tokens - 1)
    if start >= prefill_end:
        return n
    bs = sched.mamba_block_size
    last = prefill_checkpoint_position(request.num_tokens, sched.block_size)
    end = start + n
    internal = (
        sched.mamba_has_prefill_checkpoints
        and end >= prefill_end
        and prefill_checkpoint_valid(
            start, end, prefill_checkpoint_position(prefill_end, sched.block_size), sched.hash_block_size, bs
        )
    )
    if internal:
        last = 0
    if end < prefill_end:
        thr = sched.config.long_prefill_token_threshold
        max_prefill = min(sched.config.max_num_batched_tokens, thr) if thr > 0 else sched.config.max_num_batched_tokens
        if end // bs * bs > start or bs <= max_prefill:
            end = end // bs * bs
    junction = request.shared_prefix_boundary
    stops = (
        (start // bs + 1) * bs if start % bs and not internal else 0,
        last,
        start + (junction - start) // bs * bs if start < junction < end else 0,
    )
    return max(min((s for s in stops if start < s < end), default=end) - start, 0)


@pytest.mark.parametrize("checkpoints", [False, True])
def test_mamba_split_equals_its_stop_list_on_random_states(checkpoints):
    import dataclasses

    groups = ("full_attention", {"type": "mamba", "prefill_checkpoints": True}) if checkpoints else MAMBA
    h = Harness(groups=groups, max_num_batched_tokens=64)
    sched = h.sched
    rng = np.random.default_rng(5)
    configs = [
        dataclasses.replace(sched.config, max_num_batched_tokens=budget, long_prefill_token_threshold=threshold)
        for budget in (8, 64, 2048)
        for threshold in (0, 10, 96)
    ]
    for i in range(4000):
        r = req(f"r{i}", int(rng.integers(1, 300)), max_tokens=50)
        r.num_output_tokens = int(rng.integers(0, 3))
        r.num_computed_tokens = int(rng.integers(0, r.num_tokens + 1))
        # a junction before, inside or past the chunk (also past the prompt)
        r.shared_prefix_boundary = int(rng.choice([0, int(rng.integers(0, r.num_tokens + 1)), r.num_tokens + 7]))
        sched.mamba_block_size = int(rng.choice([4, 16, 48, 64, 100]))
        sched.config = configs[int(rng.integers(0, len(configs)))]
        n = int(rng.integers(1, 200))
        local, ext = (int(x) for x in rng.integers(0, 40, size=2) * rng.integers(0, 2, size=2))
        args = (r, n, local, ext)
        assert sched._mamba_block_aligned_split(*args) == _split_oracle(sched, *args), (i, args)
    # a junction right past the chunk's end is no stop
    sched.mamba_block_size, sched.config = 16, configs[0]
    r = req("j", 12, max_tokens=5)
    r.shared_prefix_boundary = 17
    assert sched._mamba_block_aligned_split(r, 17) == _split_oracle(sched, r, 17, 0, 0) == 17


# --------------------------------------------------- PR #48425 divergence tests
def _divergence_harness(policy, connector):
    """vLLM's ``_create_hybrid_mamba_connector_scheduler``: FA + Mamba, block 16, 100 blocks.

    vLLM's test seeded with ``mamba_cache_mode="all"`` (a state at every block).
    In 0.33's ``align`` mode states exist only at chunk ends, so we seed the
    same four cached states with four prefixes of the document (17, 33, 49 and
    65 tokens): each resumes from the previous one's hit and ends its first
    chunk on the next block boundary.
    """
    h = Harness(
        groups=MAMBA,
        num_blocks=100,
        connector=connector,
        policy=policy,
        max_num_seqs=4,
        max_num_batched_tokens=8192,
        max_model_len=8192,
    )
    for i, n in enumerate((17, 33, 49, 65)):
        h.add(req(f"seed{i}", n, content="doc"))
        while h.sched.has_unfinished_requests():
            h.run_step()
    return h


def _evict(h, blocks_by_group):
    hashes = req("probe", 80, content="doc")
    hashes.set_block_hasher(RequestBlockHasher(16))
    ids = []
    for group, idxs in blocks_by_group.items():
        for i in idxs:
            cached = h.kv.block_pool.get_cached_block(hashes.block_hashes[i], [group])
            assert cached is not None, (group, i)
            ids.append(cached[0].block_id)
    h.kv.block_pool.evict_blocks(ids)


CONNECTORS = [(p, flag) for p in ("reconciled", "pr48425") for flag in (False, True)]


@pytest.mark.parametrize("policy, flag", CONNECTORS)
@pytest.mark.parametrize("ext, expected", [(0, 16), (16, 32)])
def test_divergence_mamba_deeper_than_fa(policy, flag, ext, expected):
    conn = ScriptedConnector(matched_tokens={"r": ext}, supports_divergent_local_hybrid_hits=flag)
    h = _divergence_harness(policy, conn)
    _evict(h, {0: [2, 3], 1: [1, 2]})
    h.add(req("r", 80, content="doc"))
    out = h.run_step()
    r = h.sched.requests["r"]
    assert out.num_computed_tokens_before["r"] == expected
    # Mamba's deeper state (64) is dropped by every policy: 0.33's guard falls back to the fixed point.
    assert h.admission_rows(
        "request_id", "hit_g0", "hit_g1", "local_tokens", "external_tokens", "hit_diverged", "fallback"
    )[-1] == ("r", 32, 64, 16, ext, False, False)
    assert r.shared_prefix_boundary == 32
    # The first chunk stops at the junction (32) when it starts before it.
    assert out.num_scheduled_tokens["r"] == (16 if ext == 0 else 32)


@pytest.mark.parametrize(
    "policy, flag, diverged",
    [
        ("reconciled", False, False),
        ("reconciled", True, False),
        ("pr48425", False, False),
        ("pr48425", True, True),
    ],
)
def test_divergence_fa_deeper_no_external(policy, flag, diverged):
    conn = ScriptedConnector(matched_tokens={"r": 0}, supports_divergent_local_hybrid_hits=flag)
    h = _divergence_harness(policy, conn)
    _evict(h, {1: [1, 2, 3]})
    h.add(req("r", 80, content="doc"))
    out = h.run_step()
    assert out.num_computed_tokens_before["r"] == 16
    # pr48425 with an opted-in connector: FA hit 64 flagged diverged, ext 0 -> the fallback re-lookup.
    assert h.admission_rows("request_id", "hit_g0", "hit_g1", "local_tokens", "hit_diverged", "fallback")[-1] == (
        "r",
        64,
        16,
        16,
        diverged,
        diverged,
    )
    assert h.sched.num_fallbacks == int(diverged)


def test_divergence_fa_deeper_with_external_tokens_crashes_only_opted_in_pr48425():
    """FA hit 64 + 16 external tokens reaches the end of an 80-token prompt: vLLM asserts."""
    conn = ScriptedConnector(matched_tokens={"r": 16}, supports_divergent_local_hybrid_hits=True)
    h = _divergence_harness("pr48425", conn)
    _evict(h, {1: [1, 2, 3]})
    h.add(req("r", 80, content="doc"))
    with pytest.raises(EngineCrash, match=r"num_new_tokens > 0"):
        h.run_step()
    safe = _divergence_harness(
        "reconciled", ScriptedConnector(matched_tokens={"r": 16}, supports_divergent_local_hybrid_hits=True)
    )
    _evict(safe, {1: [1, 2, 3]})
    safe.add(req("r", 80, content="doc"))
    assert safe.run_step().num_computed_tokens_before["r"] == 32
