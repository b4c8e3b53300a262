"""The scripted connector (docs/design.md §4) and the connector registry."""

from __future__ import annotations

import numpy as np
import pytest

from sim.connector import NoConnector, ScriptedConnector, connector_names, create_connector
from sim.connector.context import ConnectorContext, GroupLayout
from sim.core.request import Request
from sim.core.tokens import StreamSegment


def _req(rid: str, n: int) -> Request:
    return Request(rid, [StreamSegment("doc", 0, n)], max_tokens=4)


def _bound(conn: ScriptedConnector, block_size: int = 16) -> ScriptedConnector:
    ctx = ConnectorContext(
        groups=(GroupLayout(0, "full_attention", block_size, 0),),
        clock="steps",
        rng=np.random.default_rng(0),
        transfers=None,
    )
    conn.bind(ctx)
    return conn


def test_matched_tokens_are_verbatim_uncapped_and_repeat():
    conn = ScriptedConnector(matched_tokens={"a": 80, "b": 7})
    a = _req("a", 80)
    # No cap at num_tokens - 1, no alignment, whatever local hit it is shown, every time.
    assert conn.get_num_new_matched_tokens(a, 0) == (80, False)
    assert conn.get_num_new_matched_tokens(a, 64) == (80, False)
    assert conn.get_num_new_matched_tokens(_req("b", 80), 16) == (7, False)
    assert conn.get_num_new_matched_tokens(_req("unlisted", 80), 0) == (0, False)


def test_holds_mode_is_capped_and_block_aligned():
    conn = _bound(ScriptedConnector(holds={"a": 100, "b": 40}))
    a = _req("a", 80)  # holds 100 > prompt: capped at 79, aligned to 64
    assert conn.get_num_new_matched_tokens(a, 0) == (64, False)
    assert conn.get_num_new_matched_tokens(a, 32) == (32, False)
    assert conn.get_num_new_matched_tokens(a, 64) == (0, False)
    b = _req("b", 80)  # holds 40: aligned to 32
    assert conn.get_num_new_matched_tokens(b, 16) == (16, False)
    assert conn.get_num_new_matched_tokens(b, 48) == (0, False)


def test_holds_mode_needs_a_binding():
    with pytest.raises(RuntimeError, match="bind"):
        ScriptedConnector(holds={"a": 32}).get_num_new_matched_tokens(_req("a", 80), 0)


def test_async_loads_complete_after_async_load_steps():
    conn = ScriptedConnector(matched_tokens={"a": 32, "b": 0}, load_async={"a": True, "b": True}, async_load_steps=2)
    a = _req("a", 80)
    assert conn.get_num_new_matched_tokens(a, 0) == (32, True)
    # Zero external tokens is never asynchronous (vLLM's contract).
    assert conn.get_num_new_matched_tokens(_req("b", 80), 0) == (0, False)
    conn.update_state_after_alloc(a, None, 32)
    assert conn.get_finished() == (set(), set())
    assert conn.get_finished() == ({"a"}, set())
    assert conn.get_finished() == (set(), set())
    assert conn.loads == [("a", 32)]


def test_bad_options_name_the_key():
    with pytest.raises(ValueError, match=r"connector.matched_tokens.a"):
        ScriptedConnector(matched_tokens={"a": -1})
    with pytest.raises(ValueError, match="both matched_tokens and holds"):
        ScriptedConnector(matched_tokens={"a": 1}, holds={"a": 2})
    with pytest.raises(ValueError, match="connector.async_load_steps"):
        ScriptedConnector(async_load_steps=0)
    with pytest.raises(ValueError, match=r"connector.bogus: unknown option \(valid: type, async_load_steps, holds"):
        create_connector("scripted", bogus=1)
    with pytest.raises(ValueError, match=r"connector.holdz: unknown option \(did you mean 'holds'\?\)"):
        create_connector("scripted", holdz={})
    with pytest.raises(
        ValueError, match="connector.supports_divergent_local_hybrid_hits: must be true or false, got 'yes please'"
    ):
        create_connector("scripted", supports_divergent_local_hybrid_hits="yes please")


def test_registry():
    assert {"none", "scripted"} <= set(connector_names())
    assert isinstance(create_connector("none"), NoConnector)
    conn = create_connector("scripted", matched_tokens={"x": 16}, supports_divergent_local_hybrid_hits=True)
    assert conn.supports_divergent_local_hybrid_hits and conn.supports_hma
    with pytest.raises(
        ValueError, match=r"connector.type: unknown connector 'nope' \(did you mean 'none'\?\); valid: .*none.*scripted"
    ):
        create_connector("nope")
