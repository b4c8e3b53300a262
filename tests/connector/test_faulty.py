from types import SimpleNamespace

import pytest
from support.connector import FA, MAMBA, request, step_ctx, table

from sim.connector.base import KVConnector
from sim.connector.context import check_connector_compatible
from sim.connector.faulty import FaultyConnector
from sim.connector.offload import OffloadConnector


class OneStepLoader(KVConnector):
    """Inner test connector: every request can load 64 tokens beyond local; loads finish at the next get_finished."""

    name = "one_step"

    def __init__(self):
        self.loading = set()

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        return 64, True

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        if num_external_tokens:
            self.loading.add(request.request_id)

    def get_finished(self):
        done, self.loading = self.loading, set()
        return done, set()


def faulty(ctx, **kw):
    conn = FaultyConnector(wraps=OneStepLoader(), **kw)
    conn.bind(ctx)
    return conn


def load(conn, rid, local=16):
    r = request(rid, ("doc", 128))
    conn.get_num_new_matched_tokens(r, local)
    # FA blocks 1..5 (tokens 0..80), Mamba state for boundary 80 in block 15
    conn.update_state_after_alloc(r, table([1, 2, 3, 4, 5], [0, 0, 0, 0, 15], hashed=1), 64)
    return conn.get_finished()


def test_scripted_failed_load_reports_every_target_block_after_the_load_finishes():
    ctx, _ = step_ctx(FA, MAMBA)
    conn = faulty(ctx, fail_loads=["bad"])
    assert load(conn, "ok") == ({"ok"}, set())
    assert conn.get_block_ids_with_load_errors() == set()
    r = request("bad", ("doc", 128))
    conn.get_num_new_matched_tokens(r, 16)
    conn.update_state_after_alloc(r, table([1, 2, 3, 4, 5], [0, 0, 0, 0, 15], hashed=1), 64)
    assert conn.get_block_ids_with_load_errors() == set()  # not before the load completes
    assert conn.get_finished() == ({"bad"}, set())
    assert conn.get_block_ids_with_load_errors() == {2, 3, 4, 5, 15}
    assert conn.get_block_ids_with_load_errors() == set()  # drained


def test_partial_load_loses_the_tail_and_the_boundary_state():
    ctx, _ = step_ctx(FA, MAMBA)
    conn = faulty(ctx, partial_loads={"p": 0.5})
    load(conn, "p")
    assert conn.get_block_ids_with_load_errors() == {4, 5, 15}


def test_dropped_mamba_state_reports_only_the_state_block():
    ctx, _ = step_ctx(FA, MAMBA)
    conn = faulty(ctx, drop_mamba=["m"])
    load(conn, "m")
    assert conn.get_block_ids_with_load_errors() == {15}
    assert conn.metrics()["fault_mamba_drops"] == 1


def test_failure_ratio_follows_the_probability_and_the_seed():
    ratios = []
    for seed in (1, 2):
        ctx, _ = step_ctx(FA, MAMBA, seed=seed)
        conn = faulty(ctx, load_failure_prob=0.3)
        failed = 0
        for i in range(400):
            load(conn, f"r{i}")
            failed += bool(conn.get_block_ids_with_load_errors())
        ratios.append(failed / 400)
        assert conn.metrics()["fault_failed_loads"] == failed
    assert all(0.25 < r < 0.35 for r in ratios)
    ctx, _ = step_ctx(FA, MAMBA, seed=1)
    conn = faulty(ctx, load_failure_prob=0.3)
    again = sum(bool(load(conn, f"r{i}") and conn.get_block_ids_with_load_errors()) for i in range(400))
    assert again / 400 == ratios[0]  # same seed, same faults


def test_slow_request_transfers_take_longer_on_the_wrapped_offload_tier():
    from sim.connector import register_connector

    register_connector(OffloadConnector)  # idempotent; the registry may already hold it
    ctx, svc = step_ctx(FA)
    conn = FaultyConnector(inner={"type": "offload", "capacity_gb": 1, "chunk_tokens": 32}, slow={"s": 3})
    conn.bind(ctx)
    r = request("s", ("doc", 64))
    conn.on_new_request(r)
    r.num_computed_tokens = 64
    assert conn.request_finished_all_groups(r, ([1, 2, 3, 4],)) == (True, None)
    svc.advance(2)
    assert conn.get_finished() == (set(), set())
    svc.advance(3)
    assert conn.get_finished() == (set(), {"s"})
    assert conn.metrics()["tier_blocks_g0"] == 4 and conn.metrics()["fault_slow_requests"] == 1


def test_faulty_needs_exactly_one_inner_and_valid_probabilities():
    with pytest.raises(ValueError, match="exactly one of 'wraps' or 'inner'"):
        FaultyConnector()
    with pytest.raises(ValueError, match="load_failure_prob"):
        FaultyConnector(wraps=OneStepLoader(), load_failure_prob=1.5)
    with pytest.raises(ValueError, match="connector.wraps"):
        FaultyConnector(wraps={"capacity_gb": 1})


class NoHMA(KVConnector):
    name = "legacy"
    supports_hma = False


def test_connector_without_hma_is_refused_on_a_multi_group_model():
    hybrid = SimpleNamespace(groups=(object(), object()))
    with pytest.raises(ValueError, match=r"Connector NoHMA does not support HMA but HMA is enabled"):
        check_connector_compatible(NoHMA(), hybrid)
    check_connector_compatible(NoHMA(), SimpleNamespace(groups=(object(),)))
    check_connector_compatible(OffloadConnector(capacity_gb=1), hybrid)
    # the wrapper inherits its inner connector's capability
    with pytest.raises(ValueError, match="does not support HMA"):
        check_connector_compatible(FaultyConnector(wraps=NoHMA()), hybrid)


def test_inject_fault_adds_request_ids_and_replaces_probabilities():
    ctx, _ = step_ctx(FA, MAMBA)
    conn = faulty(ctx, fail_loads=["a"], load_failure_prob=0.5)
    conn.inject_fault({"fail_loads": ["b"], "load_failure_prob": 0.0, "drop_mamba": ["m"]})
    assert conn.fail_loads == {"a", "b"} and conn.load_failure_prob == 0.0 and conn.drop_mamba == {"m"}
    with pytest.raises(ValueError, match="connector_fault.slow.x: expected a factor >= 1"):
        conn.inject_fault({"slow": {"x": 0.5}, "fail_loads": ["c"]})
    assert "c" not in conn.fail_loads  # a rejected injection changes nothing
