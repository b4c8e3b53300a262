"""``peek_num_new_matched_tokens``: every built-in connector answers as the real call would, with no side effect."""

from __future__ import annotations

from support.connector import FA, MAMBA, request, step_ctx

from sim.connector import ScriptedConnector
from sim.connector.base import NoConnector
from sim.connector.faulty import FaultyConnector
from sim.connector.offload import OffloadConnector
from sim.connector.remote import RemoteConnector


def _same_answers_no_side_effect(conn, req, shown_at):
    before = dict(conn.metrics())
    peeked = [conn.peek_num_new_matched_tokens(req, n) for n in shown_at]
    assert conn.metrics() == before  # no counter moved
    assert peeked == [conn.get_num_new_matched_tokens(req, n)[0] for n in shown_at]
    return peeked


def test_scripted_peek_matches_both_modes():
    ctx, _ = step_ctx(FA, MAMBA)
    conn = ScriptedConnector(matched_tokens={"m": 16}, holds={"h": 64})
    conn.bind(ctx)
    assert _same_answers_no_side_effect(conn, request("m", ("doc", 96)), (0, 64)) == [16, 16]
    assert _same_answers_no_side_effect(conn, request("h", ("doc", 96)), (0, 16, 64)) == [64, 48, 0]
    assert conn.loads == []


def test_offload_peek_counts_no_query():
    ctx, svc = step_ctx(FA)
    conn = OffloadConnector(capacity_gb=1.0, chunk_tokens=32, store="on_finish")
    conn.bind(ctx)
    r0 = request("r0", ("doc", 128))
    r0.num_computed_tokens = 128
    conn.request_finished_all_groups(r0, ([1, 2, 3, 4, 5, 6, 7, 8],))
    svc.advance(svc.step + conn.link_spec.steps)
    conn.get_finished()
    r1 = request("r1", ("doc", 128), ("other", 40))
    queries = conn.metrics()["queries"]
    assert _same_answers_no_side_effect(conn, r1, (0, 32, 112)) == [128, 96, 0]
    assert conn.metrics()["queries"] == queries + 3  # only the three real calls counted


def test_remote_peek_after_the_prefill_handed_the_request_over():
    ctx, svc = step_ctx(FA, MAMBA)
    conn = RemoteConnector(prefill_steps=2)
    conn.bind(ctx)
    r = request("r", ("doc", 100))
    handed: list = []
    assert conn.route_arrival(r, handed.append)
    svc.advance(2)
    assert handed == [r]
    assert _same_answers_no_side_effect(conn, r, (0, 48)) == [99, 51]


def test_faulty_and_none_peek():
    ctx, _ = step_ctx(FA, MAMBA)
    conn = FaultyConnector(wraps={"type": "scripted", "matched_tokens": {"r": 16}})
    conn.bind(ctx)
    assert conn.peek_num_new_matched_tokens(request("r", ("doc", 96)), 32) == 16
    assert (conn.supplies_mamba_state, conn.pulls_unhashed_blocks) == (True, False)
    assert FaultyConnector(wraps={"type": "remote"}).pulls_unhashed_blocks is True
    assert NoConnector().peek_num_new_matched_tokens(request("r", ("doc", 96)), 0) == 0
