"""Checkpoint placements (sim.core.policy.checkpoint): save positions pinned on hand-built prefix trees,
the caller's filter, the registry and its errors."""

from __future__ import annotations

import sys
from importlib.metadata import EntryPoint

import pytest

import sim.core.registry
from sim.core.kv.hashing import RequestBlockHasher
from sim.core.kv.specs import prefill_checkpoint_position
from sim.core.policy import checkpoint as cp
from sim.core.request import Request
from sim.core.tokens import StreamBlocksSegment, StreamSegment

B = 16


def _request(rid: str, *parts: tuple[str, int]) -> Request:
    """A prompt of stream segments ``(content, tokens)``, hashed at ``B``."""
    req = Request(rid, tuple(StreamSegment(c, 0, n) for c, n in parts), max_tokens=4, arrival_time=0.0)
    req.set_block_hasher(RequestBlockHasher(B))
    return req


def _facts(req: Request, fa_hit: int = 0, resume: int = 0) -> cp.PrefixFacts:
    state = prefill_checkpoint_position(req.num_prompt_tokens, B)
    return cp.PrefixFacts(B, req.block_hashes[: state // B], fa_hit, resume, state)


def _saves(policy: cp.BaseCheckpointPolicy, req: Request, fa_hit: int = 0, resume: int = 0) -> tuple[int, ...]:
    return cp.extra_state_positions(policy, req, _facts(req, fa_hit, resume))


# A prefix tree (B = 16): a shared system prompt S (40 tokens), then two documents, then questions.
#
#   S(40) ─┬─ D1(50) ── q1(9)     r1: 99 tokens, prompt state at 96
#          └─ D2(30) ── q2(20)    r2: 90 tokens, prompt state at 80
#
# Content boundaries: r1 at 40, 90, 99; r2 at 40, 70, 90.


def test_content_boundaries_are_segment_ends_and_a_trace_run_ends_where_its_partial_block_starts():
    assert cp.content_boundaries([StreamSegment("s", 0, 40), StreamSegment("d", 0, 50)]) == [40, 90]
    run = StreamBlocksSegment("mc:", (1, 2, 3), 512, 1200)  # two full blocks, a partial one of 176 tokens
    assert cp.content_boundaries([run]) == [1024, 1200]
    assert cp.content_boundaries([StreamBlocksSegment("mc:", (1, 2), 512, 1024)]) == [1024]


def test_branch_points_saves_at_visible_boundaries_floored_to_the_block():
    policy = cp.BranchPointsPolicy()
    r1 = _request("r1", ("S", 40), ("D1", 50), ("q1", 9))
    # 40 -> 32, 90 -> 80; 99 -> 96 is the prompt's own state (vLLM's): not extra.
    assert _saves(policy, r1) == (32, 80)
    r2 = _request("r2", ("S", 40), ("D2", 30), ("q2", 20))
    # r2 resumes at 32 (r1's state at the end of S): 40 -> 32 is not above it; 70 -> 64; 90 -> 80 = prompt state.
    assert _saves(policy, r2, fa_hit=32, resume=32) == (64,)


def test_branch_points_saves_at_the_deepest_fa_prefix_when_deeper_than_the_resume_point():
    policy = cp.BranchPointsPolicy()
    # One segment: no inner boundary. FA matched 64 tokens of an earlier prompt, no state there.
    req = _request("r", ("X", 100))
    assert _saves(policy, req) == ()
    assert _saves(policy, req, fa_hit=64, resume=16) == (64,)
    assert _saves(policy, req, fa_hit=64, resume=64) == ()


def test_branch_points_on_a_conversation_turn_saves_where_the_next_turn_branches():
    # A trace turn with 12-token hash blocks at B = 16: five full blocks (60 tokens) and a partial one (6).
    # The next turn re-sends the full blocks only, so it shares 60 tokens (48 at B = 16); vLLM's own state
    # is at 64, beyond what the next turn shares. branch_points saves at 60 -> 48.
    turn = Request("t1", (StreamBlocksSegment("mc:", (1, 2, 3, 4, 5, 6), 12, 66),), max_tokens=2, arrival_time=0.0)
    facts = cp.PrefixFacts(B, (), 0, 0, prefill_checkpoint_position(66, B))
    assert facts.prompt_state == 64
    assert cp.extra_state_positions(cp.BranchPointsPolicy(), turn, facts) == (48,)
    # When the partial tail does not cross a block boundary the two coincide: nothing extra.
    short = Request("t0", (StreamBlocksSegment("mc:", (1, 2, 3, 4, 7), 12, 52),), max_tokens=2, arrival_time=0.0)
    facts = cp.PrefixFacts(B, (), 0, 0, prefill_checkpoint_position(52, B))
    assert cp.extra_state_positions(cp.BranchPointsPolicy(), short, facts) == ()


def test_every_block_saves_every_boundary_between_the_resume_point_and_the_prompt_state():
    req = _request("r", ("X", 100))  # prompt state 96
    assert _saves(cp.EveryBlockPolicy(), req) == (16, 32, 48, 64, 80)
    assert _saves(cp.EveryBlockPolicy(), req, fa_hit=48, resume=48) == (64, 80)
    assert _saves(cp.EveryBlockPolicy(stride=2), req) == (32, 64)
    assert _saves(cp.EveryBlockPolicy(stride=2), req, resume=32) == (64,)
    assert _saves(cp.EveryBlockPolicy(stride=3), req, resume=16) == (48,)


def test_frequency_saves_once_a_prefix_was_seen_k_times():
    policy = cp.FrequencyPolicy(k=2)
    r1 = _request("r1", ("S", 40), ("D1", 50), ("q1", 9))
    r2 = _request("r2", ("S", 40), ("D2", 30), ("q2", 20))
    r3 = _request("r3", ("S", 40), ("D2", 30), ("q3", 20))
    for req in (r1, r2, r3):
        policy.on_arrival(req, _facts(req).block_hashes)
    # S's blocks (16, 32) were seen 3 times; r2/r3 share S+D2 up to 70 tokens (blocks ending at 48, 64) twice.
    assert _saves(policy, r1) == (16, 32)
    assert _saves(policy, r2) == (16, 32, 48, 64)
    assert _saves(policy, r3, fa_hit=64, resume=32) == (48, 64)
    assert _saves(cp.FrequencyPolicy(k=4), r1) == ()
    assert policy.count(r1.block_hashes[0]) == 3


def test_frequency_forgets_the_least_recently_counted_prefixes_beyond_its_bound():
    policy = cp.FrequencyPolicy(k=1, max_prefixes=2)
    req = _request("r", ("X", 100))
    hashes = _facts(req).block_hashes
    policy.on_arrival(req, hashes)
    assert [policy.count(h) for h in hashes] == [0, 0, 0, 0, 1, 1]
    assert _saves(policy, req) == (80,)  # 96 is the prompt state


def test_the_filter_keeps_block_multiples_strictly_inside_and_sorts():
    class Scatter(cp.BaseCheckpointPolicy):
        name = "scatter"

        def positions(self, request, facts):
            return [80, 7, 0, 32, 32, 96, 112, 16]

    req = _request("r", ("X", 100))
    assert _saves(Scatter(), req, resume=16) == (32, 80)


def test_vllm_is_no_object_and_everything_else_is_a_what_if_refused_by_verify():
    assert cp.create_checkpoint_policy("vllm") is None
    assert cp.checkpoint_not_verifiable_reason("vllm") is None
    names = cp.builtin_checkpoint_policy_names()  # an installed plug-in may well mirror vLLM
    assert {"vllm", "branch_points", "every_block", "frequency"} <= set(names)
    for name in names:
        if name == "vllm":
            continue
        policy = cp.create_checkpoint_policy(name)
        assert policy is not None and policy.mirrors_vllm is False
        reason = cp.checkpoint_not_verifiable_reason(name)
        assert reason is not None and "what-if" in reason and name in reason


def test_bad_names_and_options_name_the_key():
    with pytest.raises(ValueError, match=r"cache.mamba_checkpoint_policy: unknown checkpoint policy 'nope'; valid: "):
        cp.create_checkpoint_policy("nope")
    with pytest.raises(ValueError, match=r"cache.mamba_checkpoint_options: vllm takes no options"):
        cp.create_checkpoint_policy("vllm", {"k": 2})
    with pytest.raises(ValueError, match=r"cache.mamba_checkpoint_options.j: unknown option"):
        cp.create_checkpoint_policy("frequency", {"j": 2})
    with pytest.raises(ValueError, match=r"cache.mamba_checkpoint_options: frequency: option k must be a positive"):
        cp.create_checkpoint_policy("frequency", {"k": 0})
    with pytest.raises(ValueError, match=r"option stride must be a positive integer, got True"):
        cp.create_checkpoint_policy("every_block", {"stride": True})


class _PluginPlacement(cp.BaseCheckpointPolicy):
    name = "plugin_placement"

    def positions(self, request, facts):
        return [facts.block_size]


def test_a_plug_in_loads_through_its_entry_point(monkeypatch):
    module = type(sys)("fake_placement_plugin")
    module.Placement = _PluginPlacement  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "fake_placement_plugin", module)
    ep = EntryPoint("plugin_placement", "fake_placement_plugin:Placement", cp.ENTRY_POINT_GROUP)
    monkeypatch.setattr(sim.core.registry, "entry_points", lambda group: [ep] if group == cp.ENTRY_POINT_GROUP else [])
    assert "plugin_placement" in cp.checkpoint_policy_names()
    policy = cp.create_checkpoint_policy("plugin_placement")
    assert isinstance(policy, _PluginPlacement)
    assert _saves(policy, _request("r", ("X", 100))) == (16,)
    assert "what-if" in (cp.checkpoint_not_verifiable_reason("plugin_placement") or "")


def test_the_junction_is_not_an_extra_state():
    req = _request("r", ("X", 100))
    state = prefill_checkpoint_position(100, B)
    facts = cp.PrefixFacts(B, (), 64, 16, state, junction=64)
    assert cp.extra_state_positions(cp.EveryBlockPolicy(), req, facts) == (32, 48, 80)
    assert cp.extra_state_positions(cp.BranchPointsPolicy(), req, facts) == ()
