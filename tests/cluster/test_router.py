"""Each router's choice pinned on hand-built instance states (queues, loads, published KV views)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from sim.cluster.router import (
    LeastLoadedRouter,
    PrefixAwareRouter,
    RoundRobinRouter,
    SessionAffinityRouter,
    create_router,
    usable_prefix_tokens,
)
from sim.cluster.view import KVCacheView
from sim.core.kv.block_pool import KVEventLog
from sim.core.kv.specs import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, MambaSpec
from sim.core.request import Request
from sim.core.tokens import StreamSegment

BS = 16


def _config() -> KVCacheConfig:
    """One FA group and one align-mode Mamba group, both of 16-token blocks."""
    fa = KVCacheGroupSpec(spec=FullAttentionSpec(block_size=BS), layer_ids=(0,))
    mamba = KVCacheGroupSpec(spec=MambaSpec(block_size=BS), layer_ids=(1,))
    return KVCacheConfig(
        num_blocks=100,
        groups=(fa, mamba),
        scheduler_block_size=BS,
        hash_block_size=BS,
        retention_interval=0,
        enable_prefix_caching=True,
        max_model_len=4096,
    )


def _request(rid: str, tokens: int, session: str | None = None) -> Request:
    from sim.core.kv.hashing import RequestBlockHasher

    r = Request(rid, [StreamSegment("doc", 0, tokens)], max_tokens=4, arrival_time=0.0)
    if session is not None:
        r.metadata["session"] = session
    r.set_block_hasher(RequestBlockHasher(BS))
    return r


def _view(fa_blocks: list[int], mamba_blocks: list[int], request: Request, delay: float = 0.0) -> KVCacheView:
    """A view holding the request's FA blocks ``fa_blocks`` and Mamba states ``mamba_blocks`` (indices)."""
    view = KVCacheView(2, delay)
    log = KVEventLog()
    for i in fa_blocks:
        log.append("stored", 0, i, request.block_hashes[i], request.request_id, "computed")
    for i in mamba_blocks:
        log.append("stored", 1, 100 + i, request.block_hashes[i], request.request_id, "computed")
    view.publish(log, 0.0)
    view.advance(delay)
    return view


@dataclass
class State:
    index: int
    view: KVCacheView = field(default_factory=lambda: KVCacheView(2, 0.0))
    queue: int = 0
    usage: float = 0.0
    max_num_seqs: int = 4

    def queued(self) -> int:
        return self.queue

    def load(self) -> float:
        return self.queue / self.max_num_seqs

    def kv_usage(self) -> float:
        return self.usage


def test_round_robin_cycles_in_routing_order() -> None:
    router = RoundRobinRouter()
    states = [State(0), State(1), State(2)]
    picks = [router.choose(_request(f"r{i}", 40), states, _config()) for i in range(7)]
    assert picks == [0, 1, 2, 0, 1, 2, 0]


def test_least_loaded_breaks_ties_by_usage_then_index() -> None:
    router = LeastLoadedRouter()
    r = _request("r", 40)
    assert router.choose(r, [State(0, queue=3), State(1, queue=1), State(2, queue=2)], _config()) == 1
    assert router.choose(r, [State(0, queue=1, usage=0.5), State(1, queue=1, usage=0.2)], _config()) == 1
    assert router.choose(r, [State(0, queue=1, usage=0.2), State(1, queue=1, usage=0.2)], _config()) == 0


def test_session_affinity_keeps_a_session_home() -> None:
    router = SessionAffinityRouter()
    states = [State(0, queue=2), State(1, queue=0)]
    assert router.choose(_request("t1", 40, session="s"), states, _config()) == 1
    states[1].queue = 9  # the home is now the busiest: later turns still go there
    assert router.choose(_request("t2", 40, session="s"), states, _config()) == 1
    assert router.choose(_request("u1", 40), states, _config()) == 0  # no session: least loaded


def test_usable_prefix_fa_only_vs_group_aware() -> None:
    r = _request("r", 6 * BS + 5)  # 6 full blocks
    config = _config()
    # FA holds 5 blocks, Mamba holds the state ending at block 2 only.
    view = _view([0, 1, 2, 3, 4], [2], r)
    assert usable_prefix_tokens(r, view, config, group_aware=False) == 5 * BS
    assert usable_prefix_tokens(r, view, config, group_aware=True) == 3 * BS
    # No Mamba state at any FA-covered boundary: nothing usable.
    assert usable_prefix_tokens(r, _view([0, 1, 2, 3, 4], [5], r), config, group_aware=True) == 0


def test_prefix_aware_group_aware_prefers_the_usable_hit() -> None:
    r = _request("r", 6 * BS + 5)
    config = _config()
    deep_fa_only = State(0, view=_view([0, 1, 2, 3, 4], [], r))
    shallow_usable = State(1, view=_view([0, 1, 2], [2], r))
    assert PrefixAwareRouter(group_aware=False, load_weight=0.0).choose(r, [deep_fa_only, shallow_usable], config) == 0
    assert PrefixAwareRouter(group_aware=True, load_weight=0.0).choose(r, [deep_fa_only, shallow_usable], config) == 1


def test_prefix_aware_weighs_load_against_the_hit() -> None:
    r = _request("r", 6 * BS + 5)
    config = _config()
    cached_busy = State(0, view=_view([0, 1, 2], [], r), queue=8)  # cached 48/101, load 2.0
    empty_idle = State(1, queue=0)
    assert PrefixAwareRouter(load_weight=1.0).choose(r, [cached_busy, empty_idle], config) == 1
    assert PrefixAwareRouter(load_weight=0.1).choose(r, [cached_busy, empty_idle], config) == 0


def test_view_applies_events_after_the_delay_and_counts_duplicates() -> None:
    r = _request("r", 3 * BS + 1)
    view = KVCacheView(2, delay=5.0)
    log = KVEventLog()
    log.append("stored", 0, 1, r.block_hashes[0], "r", "computed")
    log.append("stored", 0, 2, r.block_hashes[0], "r2", "computed")  # equal content in a second block
    view.publish(log, 10.0)
    view.advance(14.0)
    assert not view.holds(0, r.block_hashes[0])
    view.advance(15.0)
    assert view.holds(0, r.block_hashes[0])
    removed = KVEventLog()
    removed.append("removed", 0, 1, r.block_hashes[0], "", "evicted")
    view.publish(removed, 20.0)
    view.advance(25.0)
    assert view.holds(0, r.block_hashes[0])  # the second block still holds it
    removed2 = KVEventLog()
    removed2.append("removed", 0, 2, r.block_hashes[0], "", "evicted")
    view.publish(removed2, 30.0)
    view.advance(35.0)
    assert not view.holds(0, r.block_hashes[0])


def test_create_router_refuses_bad_names_and_misplaced_options() -> None:
    with pytest.raises(ValueError, match="cluster.router.policy.*valid: least_loaded"):
        create_router("round_robbin", False, 1.0, {})
    with pytest.raises(ValueError, match="group_aware"):
        create_router("round_robin", True, 1.0, {})
    with pytest.raises(ValueError, match="options"):
        create_router("prefix_aware", False, 1.0, {"x": 1})
