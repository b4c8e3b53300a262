"""Counters for the steps table's ``blocks_gN`` and ``cached_gN``: O(groups) a step instead of a count.

The core answers both by counting when asked (vLLM keeps neither figure):
:meth:`SingleTypeKVCacheManager.num_held_blocks` walks the group's tables and
:meth:`BlockPool.num_cached_entries` the group's cached map, O(blocks held) and
O(cache entries) at every step. The classes here keep the same figures as
counters, updated where they change, and take every decision by calling the
core's code:

* :class:`HeldBlockCounter` (a mixin on each single-type manager): a group's
  held blocks change only by its own calls into the pool, and each block that
  joins or leaves a group's tables joins or leaves the pool's free queue (a
  block is held by one group's tables only). So the counter moves by the free
  queue's change across each of the manager's calls that take, touch or free
  blocks. Invariant: ``held_blocks == num_held_blocks()`` of the core.
* :class:`CachedEntryCounter` (a mixin on the pool, LRU or policy): one count
  per group, folded from the pool's own ``stored`` / ``removed`` / ``cleared``
  events (one per entry keyed, dropped, or all cleared) when asked.
  Invariant: ``num_cached_entries(g)`` equals the core's count of the map.

:data:`COUNTING_CLASSES` hands them to the coordinator
(:class:`~sim.core.kv.kv_cache_coordinator.KVCacheClasses`);
:class:`CountingKVCacheManager` builds with them and answers the steps table
from the counters. The engine's build takes it (or its subclass
:class:`~sim.accel.quiet.QuietKVCacheManager`) whenever fast paths are on.
Contract: ``check_invariants`` compares the counters with the core's counts,
and the plain-vs-fast differential test compares every table.
"""

from __future__ import annotations

from typing import Any, Sequence

from sim.core.kv.block_pool import BlockPool, KVCacheBlock, KVEventLog
from sim.core.kv.eviction import EvictionContext, EvictionPolicy, PolicyBlockPool, make_block_pool
from sim.core.kv.kv_cache_coordinator import KVCacheClasses
from sim.core.kv.kv_cache_manager import KVCacheManager
from sim.core.kv.single_type_kv_cache_manager import (
    FullAttentionManager,
    MambaManager,
    SingleTypeKVCacheManager,
    SlidingWindowManager,
    manager_class_for,
)
from sim.core.kv.specs import KVCacheConfig, KVCacheSpec


class HeldBlockCounter(SingleTypeKVCacheManager):
    """A single-type manager that counts its distinct held blocks (``held_blocks``; module docstring)."""

    held_blocks: int

    def _init_kind(self) -> None:
        super()._init_kind()
        #: Distinct real blocks held by this group's tables (the core's ``num_held_blocks()``).
        self.held_blocks = 0

    def num_held_blocks(self) -> int:
        return self.held_blocks

    def add_local_computed_blocks(
        self,
        request_id: str,
        new_computed_blocks: Sequence[KVCacheBlock],
        num_local_computed_tokens: int,
        num_external_computed_tokens: int,
    ) -> None:
        queue = self.block_pool.free_block_queue
        free = queue.num_free_blocks
        super().add_local_computed_blocks(
            request_id, new_computed_blocks, num_local_computed_tokens, num_external_computed_tokens
        )
        self.held_blocks += free - queue.num_free_blocks

    def allocate_external_computed_blocks(
        self, request_id: str, num_local_computed_tokens: int, num_external_computed_tokens: int
    ) -> None:
        queue = self.block_pool.free_block_queue
        free = queue.num_free_blocks
        super().allocate_external_computed_blocks(request_id, num_local_computed_tokens, num_external_computed_tokens)
        self.held_blocks += free - queue.num_free_blocks

    def allocate_new_blocks(self, request_id: str, num_tokens: int, num_tokens_main_model: int) -> list[KVCacheBlock]:
        queue = self.block_pool.free_block_queue
        free = queue.num_free_blocks
        blocks = super().allocate_new_blocks(request_id, num_tokens, num_tokens_main_model)
        self.held_blocks += free - queue.num_free_blocks
        return blocks

    def free(self, request_id: str) -> None:
        queue = self.block_pool.free_block_queue
        free = queue.num_free_blocks
        super().free(request_id)
        self.held_blocks += free - queue.num_free_blocks


class SkippedBlockCounter(HeldBlockCounter):
    """A held-block counter for a group type that frees blocks as processing passes them (sliding window,
    Mamba); full attention skips nothing (``get_num_skipped_tokens`` is 0), so its counter needs no hook here."""

    def remove_skipped_blocks(self, request_id: str, processed_computed_tokens: int) -> None:
        queue = self.block_pool.free_block_queue
        free = queue.num_free_blocks
        super().remove_skipped_blocks(request_id, processed_computed_tokens)
        self.held_blocks += free - queue.num_free_blocks


class CountingFullAttentionManager(HeldBlockCounter, FullAttentionManager):
    """:class:`FullAttentionManager` with a held-block counter."""


class CountingSlidingWindowManager(SkippedBlockCounter, SlidingWindowManager):
    """:class:`SlidingWindowManager` with a held-block counter."""


class CountingMambaManager(SkippedBlockCounter, MambaManager):
    """:class:`MambaManager` with a held-block counter."""


_COUNTING: dict[type[SingleTypeKVCacheManager], type[SingleTypeKVCacheManager]] = {
    FullAttentionManager: CountingFullAttentionManager,
    SlidingWindowManager: CountingSlidingWindowManager,
    MambaManager: CountingMambaManager,
}


def counting_manager_class_for(spec: KVCacheSpec) -> type[SingleTypeKVCacheManager]:
    """The core's manager class for ``spec`` (:func:`manager_class_for`), with a held-block counter."""
    return _COUNTING[manager_class_for(spec)]


class CachedEntryCounter(BlockPool):
    """A pool that counts each group's cache entries (module docstring).

    The counts are folded from the pool's own event log: an entry stored, dropped or all of them cleared
    is exactly one ``stored``, ``removed`` or ``cleared`` event, in order, and nothing else writes that log.
    The events emitted since the last fold are folded when a count is asked and before the log is taken
    (no hook per block). Without events (``enable_kv_cache_events`` off) the counts are the core's.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: group id -> its cache entries; grown as groups first cache.
        self._num_cached: list[int] = []
        #: Events of the current log already folded into ``_num_cached``.
        self._folded = 0

    def _fold(self) -> None:
        log = self._events
        kinds = log.kind
        end = len(kinds)
        if self._folded == end:
            return
        counts = self._num_cached
        groups = log.group
        for i in range(self._folded, end):
            kind = kinds[i]
            if kind == "stored":
                group = groups[i]
                while len(counts) <= group:
                    counts.append(0)
                counts[group] += 1
            elif kind == "removed":
                counts[groups[i]] -= 1
            else:  # cleared
                counts.clear()
        self._folded = end

    def take_event_log(self) -> KVEventLog:
        self._fold()
        self._folded = 0
        return super().take_event_log()

    def num_cached_entries(self, group_id: int) -> int:
        if not self.enable_kv_cache_events:
            return super().num_cached_entries(group_id)
        self._fold()
        counts = self._num_cached
        return counts[group_id] if 0 <= group_id < len(counts) else 0

    def cached_entries_per_group(self, num_groups: int) -> tuple[int, ...]:
        """``num_cached_entries`` of groups ``0 .. num_groups - 1``, folded once."""
        if not self.enable_kv_cache_events:
            core = super().num_cached_entries
            return tuple([core(g) for g in range(num_groups)])
        self._fold()
        counts = self._num_cached
        if len(counts) < num_groups:
            counts.extend([0] * (num_groups - len(counts)))
        return tuple(counts[:num_groups])


class CountingBlockPool(CachedEntryCounter, BlockPool):
    """vLLM's LRU :class:`BlockPool` with per-group entry counters."""


class CountingPolicyBlockPool(CachedEntryCounter, PolicyBlockPool):
    """The what-if eviction policies' :class:`PolicyBlockPool` with per-group entry counters."""


def make_counting_block_pool(
    config: KVCacheConfig,
    enable_caching: bool,
    enable_kv_cache_events: bool,
    policy: EvictionPolicy | None,
    context: EvictionContext | None = None,
) -> BlockPool:
    """The pool :func:`~sim.core.kv.eviction.make_block_pool` builds, with per-group entry counters."""
    return make_block_pool(
        config,
        enable_caching,
        enable_kv_cache_events,
        policy,
        context,
        lru_pool=CountingBlockPool,
        policy_pool=CountingPolicyBlockPool,
    )


#: The pool and managers of the speed layer: the core's, with counters.
COUNTING_CLASSES = KVCacheClasses(make_counting_block_pool, counting_manager_class_for)


class CountingKVCacheManager(KVCacheManager):
    """:class:`KVCacheManager` built from :data:`COUNTING_CLASSES`: the steps table's per-group figures are
    counters read in O(groups)."""

    kv_cache_classes = COUNTING_CLASSES

    def num_blocks_per_group(self) -> tuple[int, ...]:
        return tuple([m.held_blocks for m in self.coordinator.single_type_managers])  # type: ignore[attr-defined]

    block_pool: CachedEntryCounter

    def num_cached_per_group(self) -> tuple[int, ...]:
        return self.block_pool.cached_entries_per_group(self.num_kv_cache_groups)
