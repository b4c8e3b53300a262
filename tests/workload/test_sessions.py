"""Session annotation (sim.workload.sessions): parents, sessions, turns, think times, inference, bad input."""

import json

import pydantic
import pytest

from sim.workload import WorkloadError
from sim.workload.spec import SessionSpec


def meta(requests, *keys):
    return {r.request_id: tuple(r.metadata[k] for k in keys) for r in requests}


def seg(content, tokens):
    return {"content": content, "tokens": tokens}


def script(*rows, **sessions):
    return {"requests": list(rows), "sessions": {"mode": "closed", **sessions}}


def test_script_after_and_think_give_parents_sessions_and_turns(build):
    reqs = build(
        script(
            {"id": "a", "prompt": [seg("x", 8)], "max_tokens": 1},
            {"id": "b", "after": "a", "think": 2.5, "prompt": [seg("x", 9)], "max_tokens": 1},
            {"id": "c", "after": ["a", "b"], "prompt": [seg("x", 10)], "max_tokens": 1},
            {"id": "z", "prompt": [seg("y", 8)], "max_tokens": 1},
        )
    )
    assert meta(reqs, "session", "session_turn", "parents", "think_s") == {
        "a": ("a", 1, [], None),
        "b": ("a", 2, ["a"], 2.5),
        "c": ("a", 3, ["a", "b"], 0.0),
        "z": ("z", 1, [], None),
    }


def test_step_clock_floors_think_and_min_think_floors_it(build):
    rows = (
        {"id": "a", "prompt": [seg("x", 8)], "max_tokens": 1},
        {"id": "b", "after": "a", "think": 2.7, "prompt": [seg("x", 9)], "max_tokens": 1},
        {"id": "c", "after": "b", "think": 0.5, "prompt": [seg("x", 9)], "max_tokens": 1},
    )
    assert meta(build(script(*rows), clock="steps"), "think_s")["b"] == (2.0,)
    floored = meta(build(script(*rows, min_think=1.0)), "think_s")
    assert floored["b"] == (2.7,) and floored["c"] == (1.0,)


def test_think_time_override_is_drawn_per_dependent(build):
    rows = [{"id": "a", "prompt": [seg("x", 8)], "max_tokens": 1}] + [
        {"id": f"t{i}", "after": "a", "think": 100, "prompt": [seg("x", 9)], "max_tokens": 1} for i in range(20)
    ]
    reqs = build(script(*rows, think_time={"dist": "uniform", "low": 1, "high": 2}))
    thinks = [r.metadata["think_s"] for r in reqs if r.metadata["parents"]]
    assert len(set(thinks)) == 20 and all(1 <= t <= 2 for t in thinks)
    again = build(script(*rows, think_time={"dist": "uniform", "low": 1, "high": 2}))
    assert thinks == [r.metadata["think_s"] for r in again if r.metadata["parents"]]


GEN = {"count": 3, "output": 4, "arrivals": {"process": "poisson", "rate": 1.0}}


def test_multi_turn_turns_chain_with_the_generator_think_times(build):
    structure = {
        "kind": "multi_turn",
        "turns": 3,
        "first_len": 20,
        "user_len": 5,
        "think_time": {"dist": "exponential", "mean": 3.0},
    }
    reqs = build({"generator": {**GEN, "structure": structure}, "sessions": {"mode": "closed"}})
    by_id = {r.request_id: r for r in reqs}
    assert meta([by_id["c1t3"]], "session", "session_turn", "parents")["c1t3"] == ("c1t1", 3, ["c1t2"])
    assert by_id["c1t3"].metadata["think_s"] == by_id["c1t3"].metadata["think_time"]


def test_fanout_join_quotes_every_branch_and_leaves_branches_unchanged(build):
    structure = {"kind": "fanout", "context_len": 30, "branches": 3, "branch_len": 5}
    plain = build({"generator": {**GEN, "structure": structure}})
    joined = build(
        {
            "generator": {**GEN, "structure": {**structure, "join_len": 7, "join_think": 2}},
            "sessions": {"mode": "closed"},
        }
    )
    branches = [r for r in joined if not r.request_id.endswith("j")]
    assert [(r.request_id, r.arrival_time, r.segments()) for r in branches] == [
        (r.request_id, r.arrival_time, r.segments()) for r in plain
    ]
    join = next(r for r in joined if r.request_id == "a1j")
    assert join.metadata["parents"] == ["a1b0", "a1b1", "a1b2"]
    assert join.metadata["session"] == "a1b0" and join.metadata["session_turn"] == 2
    assert join.metadata["think_s"] == 2.0
    assert join.num_prompt_tokens == 30 + 3 * 4 + 7
    assert {r.metadata["session"] for r in branches if r.metadata["task"] == 1} == {"a1b0"}


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path.name


def test_mooncake_turns_are_inferred_from_full_block_prefixes(build, tmp_path):
    rows = [
        {"timestamp": 0, "input_length": 1100, "output_length": 5, "hash_ids": [0, 1, 2]},  # mc1: root
        {"timestamp": 1000, "input_length": 1600, "output_length": 5, "hash_ids": [0, 1, 3, 4]},  # mc2: after mc1
        {"timestamp": 2000, "input_length": 600, "output_length": 5, "hash_ids": [0, 9]},  # mc3: shares 1
        {"timestamp": 3000, "input_length": 2100, "output_length": 5, "hash_ids": [0, 1, 3, 4, 5]},  # mc4: mc2
        {"timestamp": 4000, "input_length": 1100, "output_length": 5, "hash_ids": [0, 1, 7]},  # mc5: mc1
    ]
    name = write_jsonl(tmp_path / "mc.jsonl", rows)
    reqs = build({"trace": {"format": "mooncake", "path": name}, "time_scale": 2.0, "sessions": {"mode": "closed"}})
    got = meta(reqs, "parents", "gap_s", "session")
    assert got == {
        "mc1": ([], None, "mc1"),
        "mc2": (["mc1"], 2.0, "mc1"),
        "mc3": ([], None, "mc3"),  # one shared block (the system prompt) is not a turn
        "mc4": (["mc2"], 4.0, "mc1"),  # the deepest match wins over mc1
        "mc5": (["mc1"], 8.0, "mc1"),  # mc1's partial last block does not count
    }
    deeper = build(
        {"trace": {"format": "mooncake", "path": name}, "sessions": {"mode": "closed", "min_shared_blocks": 3}}
    )
    assert meta(deeper, "parents")["mc2"] == ([],) and meta(deeper, "parents")["mc4"] == (["mc2"],)


QWEN = [
    {
        "chat_id": 1,
        "parent_chat_id": -1,
        "timestamp": 0.0,
        "input_length": 20,
        "output_length": 3,
        "hash_ids": [1, 2],
        "type": "text",
        "turn": 1,
    },
    {
        "chat_id": 2,
        "parent_chat_id": 1,
        "timestamp": 4.0,
        "input_length": 40,
        "output_length": 3,
        "hash_ids": [1, 2, 3],
        "type": "text",
        "turn": 2,
    },
    {
        "chat_id": 3,
        "parent_chat_id": 7,
        "timestamp": 5.0,
        "input_length": 20,
        "output_length": 3,
        "hash_ids": [5, 6],
        "type": "text",
        "turn": 2,
    },
]


def test_qwen_dangling_parent_is_an_error_or_a_root(build, tmp_path):
    name = write_jsonl(tmp_path / "qw.jsonl", QWEN)
    with pytest.raises(WorkloadError, match=r"workload.sessions: request 'q3' waits for 'q7'.*orphans: root"):
        build({"trace": {"format": "qwen", "path": name}, "sessions": {"mode": "closed"}})
    reqs = build({"trace": {"format": "qwen", "path": name}, "sessions": {"mode": "closed", "orphans": "root"}})
    assert meta(reqs, "parents", "gap_s") == {"q1": ([], None), "q2": (["q1"], 4.0), "q3": ([], None)}


def test_circular_parents_are_an_error_naming_the_requests(build):
    rows = (
        {"id": "a", "after": "b", "prompt": [seg("x", 8)], "max_tokens": 1},
        {"id": "b", "after": "a", "prompt": [seg("x", 8)], "max_tokens": 1},
        {"id": "c", "prompt": [seg("x", 8)], "max_tokens": 1},
    )
    with pytest.raises(WorkloadError, match=r"workload.sessions: circular parents among requests 'a', 'b'"):
        build(script(*rows))
    with pytest.raises(WorkloadError, match="circular"):
        build(script({"id": "s", "after": "s", "prompt": [seg("x", 8)], "max_tokens": 1}))


@pytest.mark.parametrize(
    "bad, key",
    [
        ({"concurrency": 0}, "concurrency"),
        ({"min_think": -1}, "min_think"),
        ({"think_time": -2}, "think_time"),
        ({"mode": "open", "concurrency": 2}, "'concurrency' needs mode: closed"),
    ],
)
def test_bad_session_keys_are_refused_naming_the_key(bad, key):
    with pytest.raises(pydantic.ValidationError, match=key):
        SessionSpec.model_validate(bad)


def test_negative_script_think_is_refused(build):
    with pytest.raises(pydantic.ValidationError, match="think"):
        build(
            script(
                {"id": "a", "prompt": [seg("x", 8)], "max_tokens": 1},
                {"id": "b", "after": "a", "think": -1, "prompt": [seg("x", 8)], "max_tokens": 1},
            )
        )


def test_without_sessions_no_session_keys_are_added(build):
    reqs = build({"requests": [{"id": "a", "prompt": [seg("x", 8)], "max_tokens": 1}]})
    assert "session" not in reqs[0].metadata
