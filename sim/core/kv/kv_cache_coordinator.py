"""Coordinators: the groups' managers over one shared pool (vLLM ``kv_cache_coordinator.py``).

* :class:`KVCacheCoordinatorNoPrefixCache`: caching off; every hit is 0.
* :class:`UnitaryKVCacheCoordinator`: one group.
* :class:`HybridKVCacheCoordinator`: several groups; groups with equal specs
  are looked up together (a block must hit in each of them), full attention
  first; the hit is the fixed point where every type agrees.

Allocation, caching, skipping and freeing loop over the groups in group order.
Groups may have different block sizes: hits are aligned to the scheduler block
size (their LCM, vLLM ``_cache_hit_alignment_tokens`` without fine-grained
hits), the hybrid fixed point works on token lengths, and the hybrid caches
only up to LCM boundaries. Layouts for which vLLM enables fine-grained partial
hits are rejected (:func:`~sim.core.kv.specs.check_modelled_layout`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, NamedTuple, Sequence

from sim.core.kv.block_pool import BlockPool, KVCacheBlock
from sim.core.kv.eviction import EvictionContext, EvictionPolicy, make_block_pool
from sim.core.kv.hashing import BlockHash
from sim.core.kv.single_type_kv_cache_manager import (
    BlockLists,
    MambaManager,
    SingleTypeKVCacheManager,
    manager_class_for,
)
from sim.core.kv.specs import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheSpec,
    MambaSpec,
    SlidingWindowSpec,
    cdiv,
    check_modelled_layout,
)
from sim.core.request import Request


class SpecGroup(NamedTuple):
    """Groups sharing one spec, looked up jointly."""

    spec: KVCacheSpec
    group_ids: list[int]
    manager_cls: type[SingleTypeKVCacheManager]


#: Builds a coordinator's pool: ``(config, enable_caching, enable_kv_cache_events, eviction policy, its context)``.
BlockPoolFactory = Callable[[KVCacheConfig, bool, bool, EvictionPolicy | None, EvictionContext | None], BlockPool]


@dataclass(frozen=True)
class KVCacheClasses:
    """Where a coordinator's pool and per-group managers come from: the core's own by default
    (:func:`~sim.core.kv.eviction.make_block_pool`, :func:`manager_class_for`).

    The speed layer passes subclasses that take every decision the core's classes take, by calling them,
    and keep counters besides (``sim.accel.counters``); the tables are the same either way.
    """

    make_block_pool: BlockPoolFactory = make_block_pool
    manager_class_for: Callable[[KVCacheSpec], type[SingleTypeKVCacheManager]] = manager_class_for


@dataclass(frozen=True)
class KVCacheOptions:
    """How the pool and the per-group managers are built: everything but the layout (``KVCacheConfig``).

    ``max_in_flight_tokens`` sizes the sliding-window admission cap (None: ``max_model_len``);
    ``corrected_mamba_accounting`` is the Mamba what-if of :class:`MambaManager`; an eviction policy
    replaces the pool's LRU (not vLLM: docs/eviction.md); ``classes`` builds the pool and the managers.
    """

    enable_kv_cache_events: bool = True
    max_in_flight_tokens: int | None = None
    corrected_mamba_accounting: bool = False
    eviction_policy: EvictionPolicy | None = None
    eviction_context: EvictionContext | None = None
    classes: KVCacheClasses = field(default_factory=KVCacheClasses)


class KVCacheCoordinator:
    """Owns the pool and one manager per group; prefix caching is on as the config says."""

    def __init__(self, kv_cache_config: KVCacheConfig, options: KVCacheOptions) -> None:
        enable_caching = kv_cache_config.enable_prefix_caching
        self.kv_cache_config = kv_cache_config
        self.scheduler_block_size = kv_cache_config.scheduler_block_size
        self.hash_block_size = kv_cache_config.hash_block_size
        if enable_caching:
            check_modelled_layout(kv_cache_config)
        classes = options.classes
        self.block_pool: BlockPool = classes.make_block_pool(
            kv_cache_config,
            enable_caching,
            options.enable_kv_cache_events,
            options.eviction_policy,
            options.eviction_context,
        )
        max_len = kv_cache_config.max_model_len
        in_flight = max_len if options.max_in_flight_tokens is None else options.max_in_flight_tokens
        managers: list[SingleTypeKVCacheManager] = []
        align = self.scheduler_block_size
        for gid, group in enumerate(kv_cache_config.groups):
            spec = group.spec
            manager_cls = classes.manager_class_for(spec)
            manager: SingleTypeKVCacheManager
            if isinstance(spec, MambaSpec):
                assert issubclass(manager_cls, MambaManager)
                manager = manager_cls(
                    spec,
                    self.block_pool,
                    gid,
                    enable_caching=enable_caching,
                    cache_hit_alignment_tokens=align,
                    corrected_mamba_accounting=options.corrected_mamba_accounting,
                )
            else:
                window_cap = (
                    spec.max_admission_blocks_per_request(in_flight, max_len)
                    if isinstance(spec, SlidingWindowSpec)
                    else None
                )
                manager = manager_cls(
                    spec,
                    self.block_pool,
                    gid,
                    enable_caching=enable_caching,
                    cache_hit_alignment_tokens=align,
                    max_admission_blocks_per_request=window_cap,
                )
            managers.append(manager)
        self.single_type_managers: tuple[SingleTypeKVCacheManager, ...] = tuple(managers)
        self.retention_interval = kv_cache_config.retention_interval
        self.full_attention_group_id: int | None = None
        self._init_layout()

    def _init_layout(self) -> None:
        """Subclass hook: the group layout's own state, after the managers exist."""

    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: tuple[Sequence[KVCacheBlock], ...],
        total_computed_tokens: int,
        num_local_computed_tokens: int,
        num_tokens_main_model: int,
        apply_admission_cap: bool = False,
        prefill_end: int = 0,
    ) -> int:
        """Sum over groups. ``prefill_end`` (where Mamba reserves a checkpoint)
        only matters under retention 0; otherwise every chunk may checkpoint."""
        if self.retention_interval != 0:
            prefill_end = 0
        total = 0
        for i, manager in enumerate(self.single_type_managers):
            total += manager.get_num_blocks_to_allocate(
                request_id,
                num_tokens,
                new_computed_blocks[i],
                total_computed_tokens,
                num_local_computed_tokens,
                num_tokens_main_model,
                apply_admission_cap,
                prefill_end,
            )
        return total

    def allocate_new_computed_blocks(
        self,
        request_id: str,
        new_computed_blocks: tuple[Sequence[KVCacheBlock], ...],
        num_local_computed_tokens: int,
        num_external_computed_tokens: int,
    ) -> None:
        """Two phases (vLLM #33775): touch every group's hits first, then take
        blocks for external tokens, so one group's allocation cannot evict
        another group's untouched hit. A no-op for a request already holding blocks."""
        managers = self.single_type_managers
        if any(request_id in m.num_cached_block for m in managers):
            assert all(len(b) == 0 for b in new_computed_blocks)
            return
        for i, manager in enumerate(managers):
            manager.add_local_computed_blocks(
                request_id, new_computed_blocks[i], num_local_computed_tokens, num_external_computed_tokens
            )
        if num_external_computed_tokens > 0:
            for manager in managers:
                manager.allocate_external_computed_blocks(
                    request_id, num_local_computed_tokens, num_external_computed_tokens
                )

    def allocate_new_blocks(self, request_id: str, num_tokens: int, num_tokens_main_model: int) -> BlockLists:
        return tuple(
            [m.allocate_new_blocks(request_id, num_tokens, num_tokens_main_model) for m in self.single_type_managers]
        )

    def get_num_cacheable_tokens(self, num_computed_tokens: int) -> int:
        return num_computed_tokens

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        """Cache every group's blocks up to ``num_computed_tokens``; the replay
        boundary a resend resumes at is ``P - 1``."""
        boundaries = (request.num_prompt_tokens - 1,)
        retention = self.retention_interval
        cacheable = self.get_num_cacheable_tokens(num_computed_tokens)
        for manager in self.single_type_managers:
            if manager.enable_caching:
                manager.cache_blocks(request, cacheable, retention, boundaries)

    def reset_prefix_cache(self) -> bool:
        return self.block_pool.reset_prefix_cache()

    def free(self, request_id: str) -> None:
        for manager in self.single_type_managers:
            manager.free(request_id)

    def remove_skipped_blocks(self, request_id: str, processed_computed_tokens: int) -> None:
        for manager in self.single_type_managers:
            manager.remove_skipped_blocks(request_id, processed_computed_tokens)

    def get_blocks(self, request_id: str) -> BlockLists:
        return tuple(m.req_to_blocks.get(request_id) or [] for m in self.single_type_managers)

    def find_longest_cache_hit(
        self, block_hashes: Sequence[BlockHash], max_cache_hit_length: int
    ) -> tuple[BlockLists, int, int]:
        """``(blocks per group, hit tokens, uncached shared-prefix tokens)``."""
        raise NotImplementedError

    def new_step_starts(self) -> None:
        for manager in self.single_type_managers:
            manager.new_step_starts()

    def find_longest_cache_hit_per_group(
        self, block_hashes: Sequence[BlockHash], max_cache_hit_length: int
    ) -> tuple[BlockLists, tuple[int, ...]]:
        """Each group looked up alone (no reconciliation)."""
        blocks, hit, _ = self.find_longest_cache_hit(block_hashes, max_cache_hit_length)
        return blocks, tuple(hit for _ in self.single_type_managers)


class KVCacheCoordinatorNoPrefixCache(KVCacheCoordinator):
    def find_longest_cache_hit(
        self, block_hashes: Sequence[BlockHash], max_cache_hit_length: int
    ) -> tuple[BlockLists, int, int]:
        return tuple([] for _ in self.single_type_managers), 0, 0


class UnitaryKVCacheCoordinator(KVCacheCoordinator):
    def _init_layout(self) -> None:
        assert len(self.single_type_managers) == 1
        manager = self.single_type_managers[0]
        self._spec = manager.kv_cache_spec
        self._cls = type(manager)
        if isinstance(self._spec, FullAttentionSpec):
            self.full_attention_group_id = 0

    def find_longest_cache_hit(
        self, block_hashes: Sequence[BlockHash], max_cache_hit_length: int
    ) -> tuple[BlockLists, int, int]:
        blocks, hit = self._cls.find_longest_cache_hit(
            block_hashes, max_cache_hit_length, (0,), self.block_pool, self._spec, self._spec.block_size
        )
        return blocks, hit, 0


class HybridKVCacheCoordinator(KVCacheCoordinator):
    def _init_layout(self) -> None:
        self.attention_groups: list[SpecGroup] = []
        for gid, manager in enumerate(self.single_type_managers):
            spec = manager.kv_cache_spec
            for sg in self.attention_groups:
                if sg.spec == spec and sg.manager_cls is type(manager):
                    sg.group_ids.append(gid)
                    break
            else:
                self.attention_groups.append(SpecGroup(spec, [gid], type(manager)))
        # Full attention first: its left-to-right scan gives the tightest first bound.
        self.attention_groups.sort(key=lambda g: not isinstance(g.spec, FullAttentionSpec))
        first = self.attention_groups[0]
        self.full_attention_group_id = first.group_ids[0] if isinstance(first.spec, FullAttentionSpec) else None

    @property
    def _cache_hit_alignment_tokens(self) -> int:
        """Hits land on scheduler-block boundaries (vLLM: the hash block only with fine-grained hits)."""
        return self.scheduler_block_size

    def get_num_cacheable_tokens(self, num_computed_tokens: int) -> int:
        """Hybrid: only up to the last scheduler-block boundary can ever be hit."""
        return num_computed_tokens // self.scheduler_block_size * self.scheduler_block_size

    def find_longest_cache_hit(
        self, block_hashes: Sequence[BlockHash], max_cache_hit_length: int
    ) -> tuple[BlockLists, int, int]:
        """Fixed point: each type keeps or shrinks the candidate length; repeat
        until stable. Full attention is looked up once (downward-closed); one
        pass suffices for full attention + one other type. The uncached
        shared prefix is the longest single-type hit minus the result."""
        n = len(self.single_type_managers)
        hit_length = max_cache_hit_length
        longest = 0
        blocks_by_group: list[list[KVCacheBlock] | None] = [None] * n
        len_by_group = [0] * n
        groups = self.attention_groups
        simple = len(groups) == 2 and isinstance(groups[0].spec, FullAttentionSpec)
        align = self._cache_hit_alignment_tokens
        while True:
            cur = hit_length
            for spec, gids, cls in groups:
                first = gids[0]
                if isinstance(spec, FullAttentionSpec) and blocks_by_group[first] is not None:
                    cur = min(cur, len_by_group[first])
                    continue
                found, cur = cls.find_longest_cache_hit(block_hashes, cur, gids, self.block_pool, spec, align)
                for gid, lst in zip(gids, found):
                    blocks_by_group[gid] = lst
                    len_by_group[gid] = cur
                if cur > longest:
                    longest = cur
            if cur >= hit_length:
                break
            hit_length = cur
            if simple:
                break
        for spec, gids, _ in groups:
            if not isinstance(spec, FullAttentionSpec):
                continue
            keep = cdiv(hit_length, spec.block_size)
            for gid in gids:
                kept = blocks_by_group[gid]
                if kept is not None:
                    del kept[keep:]
                    len_by_group[gid] = hit_length
        return tuple(b if b is not None else [] for b in blocks_by_group), hit_length, longest - hit_length

    def find_longest_cache_hit_per_group(
        self, block_hashes: Sequence[BlockHash], max_cache_hit_length: int
    ) -> tuple[BlockLists, tuple[int, ...]]:
        n = len(self.single_type_managers)
        hit_blocks: list[list[KVCacheBlock]] = [[] for _ in range(n)]
        hits = [0] * n
        for spec, gids, cls in self.attention_groups:
            found, hit = cls.find_longest_cache_hit(
                block_hashes, max_cache_hit_length, gids, self.block_pool, spec, self._cache_hit_alignment_tokens
            )
            for gid, lst in zip(gids, found):
                hit_blocks[gid] = lst
                hits[gid] = hit
        return tuple(hit_blocks), tuple(hits)


def get_kv_cache_coordinator(kv_cache_config: KVCacheConfig, options: KVCacheOptions) -> KVCacheCoordinator:
    """vLLM's choice: caching off → no-cache; one group → unitary; else hybrid."""
    if not kv_cache_config.enable_prefix_caching:
        return KVCacheCoordinatorNoPrefixCache(kv_cache_config, options)
    if len(kv_cache_config.groups) == 1:
        return UnitaryKVCacheCoordinator(kv_cache_config, options)
    return HybridKVCacheCoordinator(kv_cache_config, options)
