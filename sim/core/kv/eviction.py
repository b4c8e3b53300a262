"""The eviction-policy seam of the block pool: which free cached block an allocation takes.

``cache.eviction_policy: lru`` (the default) is vLLM 0.33 exactly: the pool is
the plain :class:`~sim.core.kv.block_pool.BlockPool` and ``get_new_blocks`` pops the
front of the free queue, with no hook and no extra work. Any other policy is a
**what-if, not vLLM**; the pool is then a :class:`PolicyBlockPool`, which
differs from the plain pool only here:

What a policy may change
    Only *which* free cached blocks ``get_new_blocks`` takes, and so which
    cache entries are dropped. :meth:`EvictionPolicy.select` returns ``k``
    distinct blocks that are free (ref count 0) and cached; the pool unlinks
    them from the free queue, drops their entries (event cause
    ``evict_policy``) and hands them out after the uncached ones.

What a policy may not change
    Everything else stays vLLM's: the free queue's order (uncached freed
    blocks at the front, cached ones at the back, ``touch`` unlinks), lazy
    eviction (an entry stays findable until its block is taken), the number
    of blocks handed out, lookups, ref counts, and the rule that **free
    uncached blocks are taken first**, in queue order, before any cached
    block is evicted. A policy never touches ref counts or the cached map and
    never calls back into the pool's mutating methods; it only reads the pool
    (the cached map, the free queue, block metadata) inside ``select``.

Extra Mamba states
    Under a what-if checkpoint placement (:mod:`sim.core.policy.checkpoint`)
    the pool is told each request's extra state positions
    (:meth:`PolicyBlockPool.set_extra_state_positions`) and keeps the ids of
    the blocks whose Mamba entry is such an extra state in
    :attr:`PolicyBlockPool.extra_state_ids` (while the entry lives). Policies
    read it to drop extra states before a request's own state.

Invariant of a :class:`PolicyBlockPool` (tested): every free uncached block
precedes every free cached block in the queue. The plain pool keeps it too,
except after ``evict_blocks`` on a free block (the entry goes, the block stays
where it was); the policy pool moves such a block to the front, as
``free_blocks`` would have placed it uncached. That is the one queue-order
difference, and it only exists under a non-``lru`` policy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Protocol, Sequence

from sim.core.kv.block_pool import BlockPool, KVCacheBlock
from sim.core.kv.hashing import BlockHash
from sim.core.kv.specs import KVCacheConfig, MambaSpec

#: Event cause of an entry dropped because a non-``lru`` policy chose its block.
EVICT_POLICY_CAUSE = "evict_policy"


@dataclass(frozen=True)
class EvictionContext:
    """What a policy may know beyond the pool and the layout.

    ``connector_attached``: a KV connector is attached, so external tokens (and
    perhaps a Mamba state) may complete a local hit. ``prefill_flops(p)``: the
    FLOPs of prefilling the first ``p`` tokens of a prompt from an empty
    context (from the step-time model), or ``None`` when the scenario has no
    model to derive them from.
    """

    connector_attached: bool = False
    prefill_flops: Callable[[int], float] | None = None


class EvictionPolicy(Protocol):
    """A non-``lru`` eviction policy (see the module docstring for its contract).

    ``mirrors_vllm`` is ``False`` for every such policy: a scenario that
    selects one is not verifiable against vLLM.
    """

    name: str
    mirrors_vllm: bool

    def bind(self, pool: "PolicyBlockPool", config: KVCacheConfig, context: EvictionContext) -> None:
        """Called once, by the pool's constructor, before any other hook."""
        ...

    def on_cached(self, block: KVCacheBlock, parent: BlockHash | None) -> None:
        """``block`` got a cache entry (``block.block_hash``); ``parent`` is the key of
        the previous block of the same request in the same group, or ``None`` when it
        is the first block or unknown (a Mamba checkpoint re-keyed in place)."""
        ...

    def on_uncached(self, block: KVCacheBlock, key: tuple[BlockHash, int]) -> None:
        """The entry ``key`` of ``block`` was dropped (any cause)."""
        ...

    def on_reset(self) -> None:
        """Every entry was dropped (``reset_prefix_cache``)."""
        ...

    def on_freed(self, blocks: Sequence[KVCacheBlock]) -> None:
        """One ``free_blocks`` call dropped a reference on each of ``blocks`` (non-null, in
        the given order, ref counts already dropped; those at 0 are now at the queue's end
        if cached). A policy only reads them."""
        ...

    def select(self, num_blocks: int) -> list[KVCacheBlock]:
        """``num_blocks`` distinct free cached blocks to evict, in the order handed out.

        Called only when the free queue's leading uncached blocks are taken and at
        least ``num_blocks`` free cached blocks remain (they then are the queue).
        """
        ...


class PolicyBlockPool(BlockPool):
    """A :class:`BlockPool` whose allocations evict what ``policy`` chooses (a what-if)."""

    def __init__(
        self,
        num_blocks: int,
        enable_caching: bool,
        enable_kv_cache_events: bool = True,
        *,
        hash_block_size: int,
        policy: EvictionPolicy,
        config: KVCacheConfig,
        context: EvictionContext,
    ) -> None:
        super().__init__(num_blocks, enable_caching, enable_kv_cache_events, hash_block_size=hash_block_size)
        self.policy = policy
        self._mamba_groups = frozenset(g for g, group in enumerate(config.groups) if isinstance(group.spec, MambaSpec))
        #: request id -> the positions where a what-if placement has it save extra Mamba states.
        self.extra_state_positions: dict[str, tuple[int, ...]] = {}
        #: Ids of the blocks whose (Mamba) cache entry is an extra state: kept while the entry lives.
        self.extra_state_ids: set[int] = set()
        policy.bind(self, config, context)

    def set_extra_state_positions(self, request_id: str, positions: tuple[int, ...]) -> None:
        """``request_id``'s extra state positions from now on (``()``: none, forgotten)."""
        if positions:
            self.extra_state_positions[request_id] = positions
        else:
            self.extra_state_positions.pop(request_id, None)

    def cache_full_blocks(
        self,
        request_id: str,
        blocks: Sequence[KVCacheBlock],
        block_hashes: Sequence[BlockHash],
        num_cached_blocks: int,
        num_full_blocks: int,
        block_size: int,
        kv_cache_group_id: int,
        block_mask: Sequence[bool] | None = None,
    ) -> None:
        span = range(num_cached_blocks, max(num_cached_blocks, num_full_blocks))
        uncached = [i for i in span if blocks[i].block_hash is None]
        super().cache_full_blocks(
            request_id,
            blocks,
            block_hashes,
            num_cached_blocks,
            num_full_blocks,
            block_size,
            kv_cache_group_id,
            block_mask,
        )
        policy = self.policy
        extra = self.extra_state_positions.get(request_id, ()) if kv_cache_group_id in self._mamba_groups else ()
        for i in uncached:
            blk = blocks[i]
            if blk.block_hash is not None:  # newly keyed (null and masked-out blocks stay uncached)
                if extra and blk.block_hash_num_tokens in extra:
                    self.extra_state_ids.add(blk.block_id)
                policy.on_cached(blk, block_hashes[i - 1] if i > 0 else None)

    def cache_partial_block(
        self, request_id: str, block: KVCacheBlock, block_hash: BlockHash, num_tokens: int, kv_cache_group_id: int
    ) -> tuple[BlockHash, int] | None:
        key = super().cache_partial_block(request_id, block, block_hash, num_tokens, kv_cache_group_id)
        if key is not None:
            self.policy.on_cached(block, None)
        return key

    def _maybe_evict_cached_block(self, blk: KVCacheBlock, request_id: str, cause: str) -> bool:
        key = blk.block_hash
        if not super()._maybe_evict_cached_block(blk, request_id, cause):
            return False
        assert key is not None
        self.extra_state_ids.discard(blk.block_id)
        self.policy.on_uncached(blk, key)
        if blk.prev_free_block is not None:  # free and now uncached: to the front, as free_blocks places it
            self.free_block_queue.remove(blk)
            self.free_block_queue.prepend_n((blk,))
        return True

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        """vLLM's ``free_blocks``, then the policy hears which blocks were freed (:meth:`EvictionPolicy.on_freed`)."""
        blocks = [b for b in ordered_blocks if not b.is_null]
        super().free_blocks(blocks)
        self.policy.on_freed(blocks)

    def reset_prefix_cache(self) -> bool:
        if not super().reset_prefix_cache():
            return False
        self.extra_state_ids.clear()
        self.policy.on_reset()
        return True

    def get_new_blocks(self, num_blocks: int, request_id: str = "") -> list[KVCacheBlock]:
        """Leading uncached free blocks first (queue order), then the policy's victims."""
        queue = self.free_block_queue
        if num_blocks > queue.num_free_blocks:
            raise ValueError(f"Cannot get {num_blocks} free blocks from the pool")
        ret: list[KVCacheBlock] = []
        if not self.enable_caching:
            ret = queue.popleft_n(num_blocks)
        else:
            for block in queue:
                if len(ret) == num_blocks or block.block_hash is not None:
                    break
                ret.append(block)
            for block in ret:
                queue.remove(block)
            missing = num_blocks - len(ret)
            if missing:
                victims = self.policy.select(missing)
                _check_victims(victims, missing)
                for block in victims:
                    queue.remove(block)
                    self._maybe_evict_cached_block(block, request_id, EVICT_POLICY_CAUSE)
                ret.extend(victims)
        for block in ret:
            assert block.ref_cnt == 0
            block.ref_cnt = 1
        return ret


def _check_victims(victims: Sequence[KVCacheBlock], expected: int) -> None:
    if len(victims) != expected or len({b.block_id for b in victims}) != expected:
        raise AssertionError(f"eviction policy returned {len(victims)} blocks, {expected} distinct needed")
    for block in victims:
        if block.prev_free_block is None or block.block_hash is None:
            raise AssertionError(f"eviction policy chose block {block.block_id}, which is not free and cached")


def make_block_pool(
    config: KVCacheConfig,
    enable_caching: bool,
    enable_kv_cache_events: bool,
    policy: EvictionPolicy | None,
    context: EvictionContext | None = None,
    *,
    lru_pool: type[BlockPool] = BlockPool,
    policy_pool: type[PolicyBlockPool] = PolicyBlockPool,
) -> BlockPool:
    """The plain vLLM pool for ``policy=None`` (``lru``), else a :class:`PolicyBlockPool` (either as a
    subclass that decides the same, if given: the speed layer's counting pools)."""
    if policy is None or not enable_caching:
        return lru_pool(
            config.num_blocks, enable_caching, enable_kv_cache_events, hash_block_size=config.hash_block_size
        )
    return policy_pool(
        config.num_blocks,
        enable_caching,
        enable_kv_cache_events,
        hash_block_size=config.hash_block_size,
        policy=policy,
        config=config,
        context=context or EvictionContext(),
    )


def free_cached_blocks(pool: BlockPool) -> Iterable[KVCacheBlock]:
    """The free cached blocks in LRU order (oldest first); lazily, so a policy can stop early."""
    for block in pool.free_block_queue:
        if block.block_hash is not None:
            yield block
