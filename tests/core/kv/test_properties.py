"""Property tests: random operation sequences keep the pool and tables consistent."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from support.kv import make_manager, make_request

from sim.core.kv.eviction import EvictionContext, PolicyBlockPool
from sim.core.kv.kv_cache_manager import check_invariants
from sim.core.policy.eviction import ChainIndex, create_eviction_policy
from sim.core.request import RequestStatus

LAYOUTS = [
    ["full_attention", "mamba"],
    ["full_attention", {"type": "mamba", "prefill_checkpoints": True}],
    ["full_attention", {"type": "sliding_window", "window": 40}],
    ["full_attention", "mamba", "mamba"],
    # Mixed block sizes (hash block = GCD 16, hits aligned to the LCM).
    ["full_attention", {"type": "sliding_window", "window": 64, "block_size": 32}],
    [{"type": "full_attention", "block_size": 32}, {"type": "mamba", "prefill_checkpoints": True}],
    ["full_attention", {"type": "sliding_window", "window": 40, "block_size": 32}, {"type": "mamba", "block_size": 64}],
]

op = st.one_of(
    st.tuples(st.just("add"), st.sampled_from(["a", "b", "c"]), st.integers(1, 90), st.integers(1, 6)),
    st.tuples(st.just("step"), st.integers(0, 7), st.sampled_from([5, 16, 32, 48])),
    st.tuples(st.just("free"), st.integers(0, 7)),
    st.tuples(st.just("evict"), st.lists(st.integers(1, 39), max_size=4)),
    st.tuples(st.just("new_step")),
)


def _check_policy_pool(pool) -> None:
    """A non-lru pool: every free uncached block precedes every free cached one (sim.core.kv.eviction)."""
    if not isinstance(pool, PolicyBlockPool):
        return
    seen_cached = False
    for block in pool.free_block_queue:
        if block.block_hash is not None:
            seen_cached = True
        else:
            assert not seen_cached, f"uncached free block {block.block_id} behind a cached one"
    index = getattr(pool.policy, "index", None)
    if isinstance(index, ChainIndex):  # the incremental index equals a recount from the cached blocks
        chained = [b for b in pool.blocks if b.block_hash is not None and b.block_hash[1] not in index.mamba_groups]
        assert set(index._parent) == {b.block_id for b in chained}
        recount: dict = {}
        for b in chained:
            parent = index._parent[b.block_id]
            if parent is not None:
                recount[(b.block_hash[1], parent)] = recount.get((b.block_hash[1], parent), 0) + 1
        assert index._children == recount


@settings(max_examples=120, deadline=None)
@given(
    layout=st.sampled_from(LAYOUTS),
    retention=st.sampled_from([None, 0, "interval"]),
    ops=st.lists(op, max_size=40),
    policy=st.sampled_from(
        ["lru", "group_coherent", "marconi", "reuse_value", ("group_coherent", {"window": 2}), "connector"]
    ),
)
def test_random_operations_keep_invariants_and_leak_nothing(layout, retention, ops, policy):
    """``interval`` is the smallest multiple of the scheduler block size (the LCM) that is >= 32.

    ``policy`` runs every eviction policy (``connector``: group_coherent told a connector is attached);
    conservation, ref counts and "no block both free and owned" must hold under each.
    """
    lcm = make_manager(layout, num_blocks=40).scheduler_block_size
    if retention == "interval":
        retention = lcm * max(1, 32 // lcm)
    name, options = policy if isinstance(policy, tuple) else (policy, {})
    ctx = EvictionContext(connector_attached=name == "connector", prefill_flops=lambda p: float(p * p))
    pol = create_eviction_policy("group_coherent" if name == "connector" else name, options)
    m = make_manager(layout, num_blocks=40, retention_interval=retention, eviction_policy=pol, eviction_context=ctx)
    assert (pol is None) != isinstance(m.block_pool, PolicyBlockPool)
    fa_block = m.kv_cache_config.groups[0].spec.block_size  # group 0 is full attention
    waiting, running = [], []
    counter = 0
    for o in ops:
        kind = o[0]
        if kind == "add":
            _, stream, n, out = o
            waiting.append(make_request(f"r{counter}", (stream, n), max_tokens=out))
            counter += 1
        elif kind == "step":
            _, idx, chunk = o
            if waiting and (idx % 2 == 0 or not running):
                req = waiting[idx % len(waiting)]
                blocks, hit, spb = m.get_computed_blocks(req)
                assert hit % lcm == 0 and hit <= req.num_tokens - 1
                assert len(blocks.blocks[0]) * fa_block == hit
                req.shared_prefix_boundary = spb
                n = min(chunk, req.num_tokens - hit)
                if m.allocate_slots(req, n, hit, blocks, full_sequence_must_fit=True) is not None:
                    waiting.remove(req)
                    running.append(req)
                    req.status = RequestStatus.RUNNING
                    req.num_computed_tokens = hit + n
            elif running:
                req = running[idx % len(running)]
                if req.num_computed_tokens == req.num_tokens:
                    if req.num_output_tokens >= req.max_tokens:
                        continue
                    req.append_output_tokens(1)
                n = min(chunk, req.num_tokens - req.num_computed_tokens)
                if m.allocate_slots(req, n) is not None:
                    req.num_computed_tokens += n
        elif kind == "free" and running:
            req = running.pop(o[1] % len(running))
            m.free(req)
        elif kind == "evict":
            m.evict_blocks(o[1])
        elif kind == "new_step":
            m.new_step_starts()
        check_invariants(m)
        _check_policy_pool(m.block_pool)
        for table in m.coordinator.single_type_managers:
            for blocks in table.req_to_blocks.values():
                assert all(b is m.block_pool.null_block or not b.is_null for b in blocks)
    for req in running:
        m.free(req)
    check_invariants(m)
    assert m.block_pool.get_num_free_blocks() == 39
    assert all(not t.req_to_blocks for t in m.coordinator.single_type_managers)
    events = m.take_events()
    stored = sum(e.kind == "stored" for e in events)
    removed = sum(e.kind == "removed" for e in events)
    assert stored - removed == sum(m.num_cached_per_group())
