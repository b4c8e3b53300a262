"""Session metrics (sim.results.sessions) on hand-made tables, and the hit-rate-by-turn plot."""

import numpy as np
import pandas as pd

from sim.analysis.plots import plot_hit_rate_by_turn
from sim.core.kv.hashing import RequestBlockHasher
from sim.core.request import Request
from sim.core.tokens import StreamSegment
from sim.results.sessions import by_turn, session_table, sessions_summary, shared_prefix_tokens


def turns_frame():
    return pd.DataFrame(
        {
            "request_id": ["a1", "a2", "a3", "b1", "b2"],
            "session": ["a1", "a1", "a1", "b1", "b1"],
            "turn": [1, 2, 3, 1, 2],
            "think_s": [np.nan, 2.0, 4.0, np.nan, 1.0],
            "arrival_s": [0.0, 5.0, 12.0, 1.0, 3.0],
            "finished_s": [4.0, 10.0, 15.0, 2.0, np.nan],
            "reusable_tokens": [0, 32, 64, 0, 16],
            "local_hit_tokens": [0, 32, 16, 0, 48],
            "hit_g0": [np.nan, 32, 16, np.nan, 16],
        }
    )


def test_by_turn_weights_by_reusable_tokens_and_caps_hits_at_them():
    table = by_turn(turns_frame()).set_index("turn")
    assert table.loc[1, "usable_hit_rate"] is None or np.isnan(table.loc[1, "usable_hit_rate"])
    # turn 2: (32 + min(48, 16)) / (32 + 16); turn 3: 16 / 64.
    assert table.loc[2, "usable_hit_rate"] == 1.0 and table.loc[3, "usable_hit_rate"] == 0.25
    assert table.loc[2, "usable_hit_g0"] == 1.0 and list(table["n"]) == [2, 2, 1]


def test_session_table_totals_and_unfinished_sessions():
    table = session_table(turns_frame()).set_index("session")
    assert table.loc["a1", "turns"] == 3 and table.loc["a1", "total_latency_s"] == 15.0
    assert table.loc["a1", "think_s"] == 6.0 and table.loc["a1", "usable_hit_rate"] == 48 / 96
    assert np.isnan(table.loc["b1", "total_latency_s"])  # b2 never finished
    summary = sessions_summary("closed", turns_frame(), session_table(turns_frame()))
    assert summary["count"] == 2 and summary["usable_hit_rate"] == (32 + 16 + 16) / (32 + 64 + 16)
    assert summary["think_s_mean"] == 7.0 / 3


def test_shared_prefix_counts_leading_equal_blocks_of_prompt_plus_answer():
    parent = Request("p", (StreamSegment("x", 0, 40),), 3, output_len=3)
    child = Request("c", (StreamSegment("x", 0, 40), StreamSegment("y", 0, 40)), 1, output_len=1)
    for r in (parent, child):
        r.set_block_hasher(RequestBlockHasher(16))
    assert shared_prefix_tokens(child, parent) == 32  # block 2 holds x[32:40] then y (child) vs x (parent)


def test_hit_rate_plot_leaves_out_sparse_turns(tmp_path):
    path = plot_hit_rate_by_turn(turns_frame(), tmp_path / "h.png", group_kinds=["mamba"], min_turns=2)
    assert path.is_file() and path.stat().st_size > 0
    empty = plot_hit_rate_by_turn(turns_frame(), tmp_path / "e.svg", min_turns=10)
    assert "no later turns" in empty.read_text()
