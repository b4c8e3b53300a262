"""Closed-loop sessions on the step clock: exact release times (sim.engine.sessions), metrics, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import sim
from sim.cli import app
from sim.trace.atomic import BundleError

HEAD = """
name: sessions
clock: steps
cache: {block_size: 16, num_blocks: 64, groups: [full_attention, mamba]}
scheduler: {max_num_seqs: 4, max_num_batched_tokens: 256, prefix_policy: reconciled}
outputs: {plots: false}
workload:
"""

THREE_TURNS = (
    HEAD
    + """
  sessions: {mode: MODE}
  requests:
    - {id: t1, at: 0, prompt: [{content: chat, tokens: 40}], max_tokens: 3}
    - {id: t2, at: 0, after: t1, think: 2, max_tokens: 2,
       prompt: [{content: chat, tokens: 40}, {output_of: t1, tokens: 3}, {content: u2, tokens: 10}]}
    - {id: t3, at: 0, after: t2, think: 0, max_tokens: 1,
       prompt: [{content: chat, tokens: 40}, {output_of: t1, tokens: 3}, {content: u2, tokens: 10},
                {output_of: t2, tokens: 2}, {content: u3, tokens: 5}]}
"""
)

FAN_JOIN = (
    HEAD.replace("groups: [full_attention, mamba]", "groups: [full_attention]")
    + """
  sessions: {mode: closed}
  requests:
    - {id: plan, prompt: [{content: task, tokens: 32}], max_tokens: 2}
    - {id: b1, after: plan, think: 1, max_tokens: 4,
       prompt: [{content: task, tokens: 32}, {output_of: plan, tokens: 2}, {content: b1, tokens: 8}]}
    - {id: b2, after: plan, think: 3, max_tokens: 1,
       prompt: [{content: task, tokens: 32}, {output_of: plan, tokens: 2}, {content: b2, tokens: 8}]}
    - {id: join, after: [b1, b2], think: 1, max_tokens: 1,
       prompt: [{content: task, tokens: 32}, {output_of: plan, tokens: 2}, {output_of: b1, tokens: 4},
                {output_of: b2, tokens: 1}]}
"""
)


def run_text(text: str, tmp_path: Path, name: str = "s.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return sim.run(path)


def times(result) -> dict[str, tuple]:
    req = result.requests
    return {r: (a, f) for r, a, f in zip(req["request_id"], req["arrival_s"], req["finished_s"])}


def first_step(result, rid: str) -> int:
    sched = result.schedule
    return int(sched.loc[sched["request_id"] == rid, "step"].min())


def test_three_turn_session_releases_each_turn_at_finish_plus_think(tmp_path):
    # t1: 40-token prompt split at block boundaries (Mamba, no checkpoints): 32 in step 0, 8 + token 1 in
    # step 1, tokens 2 and 3 in steps 2 and 3 -> finishes in step 3 (time 4). t2 (think 2) is added just
    # before step 4 + 2 = 6 and finishes in step 8 (time 9); t3 (think 0) is added before step 9.
    result = run_text(THREE_TURNS.replace("MODE", "closed"), tmp_path)
    assert times(result) == {"t1": (0.0, 4.0), "t2": (6.0, 9.0), "t3": (9.0, 10.0)}
    assert [first_step(result, r) for r in ("t2", "t3")] == [6, 9]
    turns = result.session_tables["turns"].set_index("request_id")
    assert list(turns["turn"]) == [1, 2, 3] and list(turns["think_s"].fillna(-1)) == [-1, 2.0, 0.0]
    # t2 reuses t1's prompt + answer (43 tokens: 2 full blocks), t3 reuses t2's (55 tokens: 3 blocks).
    assert list(turns["reusable_tokens"]) == [0, 32, 48]
    assert list(turns["local_hit_tokens"]) == [0, 32, 48]
    session = result.session_tables["sessions"].iloc[0]
    assert (session["turns"], session["total_latency_s"], session["think_s"]) == (3, 10.0, 2.0)
    summary = result.summary["sessions"]
    assert summary["mode"] == "closed" and summary["count"] == 1 and summary["usable_hit_rate"] == 1.0


def test_open_mode_keeps_the_scripted_arrivals(tmp_path):
    result = run_text(THREE_TURNS.replace("MODE", "open"), tmp_path)
    arrivals = {r: a for r, (a, _) in times(result).items()}
    assert arrivals == {"t1": 0.0, "t2": 0.0, "t3": 0.0}
    turns = result.session_tables["turns"].set_index("request_id")
    assert list(turns["turn"]) == [1, 2, 3] and list(turns["think_s"].fillna(-1)) == [-1, 2.0, 0.0]
    assert result.summary["sessions"]["mode"] == "open"


def test_fanout_children_wait_for_the_parent_and_the_join_for_all(tmp_path):
    # plan finishes in step 1 (time 2): b1 (think 1) at 3, b2 (think 3) at 5. b2 finishes at 6, b1 at 7
    # (prefill in step 3, tokens 2-4 in steps 4-6); the join waits for the later one: 7 + 1 = 8.
    result = run_text(FAN_JOIN, tmp_path)
    assert times(result) == {"plan": (0.0, 2.0), "b1": (3.0, 7.0), "b2": (5.0, 6.0), "join": (8.0, 9.0)}
    assert first_step(result, "join") == 8
    turns = result.session_tables["turns"].set_index("request_id")
    assert list(turns["turn"]) == [1, 2, 2, 3] and set(turns["session"]) == {"plan"}


CONCURRENT = (
    HEAD
    + """
  sessions: {mode: closed, concurrency: 2}
  requests:
    - {id: s1, at: 50, prompt: [{content: a, tokens: 8}], max_tokens: 3}
    - {id: s2, at: 60, prompt: [{content: b, tokens: 8}], max_tokens: 1}
    - {id: s3, at: 70, prompt: [{content: c, tokens: 8}], max_tokens: 1}
    - {id: s4, at: 80, prompt: [{content: d, tokens: 8}], max_tokens: 1}
"""
)


def test_concurrency_starts_n_sessions_and_one_more_per_finished_session(tmp_path):
    # s1 and s2 start at 0 (arrival times ignored); s2 ends at 1 -> s3 starts at 1, ends at 2 -> s4 at 2.
    result = run_text(CONCURRENT, tmp_path)
    assert times(result) == {"s1": (0.0, 3.0), "s2": (0.0, 1.0), "s3": (1.0, 2.0), "s4": (2.0, 3.0)}


def write_jsonl(path: Path, rows) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_closed_trace_think_is_recorded_gap_minus_simulated_response(tmp_path):
    rows = [
        {
            "chat_id": 1,
            "parent_chat_id": -1,
            "timestamp": 0,
            "input_length": 40,
            "output_length": 3,
            "hash_ids": [1, 2, 3],
        },
        {
            "chat_id": 2,
            "parent_chat_id": 1,
            "timestamp": 10,
            "input_length": 56,
            "output_length": 1,
            "hash_ids": [1, 2, 3, 4],
        },
        {
            "chat_id": 3,
            "parent_chat_id": 1,
            "timestamp": 2,
            "input_length": 56,
            "output_length": 1,
            "hash_ids": [1, 2, 3, 5],
        },
    ]
    write_jsonl(tmp_path / "qw.jsonl", rows)
    text = (
        HEAD.replace("groups: [full_attention, mamba]", "groups: [full_attention]")
        + """
  trace: {format: qwen, path: qw.jsonl}
  sessions: {mode: closed, min_think: 1}
"""
    )
    result = run_text(text, tmp_path)
    # q1 finishes at 3 (a response of 3 steps). q2: recorded gap 10 - 3 = think 7 -> released at 10, as
    # recorded. q3: gap 2 - 3 < min_think 1 -> released at 3 + 1 = 4, later than its recorded 2.
    got = times(result)
    assert got["q1"] == (0.0, 3.0) and got["q2"][0] == 10.0 and got["q3"][0] == 4.0
    turns = result.session_tables["turns"].set_index("request_id")
    assert turns.loc["q2", "think_s"] == 7.0 and turns.loc["q3", "think_s"] == 1.0


def test_hit_rate_by_turn_plot_is_written(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(THREE_TURNS.replace("MODE", "closed").replace("plots: false", "plots: true"))
    result = sim.run(path, tmp_path / "out")
    assert (tmp_path / "out" / "plots" / "hit_rate_by_turn.png").is_file()
    assert tmp_path / "out" / "plots" / "hit_rate_by_turn.png" in result.plots


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_session_tables_are_written_to_the_bundle_and_load_back(tmp_path, fmt):
    text = THREE_TURNS.replace("MODE", "closed").replace("plots: false", f"plots: false, tables_format: {fmt}")
    result = run_text(text, tmp_path)
    out = tmp_path / "out"
    sim.write_bundle(result, out)
    assert sorted(p.name for p in (out / "sessions").iterdir()) == [f"sessions.{fmt}", f"turns.{fmt}"]
    loaded = sim.load_result(out)  # verifies the manifest, which covers sessions/ too
    for name in ("turns", "sessions"):
        want, got = result.session_tables[name].reset_index(drop=True), loaded.session_tables[name]
        assert list(got.columns) == list(want.columns) and len(got) == len(want)
        assert list(got["session"].astype(str)) == list(want["session"].astype(str))
    assert list(loaded.session_tables["turns"]["reusable_tokens"]) == [0, 32, 48]
    (out / "sessions" / f"turns.{fmt}").write_bytes(b"tampered")
    with pytest.raises(BundleError, match="turns"):
        sim.load_result(out)


BAD = {
    "circular": (
        (
            "    - {id: a, after: b, prompt: [{content: x, tokens: 8}], max_tokens: 1}\n"
            "    - {id: b, after: a, prompt: [{content: x, tokens: 8}], max_tokens: 1}\n"
        ),
        "{mode: closed}",
        ("workload.sessions", "circular parents", "'a', 'b'"),
    ),
    "dangling": (
        "    - {id: a, after: nobody, prompt: [{content: x, tokens: 8}], max_tokens: 1}\n",
        "{mode: closed}",
        ("workload.sessions", "'nobody'", "dangling"),
    ),
    "negative-think": (
        (
            "    - {id: a, prompt: [{content: x, tokens: 8}], max_tokens: 1}\n"
            "    - {id: b, after: a, think: -3, prompt: [{content: x, tokens: 8}], max_tokens: 1}\n"
        ),
        "{mode: closed}",
        ("workload.requests.1.think", ">= 0"),
    ),
    "concurrency-zero": (
        "    - {id: a, prompt: [{content: x, tokens: 8}], max_tokens: 1}\n",
        "{mode: closed, concurrency: 0}",
        ("workload.sessions.concurrency", ">= 1"),
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_session_input_exits_2_with_one_line_naming_the_key(case, tmp_path):
    rows, sessions, fragments = BAD[case]
    path = tmp_path / f"{case}.yaml"
    path.write_text(HEAD + f"  sessions: {sessions}\n  requests:\n" + rows)
    res = CliRunner().invoke(app, ["run", str(path), "-o", str(tmp_path / "out"), "--no-plots", "-q"])
    assert res.exit_code == 2, res.output
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in res.output, res.stderr
    for fragment in (f"{case}.yaml", *fragments):
        assert fragment in lines[0], (fragment, lines[0])
