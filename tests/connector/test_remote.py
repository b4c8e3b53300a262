import pytest
from support.connector import FA, MAMBA, request, step_ctx, table, time_ctx

from sim.connector.remote import RemoteConnector


def remote(ctx, **kw):
    conn = RemoteConnector(**kw)
    conn.bind(ctx)
    return conn


def test_defaults_and_nixl_flags():
    conn = RemoteConnector()
    assert conn.supports_hma and conn.supports_divergent_local_hybrid_hits


def arrive(conn, r):
    """The request arrives at the proxy: the connector routes it to the prefill instance; returns the list
    its hand-over to the scheduler will append to."""
    handed: list = []
    assert conn.route_arrival(r, handed.append)
    return handed


def test_handed_over_when_the_prefill_is_done_then_prompt_minus_mamba_backoff():
    ctx, svc = step_ctx(FA, MAMBA)
    conn = remote(ctx, prefill_steps=2)
    r = request("r", ("doc", 100))
    handed = arrive(conn, r)
    svc.advance(1)
    assert handed == [] and conn.step_columns()["conn_prefills_in_flight"] == 1
    svc.advance(2)
    assert handed == [r] and conn.step_columns()["conn_prefills_in_flight"] == 0
    # Mamba model: the prefill computes 99 tokens, the decoder recomputes the last one
    assert conn.get_num_new_matched_tokens(r, 0) == (99, True)
    assert conn.get_num_new_matched_tokens(r, 48) == (51, True)  # no block alignment, as NIXL
    conn.update_state_after_alloc(r, table(list(range(1, 8)), [0] * 6 + [9], hashed=3), 51)
    svc.advance(3)
    assert conn.get_finished() == ({"r"}, set())
    # FA: 7 blocks - 3 hashed = 4 unhashed; Mamba: 1 state block
    assert conn.metrics()["bytes_loaded"] == 5_000_000
    # one transfer per request: a re-admission after preemption recomputes
    assert conn.get_num_new_matched_tokens(r, 0) == (0, False)
    assert conn.request_finished_all_groups(r, ([1], [9])) == (False, None)


def test_fa_only_model_pulls_the_whole_prompt():
    ctx, svc = step_ctx(FA)
    conn = remote(ctx)
    r = request("r", ("doc", 64))
    arrive(conn, r)
    svc.advance(1)
    assert conn.get_num_new_matched_tokens(r, 0) == (64, True)
    assert conn.get_num_new_matched_tokens(r, 64) == (0, False)


def test_unlisted_requests_are_local():
    ctx, svc = step_ctx(FA)
    conn = remote(ctx, requests=["a"])
    b = request("b", ("doc", 64))
    assert not conn.route_arrival(b, lambda request: None)  # straight to the scheduler, computed locally
    assert conn.get_num_new_matched_tokens(b, 0) == (0, False)


def test_prefill_and_pull_times_on_the_time_clock():
    ctx, env = time_ctx(FA, MAMBA)
    conn = remote(ctx)  # defaults: 20k tok/s + 5 ms prefill, 25 GB/s + 20 us network
    r = request("r", ("doc", 100))
    handed = arrive(conn, r)
    env.run()
    assert env.now == pytest.approx(5e-3 + 99 / 20_000) and handed == [r]
    assert conn.get_num_new_matched_tokens(r, 0) == (99, True)
    t0 = env.now
    conn.update_state_after_alloc(r, table(list(range(1, 8)), [0] * 6 + [9]), 99)
    env.run()
    assert env.now - t0 == pytest.approx(20e-6 + 8_000_000 / 25e9)
    assert conn.get_finished() == ({"r"}, set())


def test_assert_fa_pairing_when_decode_claims_more_blocks_than_prefill_sent():
    ctx, svc = step_ctx(FA, MAMBA)
    conn = remote(ctx)
    r = request("r", ("doc", 40))  # prefill sends cdiv(39, 16) = 3 FA blocks
    arrive(conn, r)
    svc.advance(1)
    with pytest.raises(AssertionError, match=r"Group 0: \|6 - 3\| > 2"):
        conn.update_state_after_alloc(r, table([1, 2, 3, 4, 5, 6], [0, 0, 7]), 39)


def test_assert_group_count_mismatch():
    ctx, svc = step_ctx(FA, MAMBA)
    conn = remote(ctx)
    r = request("r", ("doc", 40))
    arrive(conn, r)
    svc.advance(1)
    with pytest.raises(AssertionError, match="Number of KV cache groups must match"):
        conn.update_state_after_alloc(r, table([1, 2, 3]), 39)


def test_pull_refills_fa_positions_an_over_claimed_local_hit_left_to_fresh_blocks():
    """#46453 with max_per_group: hits FA 32, Mamba 64, local claimed 64, NIXL answers 95 - 64 = 31.
    The decode's FA table holds 2 hit blocks and 4 fresh ones (positions 2..5); NIXL pulls all 4,
    tail-paired with the prefill's 6, so tokens 32..63 (claimed local) are refilled; no check fires."""
    ctx, svc = step_ctx(FA, MAMBA)
    conn = remote(ctx)
    r = request("r", ("doc", 96))
    arrive(conn, r)
    svc.advance(1)
    assert conn.get_num_new_matched_tokens(r, 64) == (31, True)
    conn.update_state_after_alloc(r, table([1, 2, 3, 4, 5, 6], [0, 0, 0, 7, 8, 9], hashed=2), 31)
    m = conn.metrics()
    assert m["refilled_local_tokens"] == 32
    assert m["blocks_pulled"] == [4, 1]  # the Mamba slot clipped to the state-bearing last one
    assert m["loads"] == 1


def test_pull_refills_nothing_when_local_is_the_resident_fa_prefix():
    """The same request admitted at the reconciled hit 16: NIXL answers 79 and pulls FA positions 1..5."""
    ctx, svc = step_ctx(FA, MAMBA)
    conn = remote(ctx)
    r = request("r", ("doc", 96))
    arrive(conn, r)
    svc.advance(1)
    assert conn.get_num_new_matched_tokens(r, 16) == (79, True)
    conn.update_state_after_alloc(r, table([1, 2, 3, 4, 5, 6], [0, 0, 0, 0, 0, 9], hashed=1), 79)
    m = conn.metrics()
    assert m["refilled_local_tokens"] == 0
    assert m["blocks_pulled"] == [5, 1]


def test_over_claimed_hit_reaching_the_remote_count_pulls_nothing():
    """65-token prompt, local claimed 64 = NIXL's count R: answer 0, no transfer, nothing refilled."""
    ctx, svc = step_ctx(FA, MAMBA)
    conn = remote(ctx)
    r = request("r", ("doc", 65))
    arrive(conn, r)
    svc.advance(1)
    assert conn.get_num_new_matched_tokens(r, 64) == (0, False)
    conn.update_state_after_alloc(r, table([1, 2, 3, 4, 5], [0, 0, 0, 7, 8], hashed=2), 0)
    m = conn.metrics()
    assert (m["loads"], m["refilled_local_tokens"], m["blocks_pulled"]) == (0, 0, [0, 0])
    assert conn.get_num_new_matched_tokens(r, 0) == (0, False)  # one transfer per request: consumed
