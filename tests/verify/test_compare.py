"""First difference and side-by-side table of two decision traces (no vLLM needed)."""

from __future__ import annotations

import copy
import csv

from sim.verify.compare import first_difference, write_table


def _trace():
    adm = {
        "request": "r0",
        "kind": "first",
        "hits": [0, 0],
        "local": 0,
        "external": 0,
        "hit_diverged": False,
        "fallback": False,
        "result": "admitted",
    }
    return {
        "steps": [
            {
                "step": 0,
                "scheduled": [["r0", 32]],
                "preempted": [],
                "admissions": [adm],
                "kv_events": [
                    {"kind": "stored", "group": 0, "block_id": 1, "hash": 0},
                    {"kind": "stored", "group": 1, "block_id": 2, "hash": 0},
                ],
            },
            {"step": 3, "scheduled": [["r0", 1]], "preempted": [], "admissions": [], "kv_events": []},
        ],
        "crash": None,
        "finished": {"r0": 2},
        "num_steps": 4,
        "stopped": "",
    }


def test_identical_traces_have_no_difference():
    assert first_difference(_trace(), _trace()) is None


def test_block_id_difference_names_step_and_event():
    other = _trace()
    other["steps"][0]["kv_events"][1]["block_id"] = 3
    diff = first_difference(_trace(), other)
    assert diff is not None and diff.step == 0 and diff.what == "kv_events[1].block_id"
    text = diff.describe()
    assert "first difference at step 0: kv_events[1].block_id" in text and "vllm" in text


def test_admission_fields_come_before_events_and_a_missing_step_counts():
    other = _trace()
    other["steps"][0]["admissions"][0]["hits"] = [16, 0]
    other["steps"][0]["kv_events"] = []
    assert first_difference(_trace(), other).what == "admissions[0].hits"
    late = _trace()
    late["steps"][1]["step"] = 4
    diff = first_difference(_trace(), late)
    assert diff.step == 3 and diff.what == "scheduled[0]" and diff.theirs is None


def test_crash_in_the_differing_step_is_named():
    other = _trace()
    other["steps"][1]["scheduled"] = []
    other["crash"] = {
        "step": 3,
        "request": "r0",
        "type": "ValueError",
        "message": "Cannot get 1 free blocks from the pool",
    }
    diff = first_difference(_trace(), other)
    assert diff.what == "crash" and diff.step == 3 and diff.ours is None and diff.theirs["type"] == "ValueError"


def test_same_steps_different_crash_message_or_finished():
    a, b = _trace(), _trace()
    a["crash"] = {"step": 3, "request": "r0", "type": "AssertionError", "message": "num_new_tokens > 0"}
    b["crash"] = copy.deepcopy(a["crash"])
    assert first_difference(a, b) is None
    b["crash"]["message"] = "num_computed_tokens <= request.num_tokens"
    assert first_difference(a, b).what == "crash"
    c = _trace()
    c["finished"] = {"r0": 1}
    assert first_difference(_trace(), c).what == "finished requests"


def test_table_has_one_row_per_item_and_marks_differences(tmp_path):
    other = _trace()
    other["steps"][0]["kv_events"][1]["block_id"] = 3
    path = write_table(tmp_path / "t.csv", _trace(), other)
    rows = list(csv.DictReader(path.open()))
    assert [(r["step"], r["item"], r["same"]) for r in rows[:5]] == [
        ("0", "admissions", "True"),
        ("0", "scheduled", "True"),
        ("0", "kv_events", "True"),
        ("0", "kv_events", "False"),
        ("3", "scheduled", "True"),
    ]
    assert rows[-2]["item"] == "crash" and rows[-1]["item"] == "finished"
