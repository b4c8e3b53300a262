"""The scheduler's interface to the cache core (vLLM ``kv_cache_manager.py``).

:class:`KVCacheManager` keeps vLLM's method names and semantics so the
scheduler can call it as vLLM's scheduler does. :func:`check_invariants`
verifies the pool and every table after a step (``--check-invariants``).
"""

from __future__ import annotations

from typing import ClassVar, Iterable, Sequence

from sim.core.kv.block_pool import KVCacheBlock, KVEvent, KVEventLog
from sim.core.kv.eviction import EvictionContext, EvictionPolicy, PolicyBlockPool
from sim.core.kv.hashing import BlockHash
from sim.core.kv.kv_cache_coordinator import (
    HybridKVCacheCoordinator,
    KVCacheClasses,
    KVCacheOptions,
    get_kv_cache_coordinator,
)
from sim.core.kv.specs import KVCacheConfig, MambaSpec, cdiv
from sim.core.request import Request, RequestStatus


class KVCacheBlocks:
    """Blocks per group (``blocks[g][i]``), the allocation result handed to the scheduler."""

    __slots__ = ("blocks",)

    def __init__(self, blocks: tuple[Sequence[KVCacheBlock], ...]) -> None:
        self.blocks = blocks

    def __add__(self, other: "KVCacheBlocks") -> "KVCacheBlocks":
        return KVCacheBlocks(tuple([*a, *b] for a, b in zip(self.blocks, other.blocks)))

    def get_block_ids(self, allow_none: bool = False) -> tuple[list[int], ...] | None:
        if allow_none and all(len(g) == 0 for g in self.blocks):
            return None
        return tuple([b.block_id for b in g] for g in self.blocks)

    def get_unhashed_block_ids_all_groups(self) -> list[list[int]]:
        return [[b.block_id for b in g if b.block_hash is None and not b.is_null] for g in self.blocks]

    def __repr__(self) -> str:
        return f"KVCacheBlocks({self.get_block_ids()})"


class KVCacheManager:
    """Prefix lookup, slot allocation, caching and freeing for all groups.

    ``watermark``: fraction of ``num_blocks`` kept free when admitting waiting
    or preempted requests (vLLM default 0). ``max_in_flight_tokens`` sizes the
    sliding-window admission cap (vLLM: concurrent batches x
    ``max_num_batched_tokens``; defaults to ``max_model_len``).
    ``corrected_mamba_accounting``: see :class:`~sim.core.kv.single_type_kv_cache_manager.MambaManager`.
    ``eviction_policy``: ``None`` is vLLM's LRU (the plain pool); anything else
    is a what-if policy (:mod:`sim.core.kv.eviction`), told ``eviction_context``.
    ``kv_cache_classes``: the classes of the pool and the per-group managers (a subclass may choose others
    that decide the same: :class:`~sim.core.kv.kv_cache_coordinator.KVCacheClasses`).
    """

    kv_cache_classes: ClassVar[KVCacheClasses] = KVCacheClasses()

    def __init__(
        self,
        kv_cache_config: KVCacheConfig,
        *,
        max_in_flight_tokens: int | None = None,
        enable_kv_cache_events: bool = True,
        watermark: float = 0.0,
        corrected_mamba_accounting: bool = False,
        eviction_policy: EvictionPolicy | None = None,
        eviction_context: EvictionContext | None = None,
    ) -> None:
        if watermark < 0:
            raise ValueError(f"watermark must be non-negative, got {watermark}")
        self.kv_cache_config = kv_cache_config
        self.max_model_len = kv_cache_config.max_model_len
        self.enable_caching = kv_cache_config.enable_prefix_caching
        #: How the coordinator was built (a speed-layer subclass may build another from it).
        self.kv_cache_options = KVCacheOptions(
            enable_kv_cache_events,
            max_in_flight_tokens,
            corrected_mamba_accounting,
            eviction_policy,
            eviction_context,
            self.kv_cache_classes,
        )
        self.coordinator = get_kv_cache_coordinator(kv_cache_config, self.kv_cache_options)
        self.block_pool = self.coordinator.block_pool
        #: The pool that tags extra Mamba states (a what-if placement needs a policy pool), else None.
        self._extra_state_pool = self.block_pool if isinstance(self.block_pool, PolicyBlockPool) else None
        self.num_kv_cache_groups = len(kv_cache_config.groups)
        self.watermark_blocks = int(watermark * kv_cache_config.num_blocks)
        self.scheduler_block_size = kv_cache_config.scheduler_block_size
        self.hash_block_size = kv_cache_config.hash_block_size
        self.empty_kv_cache_blocks = KVCacheBlocks(tuple(() for _ in range(self.num_kv_cache_groups)))

    @property
    def usage(self) -> float:
        return self.block_pool.get_usage()

    def prefix_cache_lookup_enabled(self, request: Request) -> bool:
        return self.enable_caching and request.prefix_cache_hit_limit != 0

    def get_num_cached_tokens(self, request: Request) -> int:
        """vLLM 0.34: how many of the request's tokens the prefix cache holds (the reconciled hit, capped at
        ``num_tokens - 1``), or 0 without a lookup. Only probes: no reference, no block, no event
        (cache-aware admission asks it for requests that may not be scheduled)."""
        if not self.prefix_cache_lookup_enabled(request):
            return 0
        return self.coordinator.find_longest_cache_hit(request.block_hashes, request.num_tokens - 1)[1]

    def get_computed_blocks(
        self, request: Request, max_cache_hit_length: int | None = None
    ) -> tuple[KVCacheBlocks, int, int]:
        """``(blocks, hit tokens, shared_prefix_boundary)``; the hit is capped at
        ``num_tokens - 1`` (the last token is recomputed for logits). The
        boundary is the junction where a sparse group lags full attention
        (hit + uncached shared prefix), or 0."""
        if not self.prefix_cache_lookup_enabled(request):
            return self.empty_kv_cache_blocks, 0, 0
        max_cache_hit_length = request.get_max_cache_hit_length(max_cache_hit_length)
        blocks, hit, uncached = self.coordinator.find_longest_cache_hit(request.block_hashes, max_cache_hit_length)
        boundary = hit + uncached if uncached else 0
        return self.create_kv_cache_blocks(blocks), hit, boundary

    def get_computed_blocks_for_connector(
        self, request: Request, max_cache_hit_length: int | None = None
    ) -> tuple[KVCacheBlocks, int, int, bool]:
        """vLLM #48425: for a hybrid Mamba model, report the full-attention hit
        (unreconciled per-group blocks) and whether another group lags it
        (``hit_diverged``); if any group hits deeper than full attention, fall
        back to the reconciled :meth:`get_computed_blocks`."""
        coordinator = self.coordinator
        if not (
            self.kv_cache_config.has_mamba_layers
            and isinstance(coordinator, HybridKVCacheCoordinator)
            and coordinator.full_attention_group_id is not None
        ):
            return (*self.get_computed_blocks(request, max_cache_hit_length), False)
        if not self.prefix_cache_lookup_enabled(request):
            return self.empty_kv_cache_blocks, 0, 0, False
        max_cache_hit_length = request.get_max_cache_hit_length(max_cache_hit_length)
        fa = coordinator.full_attention_group_id
        blocks, hits = coordinator.find_longest_cache_hit_per_group(request.block_hashes, max_cache_hit_length)
        if any(h > hits[fa] for h in hits):
            return (*self.get_computed_blocks(request, max_cache_hit_length), False)
        return self.create_kv_cache_blocks(blocks), hits[fa], 0, min(hits) < hits[fa]

    def find_per_group_hits(self, request: Request) -> tuple[int, ...]:
        """Each group's independent hit (capped at ``num_tokens - 1``), for the
        admissions table's ``hit_gN`` columns. Touches nothing."""
        if not self.prefix_cache_lookup_enabled(request):
            return tuple(0 for _ in range(self.num_kv_cache_groups))
        return self.coordinator.find_longest_cache_hit_per_group(request.block_hashes, request.num_tokens - 1)[1]

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: KVCacheBlocks | None = None,
        num_lookahead_tokens: int = 0,
        num_external_computed_tokens: int = 0,
        delay_cache_blocks: bool = False,
        full_sequence_must_fit: bool = False,
        reserved_blocks: int = 0,
        has_scheduled_reqs: bool = True,
    ) -> KVCacheBlocks | None:
        """Give ``request`` slots for ``| computed | new hit | external | new | lookahead |``.

        Returns the newly allocated blocks, or ``None`` when they do not fit
        (the full prompt when ``full_sequence_must_fit``; always leaving
        ``reserved_blocks`` and, for waiting/preempted admissions next to
        scheduled requests, the watermark). Frees out-of-window blocks first,
        touches hits in every group before allocating external blocks, and
        caches up to ``min(computed + new, num_tokens)`` unless ``delay_cache_blocks``.
        """
        rid = request.request_id
        if num_new_tokens == 0 and num_external_computed_tokens == 0 and num_new_computed_tokens == 0:
            raise ValueError("num_new_tokens must be greater than 0 when there are no computed tokens to adopt")
        coordinator = self.coordinator
        empty = self.empty_kv_cache_blocks.blocks
        computed_lists = new_computed_blocks.blocks if new_computed_blocks is not None else empty
        num_local = request.num_computed_tokens + num_new_computed_tokens
        total_computed = min(num_local + num_external_computed_tokens, self.max_model_len)
        watermark = 0
        if has_scheduled_reqs and request.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED):
            watermark = self.watermark_blocks
        prefill_end = max(request.num_prompt_tokens, request.num_tokens - 1)
        if full_sequence_must_fit:
            full = min(request.num_tokens, self.max_model_len)
            need = coordinator.get_num_blocks_to_allocate(
                rid, full, computed_lists, total_computed, num_local, full, True, prefill_end
            )
            if need + watermark > self.block_pool.get_num_free_blocks():
                return None
        main = total_computed + num_new_tokens
        need_slot = min(main + num_lookahead_tokens, self.max_model_len)
        coordinator.remove_skipped_blocks(rid, max(0, total_computed - request.num_in_flight_tokens))
        need = coordinator.get_num_blocks_to_allocate(
            rid,
            need_slot,
            computed_lists,
            num_local + num_external_computed_tokens,
            num_local,
            main,
            False,
            prefill_end,
        )
        if need + watermark > self.block_pool.get_num_free_blocks() - reserved_blocks:
            return None
        if computed_lists is not empty or num_external_computed_tokens > 0:
            coordinator.allocate_new_computed_blocks(rid, computed_lists, num_local, num_external_computed_tokens)
        new_blocks = coordinator.allocate_new_blocks(rid, need_slot, main)
        if delay_cache_blocks:
            return self.create_kv_cache_blocks(new_blocks)
        coordinator.cache_blocks(request, min(total_computed + num_new_tokens, request.num_tokens))
        return self.create_kv_cache_blocks(new_blocks)

    def free(self, request: Request) -> None:
        """Free every group's table (group order, each tail first)."""
        self.coordinator.free(request.request_id)
        if self._extra_state_pool is not None and request.extra_state_positions:
            self._extra_state_pool.set_extra_state_positions(request.request_id, ())

    def set_extra_state_positions(self, request: Request) -> None:
        """A what-if placement chose ``request.extra_state_positions``: the pool tags those states when
        they are keyed, for the eviction policy. Only with a policy pool (which a what-if placement gets)."""
        assert self._extra_state_pool is not None, "a what-if checkpoint placement needs a policy block pool"
        self._extra_state_pool.set_extra_state_positions(request.request_id, request.extra_state_positions)

    def remove_skipped_blocks(
        self, request_id: str, processed_computed_tokens: int, num_prompt_tokens: int | None = None
    ) -> None:
        """Free out-of-window blocks (``num_prompt_tokens`` is only read by vLLM's R-SWA, not modelled)."""
        self.coordinator.remove_skipped_blocks(request_id, processed_computed_tokens)

    def evict_blocks(self, block_ids: Iterable[int], request_id: str = "", cause: str = "evict_forced") -> None:
        """Drop the cache entries of these blocks (connector load errors, scripted evictions)."""
        self.block_pool.evict_blocks(block_ids, request_id, cause)

    def reset_prefix_cache(self) -> bool:
        return self.coordinator.reset_prefix_cache()

    def take_events(self) -> list[KVEvent]:
        return self.block_pool.take_events()

    def take_event_log(self) -> KVEventLog:
        return self.block_pool.take_event_log()

    @property
    def num_pending_events(self) -> int:
        """Events emitted and not yet taken by :meth:`take_events`."""
        return self.block_pool.num_pending_events

    def get_blocks(self, request_id: str) -> KVCacheBlocks:
        return self.create_kv_cache_blocks(self.coordinator.get_blocks(request_id))

    def get_block_ids(self, request_id: str) -> tuple[list[int], ...]:
        return tuple([b.block_id for b in g] for g in self.coordinator.get_blocks(request_id))

    def get_block_ids_for_computed_tokens(self, request_id: str, num_computed_tokens: int) -> tuple[list[int], ...]:
        """Block ids covering the computed tokens (attention groups clipped; Mamba whole)."""
        out: list[list[int]] = []
        for group, ids in zip(self.kv_cache_config.groups, self.get_block_ids(request_id)):
            if isinstance(group.spec, MambaSpec):
                out.append(ids)
            else:
                out.append(ids[: cdiv(num_computed_tokens, group.spec.block_size)])
        return tuple(out)

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        if self.enable_caching:
            self.coordinator.cache_blocks(request, num_computed_tokens)

    def create_kv_cache_blocks(self, blocks: tuple[Sequence[KVCacheBlock], ...]) -> KVCacheBlocks:
        """The shared empty instance when no group has a block (identity matters
        in :meth:`allocate_slots`, as in vLLM)."""
        return KVCacheBlocks(blocks) if any(blocks) else self.empty_kv_cache_blocks

    def truncate_computed_blocks(self, blocks: KVCacheBlocks, num_computed_tokens: int) -> KVCacheBlocks:
        """A lookup result cut at an aligned endpoint; Mamba lists are clamped
        (vLLM #51468), other groups must cover the endpoint. Pure slicing."""
        out: list[list[KVCacheBlock]] = []
        for group_blocks, group in zip(blocks.blocks, self.kv_cache_config.groups, strict=True):
            bs = group.spec.block_size
            assert num_computed_tokens % bs == 0, "num_computed_tokens % block_size == 0"
            n = num_computed_tokens // bs
            if isinstance(group.spec, MambaSpec):
                n = min(n, len(group_blocks))
            else:
                assert n <= len(group_blocks), "num_blocks <= len(group_blocks)"
            out.append(list(group_blocks[:n]))
        return self.create_kv_cache_blocks(tuple(out))

    def new_step_starts(self) -> None:
        """Call at the start of every ``schedule()`` (clears Mamba's same-step set)."""
        self.coordinator.new_step_starts()

    def cached_block_ids(self, block_hash: BlockHash, group_id: int) -> list[int]:
        """Ids of every block cached under ``block_hash`` in ``group_id``, ascending (read-only; what a
        scripted eviction names before :meth:`evict_blocks`)."""
        return [b.block_id for b in self.block_pool.get_all_cached_blocks(block_hash, group_id)]

    def num_free_blocks(self) -> int:
        """Free blocks in the pool (steps table ``free_blocks``)."""
        return self.block_pool.get_num_free_blocks()

    def num_blocks_per_group(self) -> tuple[int, ...]:
        """Distinct real blocks held by each group's tables (steps table ``blocks_gN``)."""
        return tuple([m.num_held_blocks() for m in self.coordinator.single_type_managers])

    def num_cached_per_group(self) -> tuple[int, ...]:
        """Cache entries of each group (steps table ``cached_gN``)."""
        pool = self.block_pool
        return tuple(pool.num_cached_entries(g) for g in range(self.num_kv_cache_groups))


def check_invariants(manager: KVCacheManager) -> None:
    """Raise ``AssertionError("<invariant>: details")`` if the pool or a table is inconsistent.

    Checked: no negative ref count; ref counts equal table membership across
    requests and groups; no block both free and owned; block conservation
    (free + owned + null = num_blocks); cached map consistent with the
    blocks' keys; the per-group held-block and entry counts the manager reports (a speed layer's
    counters) equal the tables' and the cached map's.
    """
    pool = manager.block_pool
    holders: dict[int, int] = {}
    for m in manager.coordinator.single_type_managers:
        for rid, blocks in m.req_to_blocks.items():
            for b in blocks:
                if b.is_null:
                    if b is not pool.null_block:
                        raise AssertionError(f"null block identity: request {rid} holds a foreign null block")
                    continue
                if pool.blocks[b.block_id] is not b:
                    raise AssertionError(f"block identity: request {rid} holds a block not from the pool")
                holders[b.block_id] = holders.get(b.block_id, 0) + 1
    free_ids: set[int] = set()
    for b in pool.free_block_queue:
        if b.block_id in free_ids:
            raise AssertionError(f"free queue: block {b.block_id} appears twice")
        free_ids.add(b.block_id)
    if len(free_ids) != pool.get_num_free_blocks():
        raise AssertionError(
            f"free queue: {len(free_ids)} linked blocks but num_free_blocks={pool.get_num_free_blocks()}"
        )
    if pool.null_block.block_id in free_ids:
        raise AssertionError("free queue: the null block is in the free queue")
    for b in pool.blocks:
        if b.is_null:
            continue
        if b.ref_cnt < 0:
            raise AssertionError(f"negative ref count: block {b.block_id} has ref_cnt={b.ref_cnt}")
        expected = holders.get(b.block_id, 0)
        if b.ref_cnt != expected:
            raise AssertionError(
                f"ref count: block {b.block_id} ref_cnt={b.ref_cnt} but held by {expected} table slots"
            )
        if (b.block_id in free_ids) != (b.ref_cnt == 0):
            raise AssertionError(
                f"free xor owned: block {b.block_id} ref_cnt={b.ref_cnt}, in free queue={b.block_id in free_ids}"
            )
    reported = manager.num_blocks_per_group()
    for gid, m in enumerate(manager.coordinator.single_type_managers):
        held = {b.block_id for blocks in m.req_to_blocks.values() for b in blocks if not b.is_null}
        if len(held) != reported[gid]:
            raise AssertionError(
                f"held blocks: group {gid} tables hold {len(held)} distinct blocks but the manager says {reported[gid]}"
            )
    owned = len(holders)
    if owned + len(free_ids) + 1 != pool.num_gpu_blocks:
        raise AssertionError(
            f"block conservation: free {len(free_ids)} + owned {owned} + null 1 != num_blocks {pool.num_gpu_blocks}"
        )
    counts: dict[int, int] = {}
    for gid, group_map in pool.cached_block_hash_to_block.items():
        for h, entry in group_map.items():
            members = list(entry.values()) if isinstance(entry, dict) else [entry]
            if not members:
                raise AssertionError(f"cached map: empty entry for hash {h} in group {gid}")
            for b in members:
                if b.block_hash != (h, gid):
                    raise AssertionError(
                        f"cached map: key {(h, gid)} maps to block {b.block_id} whose key is {b.block_hash}"
                    )
            counts[gid] = counts.get(gid, 0) + len(members)
    for b in pool.blocks:
        key = b.block_hash
        if key is None:
            continue
        if b.is_null:
            raise AssertionError("cached map: the null block holds a cache key")
        mapped = pool.cached_block_hash_to_block.get(key[1], {}).get(key[0])
        found = mapped is b if not isinstance(mapped, dict) else mapped.get(b.block_id) is b
        if not found:
            raise AssertionError(f"cached map: block {b.block_id} holds key {key} but the map does not point to it")
    for gid, entries in enumerate(manager.num_cached_per_group()):
        if counts.get(gid, 0) != entries:
            raise AssertionError(
                f"cached map: group {gid} has {counts.get(gid, 0)} entries but the manager says {entries}"
            )
