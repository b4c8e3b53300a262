"""The shrink moves keep a scenario well formed: what refers to a dropped item goes with it."""

from __future__ import annotations

from dataclasses import replace

from sim.config import scenario_from_text
from sim.config.scenario import Scenario
from sim.shrink import reducers

BASE = """\
name: r
clock: steps
cache: {block_size: 16, num_blocks: 40, groups: [full_attention, mamba, {type: sliding_window, window: 32}]}
connector: {type: scripted, matched_tokens: {a: 16, b: 0}, holds: {}}
workload:
  requests:
    - {id: a, at: 0, prompt: [{content: doc, tokens: 40}], max_tokens: 4, output_len: 3}
    - {id: b, at: 5, prompt: [{content: doc, tokens: 20}, {output_of: a, tokens: 3}], max_tokens: 2}
    - {id: c, at: 9, prompt: [{content: x, tokens: 10}, {content: y, tokens: 30}], max_tokens: 1}
actions:
  - {at: 3, evict: {prefix_of: a, group: 1, blocks: [0, 1]}}
  - {at: 4, evict: {prefix_of: c, group: sliding_window, blocks: [0]}}
  - {at: 6, evict: {prefix_of: a, group: 2, blocks: [1]}}
"""


def _data() -> dict:
    return scenario_from_text(BASE).model_dump(mode="json")


def test_dropping_a_request_drops_its_quoters_actions_and_connector_entries() -> None:
    data = _data()
    keep = [r for r in data["workload"]["requests"] if r["id"] != "a"]
    out = reducers.with_requests(data, keep)
    assert reducers.request_ids(out) == ["c"]  # b quotes a's output
    assert [a["evict"]["prefix_of"] for a in out["actions"]] == ["c"]
    assert out["connector"]["matched_tokens"] == {}
    assert reducers.request_ids(data) == ["a", "b", "c"]  # the input is not mutated
    Scenario.model_validate(out)


def test_truncating_a_prompt_keeps_its_first_tokens_across_segments() -> None:
    prompt = [{"content": "x", "start": 0, "tokens": 10}, {"content": "y", "start": 4, "tokens": 30}]
    assert reducers.truncate_prompt(prompt, 25) == [
        {"content": "x", "start": 0, "tokens": 10},
        {"content": "y", "start": 4, "tokens": 15},
    ]
    assert reducers.truncate_prompt(prompt, 7) == [{"content": "x", "start": 0, "tokens": 7}]


def test_lowering_max_tokens_caps_output_len() -> None:
    out = reducers.with_request_field(_data(), 0, max_tokens=2)
    assert out["workload"]["requests"][0]["max_tokens"] == 2 and out["workload"]["requests"][0]["output_len"] == 2


def test_dropping_a_group_drops_its_evictions_and_renumbers_the_rest() -> None:
    out = reducers.without_group(_data(), 1)
    assert out is not None
    assert [g["type"] for g in out["cache"]["groups"]] == ["full_attention", "sliding_window"]
    assert [(a["at"], a["evict"]["group"]) for a in out["actions"]] == [(4.0, "sliding_window"), (6.0, 1)]
    Scenario.model_validate(out)
    out = reducers.without_group(_data(), 2)
    assert out is not None and [a["at"] for a in out["actions"]] == [3.0]


def test_shifting_moves_every_later_event_by_the_same_steps() -> None:
    out = reducers.shift_from(_data(), 5, 3)
    assert [r["at"] for r in out["workload"]["requests"]] == [0, 2, 6]
    assert [a["at"] for a in out["actions"]] == [3, 4, 3]
    assert reducers.event_times(out) == [0, 2, 3, 4, 6]


def test_a_model_preset_becomes_its_explicit_layout() -> None:
    from sim.engine.build import build_kv_cache_config
    from sim.shrink.convert import to_explicit_groups

    text = """\
name: m
clock: steps
model: {preset: nemotron-h-8b}
cache: {num_blocks: 50}
workload:
  requests:
    - {id: a, at: 0, prompt: [{content: doc, tokens: 100}], max_tokens: 1}
"""
    scenario = scenario_from_text(text)
    config = build_kv_cache_config(scenario)
    out = to_explicit_groups(scenario.model_dump(mode="json"), config)
    assert out is not None and "model" not in out
    explicit = build_kv_cache_config(Scenario.model_validate(out))
    # Same layout; explicit groups carry no page bytes (docs/design.md §7: no page-size unification there).
    assert [g.spec for g in explicit.groups] == [replace(g.spec, page_size_bytes=None) for g in config.groups]
    assert explicit.num_blocks == config.num_blocks


def test_hash_block_prompts_convert_to_per_block_content():
    """A trace prompt held as one StreamBlocksSegment becomes one content entry per trace block."""
    from sim.core.request import Request
    from sim.core.tokens import StreamBlocksSegment
    from sim.shrink.convert import request_entry

    entry = request_entry(3, Request("r", [StreamBlocksSegment("mc:", (7, 8), 16, 20)], 2))
    assert entry is not None
    assert entry["prompt"] == [
        {"content": "mc:7", "start": 0, "tokens": 16},
        {"content": "mc:8", "start": 0, "tokens": 4},
    ]
