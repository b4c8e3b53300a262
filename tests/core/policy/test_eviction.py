"""Eviction policies (sim.core.policy.eviction): exact eviction order on hand-built pools, registry, options."""

from __future__ import annotations

import re
import sys
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest
from support.registries import Valid

import sim.core.registry
from sim.core.kv.eviction import EvictionContext, PolicyBlockPool, make_block_pool
from sim.core.kv.specs import kv_cache_config_from_groups
from sim.core.policy import eviction as ev

FA_MAMBA = ["full_attention", "mamba"]
EXAMPLE_SRC = Path(__file__).resolve().parents[3] / "examples" / "eviction" / "src"


def _pool(policy: str, groups=FA_MAMBA, connector: bool = False, num_blocks: int = 12, **options) -> PolicyBlockPool:
    config = kv_cache_config_from_groups(groups, block_size=16, num_blocks=num_blocks, retention_interval=None)
    pol = ev.create_eviction_policy(policy, options)
    assert pol is not None
    ctx = EvictionContext(connector_attached=connector, prefill_flops=lambda p: float(p))
    pool = make_block_pool(config, True, True, pol, ctx)
    assert isinstance(pool, PolicyBlockPool)
    return pool


def _chain(pool: PolicyBlockPool):
    """FA blocks a1..a3 (keys 11, 12, 13 at 16, 32, 48 tokens) and the Mamba state m at key 12 (32 tokens).

    Freed as vLLM frees them: the state first (the request moved past it), then the FA table tail first.
    Free queue afterwards: 7 uncached blocks, then m, a3, a2, a1 (LRU evicts m first).
    """
    a1, a2, a3, m = pool.get_new_blocks(4, "r")
    pool.cache_full_blocks("r", [a1, a2, a3], [11, 12, 13], 0, 3, 16, 0)
    pool.cache_partial_block("r", m, 12, 32, 1)
    pool.free_blocks([m])
    pool.free_blocks([a3, a2, a1])
    names = {a1.block_id: "a1", a2.block_id: "a2", a3.block_id: "a3", m.block_id: "m"}
    return names


def _eviction_order(pool: PolicyBlockPool, names: dict[int, str], per_call: int = 1) -> list[str]:
    uncached = sum(1 for b in pool.free_block_queue if b.block_hash is None)
    pool.get_new_blocks(uncached, "fill")
    order: list[str] = []
    while pool.get_num_free_blocks():
        order += [names[b.block_id] for b in pool.get_new_blocks(min(per_call, pool.get_num_free_blocks()), "x")]
    return order


def test_group_coherent_evicts_the_fa_tail_beyond_the_state_first_then_peels():
    pool = _pool("group_coherent")
    names = _chain(pool)
    # a3 lies beyond the only state (dead); then nothing is dead: LRU takes m; then a2 has lost its
    # state (dead), then a1.
    assert _eviction_order(pool, names) == ["a3", "m", "a2", "a1"]


def test_group_coherent_with_a_connector_keeps_fa_tails_and_is_lru_here():
    pool = _pool("group_coherent", connector=True)
    names = _chain(pool)
    assert _eviction_order(pool, names) == ["m", "a3", "a2", "a1"]


def test_group_coherent_evicts_a_state_whose_fa_prefix_is_gone_and_orphaned_fa_blocks():
    pool = _pool("group_coherent", connector=True)  # connector: only the broken-chain rules apply
    (o,) = pool.get_new_blocks(1, "o")
    pool.cache_full_blocks("o", [o], [91], 0, 1, 16, 0)
    pool.free_blocks([o])  # an older, live FA block (a connector may complete it)
    names = _chain(pool) | {o.block_id: "o"}
    a2 = next(b for b in pool.blocks if names.get(b.block_id) == "a2")
    a1 = next(b for b in pool.blocks if names.get(b.block_id) == "a1")
    pool.touch([a1])  # a request holds a1
    pool.evict_blocks([a2.block_id])  # the FA block at 32 is gone: m (key 12) and a3 (parent 12) are dead
    assert pool.free_block_queue.block_ids()[0] == a2.block_id  # uncached now: to the front
    assert _eviction_order(pool, names) == ["m", "a3", "o"]  # LRU: o, m, a3


def test_group_coherent_other_mamba_groups_state_missing_is_dead():
    pool = _pool("group_coherent", groups=["full_attention", "mamba", "mamba"], connector=True)
    a1, a2, m1, m2 = pool.get_new_blocks(4, "r")
    pool.cache_full_blocks("r", [a1, a2], [11, 12], 0, 2, 16, 0)
    pool.cache_partial_block("r", m1, 12, 32, 1)
    pool.cache_partial_block("r", m2, 12, 32, 2)
    pool.free_blocks([m1])
    pool.free_blocks([m2])
    pool.free_blocks([a2, a1])
    names = {a1.block_id: "a1", a2.block_id: "a2", m1.block_id: "m1", m2.block_id: "m2"}
    # LRU takes m1; m2's boundary then misses group 1's state: dead, before the older-looking FA blocks.
    assert _eviction_order(pool, names) == ["m1", "m2", "a2", "a1"]


def test_group_coherent_sliding_window_block_without_parent_or_child_is_dead():
    groups = ["full_attention", {"type": "sliding_window", "window": 40}]  # 3 blocks of 16 for a hit
    pool = _pool("group_coherent", groups=groups, connector=True, num_blocks=14)
    a = pool.get_new_blocks(4, "r")
    s = pool.get_new_blocks(4, "r")
    pool.cache_full_blocks("r", a, [11, 12, 13, 14], 0, 4, 16, 0)
    pool.cache_full_blocks("r", s, [11, 12, 13, 14], 0, 4, 16, 1)
    pool.free_blocks(s)  # queue order s1..s4 (oldest first)
    pool.free_blocks(a)
    names = {b.block_id: f"s{i + 1}" for i, b in enumerate(s)}
    pool.touch(a)  # FA blocks held: only SWA blocks are candidates
    pool.evict_blocks([s[1].block_id, s[3].block_id])  # s3 loses its parent (s2) and its child (s4)
    # s3 can be neither the last block of a window nor an earlier one: dead, before the older s1
    # (a first block: never dead by the window rule). LRU: s1, s3.
    assert _eviction_order(pool, names) == ["s3", "s1"]


def test_marconi_scores_recency_plus_alpha_times_flop_efficiency():
    # Candidates m (rank 0, efficiency 32), a3 (rank 1, dead: 0); a2 and a1 have cached children.
    pool = _pool("marconi", alpha=1.0)
    names = _chain(pool)
    assert _eviction_order(pool, names, per_call=2) == ["a3", "m", "a2", "a1"]
    # alpha 0 is recency alone: LRU among the leaves.
    pool = _pool("marconi", alpha=0.0)
    names = _chain(pool)
    assert _eviction_order(pool, names, per_call=2) == ["m", "a3", "a2", "a1"]


def _eviction_order_of_two_states(alpha: float) -> list[str]:
    """Two free Mamba states, ``mx`` (freed first, 32 tokens deep) and ``my`` (freed later, 16 deep),
    their FA prefixes held; the order in which marconi evicts them."""
    pool = _pool("marconi", alpha=alpha, connector=True, num_blocks=10)
    x1, x2, y1 = pool.get_new_blocks(3, "r")
    mx, my = pool.get_new_blocks(2, "r")
    pool.cache_full_blocks("x", [x1, x2], [21, 22], 0, 2, 16, 0)
    pool.cache_full_blocks("y", [y1], [31], 0, 1, 16, 0)
    pool.cache_partial_block("x", mx, 22, 32, 1)
    pool.cache_partial_block("y", my, 31, 16, 1)
    pool.free_blocks([mx])  # older, deeper (32 tokens)
    pool.free_blocks([my])  # newer, shallower (16 tokens)
    pool.free_blocks([x2, x1, y1])
    pool.touch([x1, x2, y1])
    return _eviction_order(pool, {mx.block_id: "mx", my.block_id: "my"})


def test_marconi_prefers_to_keep_the_deeper_state_of_two():
    # scores: mx = 0 + 2 * 32/32 = 2, my = 1 + 2 * 16/32 = 2 -> tie, oldest first; alpha 3 tips it.
    assert _eviction_order_of_two_states(2.0) == ["mx", "my"]
    assert _eviction_order_of_two_states(3.0) == ["my", "mx"]


def test_window_bounds_the_candidates_and_lru_fills_beyond_it():
    pool = _pool("group_coherent", window=1)
    names = _chain(pool)
    # Only m is examined (alive), so LRU; a3 is still dead next and is examined first then.
    assert _eviction_order(pool, names) == ["m", "a3", "a2", "a1"]


def test_names_options_and_verifiability():
    assert {"group_coherent", "lru", "marconi"} <= set(ev.builtin_eviction_policy_names())
    assert set(ev.builtin_eviction_policy_names()) <= set(ev.eviction_policy_names())
    assert ev.create_eviction_policy("lru") is None
    assert ev.eviction_not_verifiable_reason("lru") is None
    assert "what-if" in (ev.eviction_not_verifiable_reason("marconi") or "")
    assert ev.GroupCoherentPolicy.mirrors_vllm is False and ev.MarconiPolicy.mirrors_vllm is False
    with pytest.raises(
        ValueError,
        match=re.escape(f"cache.eviction_policy: unknown eviction policy 'fifo'; {Valid('cache.eviction_policy')}"),
    ):
        ev.create_eviction_policy("fifo")
    with pytest.raises(ValueError, match="cache.eviction_options: lru takes no options"):
        ev.create_eviction_policy("lru", {"window": 3})
    with pytest.raises(
        ValueError, match=r"cache.eviction_options.beta: unknown option \(valid: alpha, extra_weight, window\)"
    ):
        ev.create_eviction_policy("marconi", {"beta": 1})
    with pytest.raises(
        ValueError, match="cache.eviction_options: group_coherent: option window must be a positive integer"
    ):
        ev.create_eviction_policy("group_coherent", {"window": 0})
    with pytest.raises(ValueError, match="marconi: option alpha must be a non-negative number"):
        ev.create_eviction_policy("marconi", {"alpha": -1})
    with pytest.raises(ValueError, match="marconi needs the step-time model"):
        ev.MarconiPolicy().check_context(EvictionContext())


@pytest.fixture
def example_plugin(monkeypatch):
    """Pretend the example package (examples/eviction) is installed: its source on sys.path, its entry point."""
    monkeypatch.syspath_prepend(str(EXAMPLE_SRC))
    ep = EntryPoint(name="mamba_last", value="hybridsim_example_eviction:MambaLastPolicy", group=ev.ENTRY_POINT_GROUP)

    def fake_entry_points(group=None, **_):
        return [ep] if group == ev.ENTRY_POINT_GROUP else []

    monkeypatch.setattr(sim.core.registry, "entry_points", fake_entry_points)
    yield
    sys.modules.pop("hybridsim_example_eviction", None)


def test_example_policy_loads_through_the_entry_point_and_evicts_attention_first(example_plugin):
    assert "mamba_last" in ev.eviction_policy_names()
    pool = _pool("mamba_last", window=8)
    names = _chain(pool)
    assert _eviction_order(pool, names) == ["a3", "a2", "a1", "m"]
    with pytest.raises(ValueError, match="mamba_last: option window must be a positive integer"):
        ev.create_eviction_policy("mamba_last", {"window": "x"})


def _extra_pool(policy, **options) -> PolicyBlockPool:
    config = kv_cache_config_from_groups(FA_MAMBA, block_size=16, num_blocks=12, retention_interval=0)
    pol = ev.eviction_policy_for_placement(ev.create_eviction_policy(policy, options))
    pool = make_block_pool(config, True, True, pol, EvictionContext(prefill_flops=lambda p: float(p)))
    assert isinstance(pool, PolicyBlockPool)
    return pool


def _chain_with_extra_state(pool: PolicyBlockPool, extra_at: int = 16):
    """FA a1, a2 (keys 11, 12) and Mamba states at 16 (m1, key 11) and 32 (m2, key 12); the one at
    ``extra_at`` is an extra state of a what-if placement. Freed m2, m1, then the FA tail first: LRU
    order m2, m1, a2, a1."""
    a1, a2, m1, m2 = pool.get_new_blocks(4, "r")
    pool.set_extra_state_positions("r", (extra_at,))
    pool.cache_full_blocks("r", [a1, a2], [11, 12], 0, 2, 16, 0)
    pool.cache_full_blocks("r", [m1, m2], [11, 12], 0, 2, 16, 1)
    extra = m1 if extra_at == 16 else m2
    assert pool.extra_state_ids == {extra.block_id}
    pool.set_extra_state_positions("r", ())
    pool.free_blocks([m2])
    pool.free_blocks([m1])
    pool.free_blocks([a2, a1])
    return {a1.block_id: "a1", a2.block_id: "a2", m1.block_id: "m1", m2.block_id: "m2"}


def test_lru_under_a_what_if_placement_drops_extra_states_first():
    pool = _extra_pool("lru")
    assert isinstance(pool.policy, ev.ExtraStatesFirstLRU)
    names = _chain_with_extra_state(pool)
    assert _eviction_order(pool, names) == ["m1", "m2", "a2", "a1"]
    assert not pool.extra_state_ids  # the tag goes with the entry


def test_group_coherent_drops_dead_then_extra_states_then_lru():
    names = _chain_with_extra_state(pool := _extra_pool("group_coherent"))
    # Nothing dead; the extra state m1 first; then LRU m2, after which a2 (beyond every state) is dead.
    assert _eviction_order(pool, names) == ["m1", "m2", "a2", "a1"]
    names = _chain_with_extra_state(pool := _extra_pool("group_coherent", extra_first=False))
    assert _eviction_order(pool, names) == ["m2", "a2", "m1", "a1"]


def test_marconi_discounts_an_extra_state():
    # Window m2 (rank 0), m1 (1), a2, a1 (live FA: not candidates); score rank / 3 + efficiency / best.
    # m2 (32 tokens) is the extra state. Weight 1: m2 1.0, m1 1/3 + 1/2 -> m1 first.
    names = _chain_with_extra_state(pool := _extra_pool("marconi", extra_weight=1.0), extra_at=32)
    assert _eviction_order(pool, names)[0] == "m1"
    # Default weight 0.5: m2 counts 16 tokens: m2 0 + 1, m1 1/3 + 1 -> m2 first; weight 0 likewise.
    for options in ({}, {"extra_weight": 0.0}):
        names = _chain_with_extra_state(pool := _extra_pool("marconi", **options), extra_at=32)
        assert _eviction_order(pool, names)[0] == "m2"
    with pytest.raises(ValueError, match="marconi: option extra_weight must be a number in"):
        ev.create_eviction_policy("marconi", {"extra_weight": 2})


def _reuse_value_pool(**options) -> PolicyBlockPool:
    return _pool("reuse_value", num_blocks=14, **options)


def _short_chain(pool: PolicyBlockPool):
    """A fresh one-block chain y1 (key 31, 16 tokens) and its state my, freed as vLLM frees them."""
    y1, my = pool.get_new_blocks(2, "y")
    pool.cache_full_blocks("y", [y1], [31], 0, 1, 16, 0)
    pool.cache_partial_block("y", my, 31, 16, 1)
    pool.free_blocks([my])
    pool.free_blocks([y1])
    return {y1.block_id: "y1", my.block_id: "my"}


def test_reuse_value_keeps_the_longer_chain_and_its_state_as_a_unit():
    # horizon 100, one Mamba group (M = 1). Chain a (_chain): m freed at clock 1 (n 2: H 1 + 100 * 2/3),
    # then a3, a2, a1 at clock 4 (n 3: H 4 + 75 = 79); the table lifts m, its deepest state (key 12), to 79.
    # Then y: my at clock 5 (n 1: 55), y1 at clock 6 (56), my lifted to 56. LRU would take m, a3, a2, a1
    # first; reuse_value takes the newer but shorter y first, then a's table tail first; once a2 (key 12)
    # is gone m is unusable and goes next.
    pool = _reuse_value_pool(horizon=100)
    names = _chain(pool) | _short_chain(pool)
    assert _eviction_order(pool, names) == ["y1", "my", "a3", "a2", "m", "a1"]


def test_reuse_value_ages_so_a_small_horizon_is_lru_by_free_time():
    # horizon 1: values add at most 1.5 freed blocks; y's blocks (clock 5, 6) still outrank a's (1, 4).
    pool = _reuse_value_pool(horizon=1, reuse_bonus=0.0)
    names = _chain(pool) | _short_chain(pool)
    assert _eviction_order(pool, names) == ["a3", "a2", "m", "a1", "y1", "my"]


def test_reuse_value_favours_a_table_whose_blocks_were_hit_before():
    # y is freed, hit (touched) and freed again: its blocks held their entries, so reused = 1 and the bonus
    # (horizon 100 x 1.0) lifts it above the longer fresh chain a; without the bonus y goes first.
    for bonus, expected in ((1.0, ["a3", "a2", "m", "a1", "y1", "my"]), (0.0, ["y1", "my", "a3", "a2", "m", "a1"])):
        pool = _reuse_value_pool(horizon=100, reuse_bonus=bonus)
        names = _short_chain(pool) | _chain(pool)
        y1, my = (next(b for b in pool.blocks if names.get(b.block_id) == n) for n in ("y1", "my"))
        pool.touch([y1, my])
        pool.free_blocks([my])
        pool.free_blocks([y1])
        assert _eviction_order(pool, names) == expected, bonus


def test_reuse_value_options():
    assert "reuse_value" in ev.builtin_eviction_policy_names()
    assert "what-if" in (ev.eviction_not_verifiable_reason("reuse_value") or "")
    with pytest.raises(ValueError, match="reuse_value: option horizon must be a positive integer"):
        ev.create_eviction_policy("reuse_value", {"horizon": 0})
    with pytest.raises(ValueError, match="reuse_value: option reuse_bonus must be a non-negative number"):
        ev.create_eviction_policy("reuse_value", {"reuse_bonus": -1})


def test_reuse_value_heap_stays_bounded_and_keeps_its_order():
    # Every hit re-stamps a block and leaves its old heap entry stale; the heap is rebuilt from the live
    # stamps past 4 entries a block, and the eviction order is what the live stamps say.
    pool = _reuse_value_pool(horizon=100)
    names = _chain(pool) | _short_chain(pool)
    blocks = [b for b in pool.blocks if b.block_id in names]
    for _ in range(40):
        pool.touch(blocks)
        pool.free_blocks(blocks)
    assert len(pool.policy._heap) <= 4 * len(pool.blocks) + 64
    live = {bid for _, seq, bid in pool.policy._heap if pool.policy._stamp[bid][1] == seq}
    assert live == set(names)
    assert sorted(_eviction_order(pool, names)) == sorted(names.values())
