import pytest
from support.connector import FA, MAMBA, request, step_ctx, table, time_ctx

from sim.connector.offload import OffloadConnector

GBYTE = 1e9


def offload(ctx, **kw):
    kw.setdefault("capacity_gb", 1.0)
    kw.setdefault("chunk_tokens", 32)
    kw.setdefault("store", "on_finish")  # these tests drive stores through request_finished
    conn = OffloadConnector(**kw)
    conn.bind(ctx)
    return conn


def finish(conn, svc, req, computed, block_ids):
    req.num_computed_tokens = computed
    delay, _ = conn.request_finished_all_groups(req, block_ids)
    assert delay is True
    svc.advance(svc.step + conn.link_spec.steps)
    recving, sending = conn.get_finished()
    assert sending == {req.request_id} and recving == set()


def test_fa_only_store_on_finish_then_chunk_aligned_hits():
    ctx, svc = step_ctx(FA)
    conn = offload(ctx)
    r0 = request("r0", ("doc", 128))
    finish(conn, svc, r0, 128, ([1, 2, 3, 4, 5, 6, 7, 8],))
    assert conn.metrics()["tier_blocks_g0"] == 8
    assert conn.metrics()["bytes_stored"] == 8_000_000
    r1 = request("r1", ("doc", 128), ("other", 40))
    assert conn.get_num_new_matched_tokens(r1, 0) == (128, True)
    assert conn.get_num_new_matched_tokens(r1, 32) == (96, True)
    # less than one chunk beyond local is no hit (vLLM: "can only load less than a chunk")
    assert conn.get_num_new_matched_tokens(r1, 112) == (0, False)
    assert conn.get_num_new_matched_tokens(r1, 128) == (0, False)
    # FA-only: the whole prompt may be a hit (vLLM caps only with non-FA groups).
    r2 = request("r2", ("doc", 96))
    assert conn.get_num_new_matched_tokens(r2, 0) == (96, True)
    # side-effect free: asking again gives the same answer
    assert conn.get_num_new_matched_tokens(r2, 0) == (96, True)


def hybrid_store(conn, svc):
    r0 = request("r0", ("doc", 128))
    # Mamba table holds the states at 64 (block 3) and 128 (block 7).
    finish(conn, svc, r0, 128, ([1, 2, 3, 4, 5, 6, 7, 8], [0, 0, 0, 11, 0, 0, 0, 12]))


def test_hybrid_hit_needs_fa_chunks_and_mamba_state_at_the_boundary():
    ctx, svc = step_ctx(FA, MAMBA)
    conn = offload(ctx)
    hybrid_store(conn, svc)
    m = conn.metrics()
    assert (m["tier_blocks_g0"], m["tier_blocks_g1"]) == (8, 2)
    r1 = request("r1", ("doc", 128), ("q", 32))
    assert conn.get_num_new_matched_tokens(r1, 0) == (128, True)
    # Exactly 128 tokens: the cap num_tokens - 1 rounds down to chunk 96, where no state exists -> 64.
    r_same = request("r_same", ("doc", 128))
    assert conn.get_num_new_matched_tokens(r_same, 0) == (64, True)
    # drop the Mamba state at 128 from the tier: the hit falls back to the state at 64
    conn.tier.remove(1, conn._key(r1, 3))
    assert conn.get_num_new_matched_tokens(r1, 0) == (64, True)
    assert conn.get_num_new_matched_tokens(r1, 32) == (32, True)
    # a hit of less than one chunk beyond local is none
    assert conn.get_num_new_matched_tokens(r1, 64) == (0, False)
    # drop FA chunk 1: FA ends at 32, where no Mamba state exists -> nothing
    conn.tier.remove(0, conn._key(r1, 1))
    assert conn.get_num_new_matched_tokens(r1, 0) == (0, False)
    m = conn.metrics()
    assert m["queries"] == 6


def test_load_is_async_over_the_link_and_reports_finished_recving():
    ctx, svc = step_ctx(FA, MAMBA)
    conn = offload(ctx, transfer_steps=2)
    hybrid_store(conn, svc)
    r1 = request("r1", ("doc", 128), ("q", 32))
    assert conn.get_num_new_matched_tokens(r1, 32) == (96, True)
    blocks = table([21, 22, 23, 24, 25, 26, 27, 28], [0, 0, 0, 0, 0, 0, 0, 31], hashed=2)
    conn.update_state_after_alloc(r1, blocks, 96)
    assert conn.step_columns()["conn_loads_in_flight"] == 1
    svc.advance(svc.step + 1)
    assert conn.get_finished() == (set(), set())
    svc.advance(svc.step + 1)
    assert conn.get_finished() == ({"r1"}, set())
    # FA blocks 2..7 (6 blocks) + one Mamba state block
    assert conn.metrics()["bytes_loaded"] == 7_000_000
    assert conn.metrics()["loads"] == 1


def test_load_end_time_on_the_time_clock():
    ctx, env = time_ctx(FA)
    conn = offload(ctx, bandwidth_gbps=50, latency_us=10)
    r0 = request("r0", ("doc", 128))
    r0.num_computed_tokens = 128
    assert conn.request_finished_all_groups(r0, ([1, 2, 3, 4, 5, 6, 7, 8],)) == (True, None)
    env.run()
    # store: 8 MB at 50 GB/s + 10 us
    assert env.now == pytest.approx(8e6 / 50e9 + 10e-6)
    assert conn.get_finished() == (set(), {"r0"})
    t0 = env.now
    r1 = request("r1", ("doc", 128), ("q", 16))
    assert conn.get_num_new_matched_tokens(r1, 0) == (128, True)
    conn.update_state_after_alloc(r1, table(list(range(11, 20))), 128)
    env.run()
    assert env.now - t0 == pytest.approx(8e6 / 50e9 + 10e-6)
    assert conn.get_finished() == ({"r1"}, set())
    assert conn.metrics()["transfer_time"] == pytest.approx(2 * (8e6 / 50e9 + 10e-6))


def test_store_in_flight_defers_lookup_and_keeps_blocks():
    ctx, svc = step_ctx(FA)
    conn = offload(ctx, transfer_steps=3)
    r0 = request("r0", ("doc", 64))
    r0.num_computed_tokens = 64
    assert conn.request_finished_all_groups(r0, ([1, 2, 3, 4],)) == (True, None)
    assert conn.get_num_new_matched_tokens(request("r9", ("doc", 64)), 0) == (0, False)  # not readable yet
    svc.advance(3)
    assert conn.get_finished() == (set(), {"r0"})


def test_per_group_budgets_lose_fa_chunks_but_keep_mamba_states():
    ctx, svc = step_ctx(FA, MAMBA)
    # FA budget: 4 chunks (2 MB each); Mamba budget: 4 states (1 MB each).
    conn = offload(ctx, capacity_gb=0.012, group_capacity=[8 / 12, 4 / 12])
    hybrid_store(conn, svc)
    r1 = request("r1", ("doc", 128), ("q", 32))
    assert conn.get_num_new_matched_tokens(r1, 0) == (128, True)
    # another document fills the FA budget: doc's FA chunks are evicted, its Mamba states stay
    other = request("o", ("other", 128))
    finish(conn, svc, other, 128, ([41, 42, 43, 44, 45, 46, 47, 48], [0, 0, 0, 0, 0, 0, 0, 49]))
    m = conn.metrics()
    assert (m["tier_blocks_g0"], m["tier_blocks_g1"]) == (8, 3)
    assert m["tier_evictions_g0"] == 4 and m["tier_evictions_g1"] == 0
    assert all(conn.tier.contains(1, conn._key(r1, j)) for j in (1, 3))
    assert not any(conn.tier.contains(0, conn._key(r1, j)) for j in range(4))
    assert conn.get_num_new_matched_tokens(r1, 0) == (0, False)
    removed = [e for e in conn.take_events() if e.kind == "removed"]
    assert [(e.group, e.cause) for e in removed] == [(0, "evict_lru")] * 4


def test_shared_budget_evicts_least_recent_entry_of_any_group():
    ctx, svc = step_ctx(FA, MAMBA)
    # room for exactly the 4 FA chunks (8 MB) + 2 states (2 MB) of one request
    conn = offload(ctx, capacity_gb=0.010)
    hybrid_store(conn, svc)
    r1 = request("r1", ("doc", 128), ("q", 32))
    # touch everything except the Mamba state at 64, then store one more 1 MB state
    conn.update_state_after_alloc(r1, table(list(range(1, 9)), [0] * 7 + [9]), 128)
    svc.advance(svc.step + 1)
    conn.get_finished()
    other = request("o", ("other", 32))
    finish(conn, svc, other, 32, ([0, 0], [0, 50]))  # FA blocks null (freed): only the state is stored
    assert not conn.tier.contains(1, conn._key(r1, 1))  # the untouched state went first
    assert conn.tier.contains(1, conn._key(r1, 3)) and conn.metrics()["tier_blocks_g0"] == 8


def test_store_on_compute_offers_completed_chunks_each_step():
    ctx, svc = step_ctx(FA, MAMBA)
    conn = offload(ctx, store="on_compute")
    r0 = request("r0", ("doc", 128))
    conn.update_state_after_alloc(r0, table([1, 2, 3, 4, 5, 6, 7, 8], [0] * 8), 0)
    r0.num_computed_tokens = 64  # a step ended at 64: FA chunks 0-1 and the state at 64
    svc.advance(1)
    conn.get_finished()
    r0.num_computed_tokens = 100  # a step ended at 100: FA chunk 2, no state (not on a chunk boundary)
    svc.advance(2)
    conn.get_finished()
    svc.advance(3)
    conn.get_finished()
    m = conn.metrics()
    assert (m["tier_blocks_g0"], m["tier_blocks_g1"], m["stores"]) == (6, 1, 2)
    r0.num_computed_tokens = 128
    assert conn.request_finished_all_groups(r0, ([1, 2, 3, 4, 5, 6, 7, 8], [0] * 8)) == (True, None)
    svc.advance(4)
    assert conn.get_finished() == (set(), {"r0"})
    assert (conn.metrics()["tier_blocks_g0"], conn.metrics()["tier_blocks_g1"]) == (8, 2)


def test_vllm_offloading_asserts_on_short_block_table():
    ctx, svc = step_ctx(FA)
    conn = offload(ctx)
    r0 = request("r0", ("doc", 64))
    finish(conn, svc, r0, 64, ([1, 2, 3, 4],))
    r1 = request("r1", ("doc", 64), ("q", 8))
    assert conn.get_num_new_matched_tokens(r1, 0) == (64, True)
    with pytest.raises(AssertionError, match=r"len\(group_blocks\) >= num_gpu_blocks"):
        conn.update_state_after_alloc(r1, table([5, 6]), 64)


def test_bad_options_name_the_key():
    with pytest.raises(ValueError, match="capacity_gb"):
        OffloadConnector()
    with pytest.raises(ValueError, match="store"):
        OffloadConnector(capacity_gb=1, store="later")
    ctx, _ = step_ctx(FA, MAMBA)
    with pytest.raises(ValueError, match="chunk_tokens"):
        OffloadConnector(capacity_gb=1, chunk_tokens=24).bind(ctx)
    with pytest.raises(ValueError, match="group_capacity"):
        OffloadConnector(capacity_gb=1, group_capacity=[1.0]).bind(ctx)


def test_default_chunk_is_256_rounded_to_the_scheduler_block():
    ctx, _ = step_ctx(FA, MAMBA, block_size=528)
    conn = OffloadConnector(capacity_gb=1)
    conn.bind(ctx)
    assert conn.C == 528
    ctx, _ = step_ctx(FA)
    conn = OffloadConnector(capacity_gb=1)
    conn.bind(ctx)
    assert conn.C == 256
