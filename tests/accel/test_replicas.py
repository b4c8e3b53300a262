"""Replica groups (sim.accel.replicas) decide exactly what the plain core decides, in every group.

A :class:`QuietKVCacheManager` on a layout with identical Mamba groups (it builds a
:class:`ReplicaCoordinator`) and the core's plain :class:`KVCacheManager` run the same seeded random
operations: admissions with prefix hits on shared prompt starts (in the same step as the hit's state was
cached, so the same-step guard fires), chunked prefills, decodes, frees, forced evictions, new steps. After
every operation each group's tables, counters, pending checkpoints, same-step sets, held-block counts, the
free queue and the events must be identical.
"""

from __future__ import annotations

import random

import pytest
from support.kv import make_request

from sim.accel import QuietKVCacheManager
from sim.accel.replicas import MambaFollower, ReplicaCoordinator
from sim.core.kv.kv_cache_coordinator import HybridKVCacheCoordinator
from sim.core.kv.kv_cache_manager import KVCacheManager, check_invariants
from sim.core.kv.single_type_kv_cache_manager import MambaManager
from sim.core.kv.specs import kv_cache_config_from_groups
from sim.core.request import RequestStatus

CKPT = {"type": "mamba", "prefill_checkpoints": True}
LAYOUTS = {
    "nemotron": [CKPT, CKPT, CKPT, CKPT, "full_attention"],
    "split": [CKPT, "full_attention", CKPT, CKPT],
    "two-classes": ["mamba", CKPT, "full_attention", "mamba", CKPT],
    "plain-mamba": ["mamba", "mamba", "mamba", "full_attention"],
}


def _state(m: KVCacheManager) -> list[object]:
    pool = m.block_pool
    out: list[object] = [pool.free_block_queue.block_ids(), [tuple(e) for e in m.take_events()]]
    for mgr in m.coordinator.single_type_managers:
        out.append(sorted((rid, [b.block_id for b in t]) for rid, t in mgr.req_to_blocks.items()))
        out.append(sorted(mgr.num_cached_block.items()))
        out.append(mgr.num_held_blocks())
        if isinstance(mgr, MambaManager):
            out.append(sorted(mgr.last_state_block_idx.items()))
            out.append(sorted(mgr.num_retired_blocks.items()))
            out.append(sorted(mgr.checkpoints.items()))
            out.append(sorted(mgr.cached_blocks_this_step))
    return out


def _run(layout: list[object], seed: int, num_blocks: int, retention: int | None, steps: int = 400) -> int:
    """Drive both managers; returns how many allocations the followers shared (the case must exercise them)."""
    rnd = random.Random(seed)
    config = kv_cache_config_from_groups(layout, block_size=16, num_blocks=num_blocks, retention_interval=retention)
    fast, ref = QuietKVCacheManager(config), KVCacheManager(config)
    assert isinstance(fast.coordinator, ReplicaCoordinator)
    assert any(isinstance(m, MambaFollower) for m in fast.coordinator.single_type_managers)
    assert type(ref.coordinator) is HybridKVCacheCoordinator
    waiting: list[tuple] = []
    running: list[tuple] = []
    for n in range(steps):
        kind = rnd.random()
        if kind < 0.15 or not (waiting or running):
            system = rnd.choice(["s0", "s1"])
            shared, own = rnd.choice([16, 32, 48, 64, 100]), rnd.randint(1, 60)
            out = rnd.randint(1, 40)
            pair = tuple(make_request(f"r{n}", (system, shared), (f"u{n}", own), max_tokens=out) for _ in range(2))
            waiting.append(pair)
        elif kind < 0.35 and waiting:
            pair = waiting[rnd.randrange(len(waiting))]
            chunk = rnd.choice([16, 32, 200])
            results = []
            for m, req in zip((fast, ref), pair):
                blocks, hit, spb = m.get_computed_blocks(req)
                req.shared_prefix_boundary = spb
                num = min(chunk, req.num_tokens - hit)
                got = m.allocate_slots(req, num, hit, blocks, full_sequence_must_fit=True)
                results.append(None if got is None else got.get_block_ids())
                if got is not None:
                    req.status = RequestStatus.RUNNING
                    req.num_computed_tokens = hit + num
            assert results[0] == results[1]
            if results[0] is not None:
                waiting.remove(pair)
                running.append(pair)
        elif kind < 0.8 and running:
            pair = running[rnd.randrange(len(running))]
            chunk = rnd.choice([1, 1, 1, 2, 16, 17, 40])
            results = []
            for m, req in zip((fast, ref), pair):
                if req.num_computed_tokens == req.num_tokens:
                    if req.num_output_tokens >= req.max_tokens:
                        results.append("done")
                        continue
                    req.append_output_tokens(1)
                num = min(chunk, req.num_tokens - req.num_computed_tokens)
                got = m.allocate_slots(req, num)
                results.append(None if got is None else got.get_block_ids())
                if got is not None:
                    req.num_computed_tokens += num
            assert results[0] == results[1]
            if results[0] is None:  # no room: preempt it (free, back to waiting from scratch)
                running.remove(pair)
                for m, req in zip((fast, ref), pair):
                    m.free(req)
        elif kind < 0.88 and running:
            pair = running.pop(rnd.randrange(len(running)))
            fast.free(pair[0])
            ref.free(pair[1])
        elif kind < 0.95:
            fast.new_step_starts()
            ref.new_step_starts()
        else:
            block_id = rnd.randrange(1, num_blocks)
            fast.evict_blocks([block_id])
            ref.evict_blocks([block_id])
        assert _state(fast) == _state(ref), f"step {n}"
        check_invariants(fast)
    assert fast.coordinator.replicas_on
    return sum(len(t) for t in fast.coordinator.single_type_managers[-1].req_to_blocks.values())


@pytest.mark.parametrize("layout", list(LAYOUTS), ids=str)
@pytest.mark.parametrize("seed", range(4))
def test_replica_groups_match_the_plain_core(layout: str, seed: int) -> None:
    _run(LAYOUTS[layout], seed, num_blocks=[40, 70, 120, 200][seed], retention=[None, 0, 32, 0][seed])


def test_the_build_takes_replicas_only_for_identical_align_groups() -> None:
    plain = kv_cache_config_from_groups([CKPT, "mamba", "full_attention"], block_size=16, num_blocks=30)
    assert not isinstance(QuietKVCacheManager(plain).coordinator, ReplicaCoordinator)
    nemotron = kv_cache_config_from_groups(LAYOUTS["nemotron"], block_size=16, num_blocks=30)
    m = QuietKVCacheManager(nemotron)
    assert isinstance(m.coordinator, ReplicaCoordinator) and m.block_pool is m.coordinator.block_pool
    assert [type(g).__name__ for g in m.coordinator.single_type_managers] == [
        "CountingMambaManager",
        "MambaFollower",
        "MambaFollower",
        "MambaFollower",
        "CountingFullAttentionManager",
    ]
