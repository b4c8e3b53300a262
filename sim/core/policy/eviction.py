"""Eviction policies: which free cached block an allocation evicts (``cache.eviction_policy``).

``lru`` (the default) is vLLM 0.33's free-queue order and is not an object at
all: :func:`create_eviction_policy` returns ``None`` and the plain
:class:`~sim.core.kv.block_pool.BlockPool` runs, untouched. Every other policy is a
**what-if, not vLLM** (``mirrors_vllm = False``; a scenario that selects one is
not verifiable against vLLM); the contract a policy must keep is in
:mod:`sim.core.kv.eviction`. Built-ins:

* ``group_coherent``: dead entries first (:class:`ChainIndex` defines "dead"),
  then LRU.
* ``marconi``: after Marconi (Pan et al., *Marconi: Prefix Caching for the Era
  of Hybrid LLMs*, MLSys 2025, arXiv:2411.19379): the lowest
  ``recency + alpha * FLOP efficiency`` goes first.
* ``reuse_value``: an aged reuse value on a freed-block clock (GreedyDual-like):
  short fresh chains go first, every priority ages; a chain and its last state
  are kept as one unit.

Third-party policies come from the entry point group
``hybridsim.eviction_policies``; each entry point loads a
:class:`BaseEvictionPolicy` subclass whose constructor takes the
``cache.eviction_options`` as keyword arguments (docs/eviction.md has a
copyable example). :func:`register_eviction_policy` adds one in-process.
"""

from __future__ import annotations

import heapq
from typing import ClassVar, Mapping, Sequence

from sim.core.kv.block_pool import BlockPool, KVCacheBlock
from sim.core.kv.eviction import EvictionContext, PolicyBlockPool, free_cached_blocks
from sim.core.kv.hashing import BlockHash
from sim.core.kv.specs import FullAttentionSpec, KVCacheConfig, MambaSpec, SlidingWindowSpec
from sim.core.registry import OptionValue, Registry

ENTRY_POINT_GROUP = "hybridsim.eviction_policies"
LRU = "lru"


class BaseEvictionPolicy:
    """Base class of the non-``lru`` policies (it satisfies :class:`sim.core.kv.eviction.EvictionPolicy`).

    Subclasses set ``name``, validate their options in ``__init__`` (raise
    ``ValueError`` with a message naming the option) and implement
    :meth:`select`. ``bind`` stores ``pool``, ``config`` and ``context``;
    the hooks do nothing unless overridden.
    """

    name: ClassVar[str] = ""
    #: Every policy but ``lru`` is a what-if: never a mirror of vLLM.
    mirrors_vllm: ClassVar[bool] = False

    pool: PolicyBlockPool
    config: KVCacheConfig
    context: EvictionContext

    def check_context(self, context: EvictionContext) -> None:
        """Raise ``ValueError`` if the policy cannot work with ``context`` (called before the run is built)."""

    def bind(self, pool: PolicyBlockPool, config: KVCacheConfig, context: EvictionContext) -> None:
        self.check_context(context)
        self.pool = pool
        self.config = config
        self.context = context

    def on_cached(self, block: KVCacheBlock, parent: BlockHash | None) -> None:
        """A cache entry was added (see :class:`sim.core.kv.eviction.EvictionPolicy`)."""

    def on_uncached(self, block: KVCacheBlock, key: tuple[BlockHash, int]) -> None:
        """A cache entry was dropped."""

    def on_reset(self) -> None:
        """Every cache entry was dropped."""

    def on_freed(self, blocks: Sequence[KVCacheBlock]) -> None:
        """Blocks lost a reference (see :class:`sim.core.kv.eviction.EvictionPolicy`)."""

    def select(self, num_blocks: int) -> list[KVCacheBlock]:
        raise NotImplementedError


_REGISTRY: Registry[BaseEvictionPolicy] = Registry(
    BaseEvictionPolicy,
    ENTRY_POINT_GROUP,
    "cache.eviction_policy",
    "eviction policy",
    options_key="cache.eviction_options",
)


def register_eviction_policy(cls: type[BaseEvictionPolicy]) -> type[BaseEvictionPolicy]:
    """Register a policy class in-process (usable as a decorator)."""
    return _REGISTRY.register(cls)


def eviction_policy_names() -> list[str]:
    """``lru`` plus every built-in and installed policy, sorted."""
    return sorted({LRU, *_REGISTRY.names()})


def builtin_eviction_policy_names() -> list[str]:
    """``lru`` plus the policies registered in code (no installed plug-ins), sorted."""
    return sorted({LRU, *_REGISTRY.builtin_names()})


def create_eviction_policy(name: str, options: Mapping[str, OptionValue] | None = None) -> BaseEvictionPolicy | None:
    """The policy called ``name`` with ``options``; ``None`` for ``lru`` (the plain vLLM pool).

    Unknown names, unknown options and bad option values raise a ``ValueError``
    naming ``cache.eviction_policy`` / ``cache.eviction_options``.
    """
    opts = dict(options or {})
    if name == LRU:
        if opts:
            raise ValueError(f"cache.eviction_options: lru takes no options (given: {', '.join(sorted(opts))})")
        return None
    try:
        _REGISTRY.get_class(name)
    except ValueError:
        raise ValueError(
            f"cache.eviction_policy: unknown eviction policy {name!r}; valid: {', '.join(eviction_policy_names())}"
        ) from None
    try:
        return _REGISTRY.create(name, **opts)
    except ValueError as exc:
        message = str(exc)
        prefix = "" if message.startswith("cache.eviction_options") else "cache.eviction_options: "
        raise ValueError(prefix + message) from None


def eviction_policy_for_placement(policy: BaseEvictionPolicy | None) -> BaseEvictionPolicy:
    """The eviction policy of a run with a what-if checkpoint placement: ``policy``, or for ``lru``
    (``None``) :class:`ExtraStatesFirstLRU`, so that the pool tags extra states and drops them first."""
    return policy if policy is not None else ExtraStatesFirstLRU()


def eviction_not_verifiable_reason(name: str) -> str | None:
    """Why a scenario with eviction policy ``name`` cannot be verified against vLLM, or ``None`` for ``lru``."""
    if name == LRU:
        return None
    cls = _REGISTRY.get_class(name)
    if cls.mirrors_vllm:
        return None
    return f"cache.eviction_policy: {name} is a what-if eviction policy (vLLM evicts in LRU free-queue order)"


def _positive_int(value: object, option: str, policy: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{policy}: option {option} must be a positive integer, got {value!r}")
    return value


class ChainIndex:
    """Which cache entries are *dead*: no future local hit can use them, in any group.

    A usable local hit at boundary ``p`` (vLLM's reconciled lookup) needs, in
    every group: full attention (FA) all blocks of ``[0, p)``; sliding window
    (SWA) the ``n = blocks_for_hit`` blocks ending at ``p``; Mamba the state at
    exactly ``p``. An entry with key ``h`` at boundary ``p`` (``p`` =
    ``block_hash_num_tokens``; the FA block, SWA block and Mamba state ending
    at ``p`` share the key ``h``) is detected dead when:

    * **Mamba state**: some FA group, some other Mamba group or some SWA group
      holds no entry ``h`` (the FA prefix chain is broken at ``p``, or the
      other groups' parts of boundary ``p`` are gone).
    * **FA block**: its parent (the previous block of its chain in the same
      group) is not cached (the chain is broken above it); or, when the model
      has Mamba groups and no connector is attached (a connector might supply
      a state), it has no cached child in its group and no Mamba group holds a
      state ``h`` (it lies beyond the deepest surviving state of its chain).
    * **SWA block**: some FA group holds no entry ``h`` (every window holding
      this block ends at or beyond ``p``, where the FA prefix is broken); or
      ``n > 1``, its parent is not cached and it has no cached child (it can be
      neither the last block of a full window nor an earlier one).

    Each test is O(number of groups) dictionary lookups. The rules look one
    level up and one level down only, so the detected set is a subset of the
    truly dead entries (never a live one): a chain broken several blocks up is
    found one block at a time, as each detected orphan is evicted (peeling).
    The index (parent per cached FA/SWA block, cached-child counts) is kept
    incrementally from the pool's hooks: O(1) per cache entry added or dropped.
    """

    def __init__(self, pool: BlockPool, config: KVCacheConfig, context: EvictionContext) -> None:
        self._cached = pool.cached_block_hash_to_block
        self._pool = pool
        self.fa_groups: tuple[int, ...] = ()
        self.mamba_groups: tuple[int, ...] = ()
        self.swa_groups: tuple[int, ...] = ()
        self._swa_blocks: dict[int, int] = {}
        fa, mamba, swa = [], [], []
        for gid, group in enumerate(config.groups):
            spec = group.spec
            if isinstance(spec, FullAttentionSpec):
                fa.append(gid)
            elif isinstance(spec, MambaSpec):
                mamba.append(gid)
            elif isinstance(spec, SlidingWindowSpec):
                swa.append(gid)
                self._swa_blocks[gid] = spec.blocks_for_hit
        self.fa_groups, self.mamba_groups, self.swa_groups = tuple(fa), tuple(mamba), tuple(swa)
        self._chained = frozenset(fa) | frozenset(swa)
        self.fa_tail_rule = bool(mamba) and not context.connector_attached
        #: block id -> key of its parent block in the same group (cached FA/SWA entries only).
        self._parent: dict[int, BlockHash | None] = {}
        #: (group, hash) -> cached FA/SWA entries whose parent has that key.
        self._children: dict[tuple[int, BlockHash], int] = {}

    # ------------------------------------------------------------------ hooks
    def on_cached(self, block: KVCacheBlock, parent: BlockHash | None) -> None:
        key = block.block_hash
        assert key is not None
        gid = key[1]
        if gid not in self._chained:
            return
        self._parent[block.block_id] = parent
        if parent is not None:
            ck = (gid, parent)
            self._children[ck] = self._children.get(ck, 0) + 1

    def on_uncached(self, block: KVCacheBlock, key: tuple[BlockHash, int]) -> None:
        if block.block_id not in self._parent:
            return
        parent = self._parent.pop(block.block_id)
        if parent is not None:
            ck = (key[1], parent)
            left = self._children[ck] - 1
            if left:
                self._children[ck] = left
            else:
                del self._children[ck]

    def on_reset(self) -> None:
        self._cached = self._pool.cached_block_hash_to_block
        self._parent.clear()
        self._children.clear()

    # ---------------------------------------------------------------- queries
    def _has(self, gid: int, h: BlockHash) -> bool:
        group_map = self._cached.get(gid)
        return group_map is not None and h in group_map

    def continued(self, block: KVCacheBlock) -> bool:
        """Whether ``block`` is an FA or SWA block with a cached child in its group (never for Mamba)."""
        key = block.block_hash
        assert key is not None
        return key[1] in self._chained and (key[1], key[0]) in self._children

    def is_dead(self, block: KVCacheBlock) -> bool:
        """Whether ``block``'s entry is dead by the rules of the class docstring."""
        key = block.block_hash
        assert key is not None
        h, gid = key
        has = self._has
        if gid in self._swa_blocks:
            if any(not has(f, h) for f in self.fa_groups):
                return True
            parent = self._parent.get(block.block_id)
            return (
                self._swa_blocks[gid] > 1
                and parent is not None
                and not has(gid, parent)
                and (gid, h) not in self._children
            )
        if gid in self._chained:  # full attention
            parent = self._parent.get(block.block_id)
            if parent is not None and not has(gid, parent):
                return True
            return (
                self.fa_tail_rule and (gid, h) not in self._children and not any(has(m, h) for m in self.mamba_groups)
            )
        # Mamba
        for other in self.fa_groups + self.swa_groups + self.mamba_groups:
            if other != gid and not has(other, h):
                return True
        return False


def fill_lru(pool: PolicyBlockPool, chosen: list[KVCacheBlock], num_blocks: int) -> list[KVCacheBlock]:
    """``chosen`` (distinct free cached blocks, a policy's picks) cut or topped up to ``num_blocks`` with
    the oldest free cached blocks not in it (vLLM's LRU order)."""
    if len(chosen) >= num_blocks:
        return chosen[:num_blocks]
    taken = {b.block_id for b in chosen}
    for block in free_cached_blocks(pool):
        if block.block_id not in taken:
            chosen.append(block)
            if len(chosen) == num_blocks:
                break
    return chosen


class _IndexedPolicy(BaseEvictionPolicy):
    """A policy that keeps a :class:`ChainIndex` and looks at a bounded window of candidates.

    ``window``: at most this many free cached blocks, oldest first, are
    examined per allocation (the bound on the work: O(window x groups) per
    allocation that evicts, independent of the pool size). Blocks beyond the
    window are evicted in LRU order when the window has too few.
    """

    index: ChainIndex

    def __init__(self, window: int = 512) -> None:
        self.window = _positive_int(window, "window", self.name)

    def bind(self, pool: PolicyBlockPool, config: KVCacheConfig, context: EvictionContext) -> None:
        super().bind(pool, config, context)
        self.index = ChainIndex(pool, config, context)

    def on_cached(self, block: KVCacheBlock, parent: BlockHash | None) -> None:
        self.index.on_cached(block, parent)

    def on_uncached(self, block: KVCacheBlock, key: tuple[BlockHash, int]) -> None:
        self.index.on_uncached(block, key)

    def on_reset(self) -> None:
        self.index.on_reset()


class GroupCoherentPolicy(_IndexedPolicy):
    """Dead entries first, then extra Mamba states, then LRU (a what-if, not vLLM).

    Among the ``window`` oldest free cached blocks, the dead ones
    (:class:`ChainIndex`) are evicted first, oldest first; then the extra
    states a what-if checkpoint placement saved
    (:attr:`~sim.core.kv.eviction.PolicyBlockPool.extra_state_ids`, cheaper to
    drop than a request's own state: a speculative save, whose request keeps
    its last state), oldest first; the rest of the allocation is taken in
    vLLM's LRU order. Deadness is judged as the window is scanned, before any
    of this allocation's blocks is evicted. ``extra_first: false`` treats
    extra states as any other entry.
    """

    name = "group_coherent"

    def __init__(self, window: int = 512, extra_first: bool = True) -> None:
        super().__init__(window)
        self.extra_first = extra_first

    def select(self, num_blocks: int) -> list[KVCacheBlock]:
        dead: list[KVCacheBlock] = []
        extra: list[KVCacheBlock] = []
        is_dead = self.index.is_dead
        extra_ids = self.pool.extra_state_ids if self.extra_first else ()
        for scanned, block in enumerate(free_cached_blocks(self.pool)):
            if scanned == self.window:
                break
            if is_dead(block):
                dead.append(block)
                if len(dead) == num_blocks:
                    break
            elif block.block_id in extra_ids and len(extra) < num_blocks:
                extra.append(block)
        return fill_lru(self.pool, dead + extra, num_blocks)


class ExtraStatesFirstLRU(BaseEvictionPolicy):
    """vLLM's LRU order, except that extra Mamba states go first (a what-if, not vLLM).

    What ``cache.eviction_policy: lru`` means under a what-if checkpoint
    placement (:mod:`sim.core.policy.checkpoint`): among the ``window`` oldest
    free cached blocks the extra states
    (:attr:`~sim.core.kv.eviction.PolicyBlockPool.extra_state_ids`) are
    evicted first, oldest first; then LRU. Under vLLM's placement there are no
    extra states and ``lru`` is the plain pool, not this class.
    """

    name = LRU

    def __init__(self, window: int = 512) -> None:
        self.window = _positive_int(window, "window", self.name)

    def select(self, num_blocks: int) -> list[KVCacheBlock]:
        extra_ids = self.pool.extra_state_ids
        chosen: list[KVCacheBlock] = []
        if extra_ids:
            for scanned, block in enumerate(free_cached_blocks(self.pool)):
                if scanned == self.window or len(chosen) == num_blocks:
                    break
                if block.block_id in extra_ids:
                    chosen.append(block)
        return fill_lru(self.pool, chosen, num_blocks)


class MarconiPolicy(_IndexedPolicy):
    """Marconi-style utility eviction (a what-if, not vLLM).

    After Pan et al., *Marconi: Prefix Caching for the Era of Hybrid LLMs*
    (MLSys 2025, arXiv:2411.19379). Among the ``window`` oldest free cached
    blocks, each candidate gets

        score = recency + alpha * efficiency / max efficiency over the window

    where ``recency`` is its LRU rank scaled to [0, 1] (0 = oldest) and
    ``efficiency`` is the prefill FLOPs a hit at its boundary ``p`` saves (the
    step-time model's per-layer costs: :attr:`EvictionContext.prefill_flops`)
    divided by the bytes the entry holds (one page; pages are unified, so this
    is the model's bytes per block). A dead entry (:class:`ChainIndex`) saves
    nothing: efficiency 0. Candidates are the dead entries and, of the live
    ones, the units Marconi's radix tree evicts: with Mamba groups, the Mamba
    states (a state closes a radix node; once it goes, the FA blocks only it
    used become dead and follow, dead first), never a live FA or SWA block
    (dropping one would break every state below it); without Mamba groups, the
    FA/SWA leaves (no cached child), so chains shrink tail first. The lowest
    scores go first (ties: oldest first); then LRU order. An extra Mamba state
    of a what-if checkpoint placement
    (:attr:`~sim.core.kv.eviction.PolicyBlockPool.extra_state_ids`) counts
    ``extra_weight`` (default 0.5) of its efficiency: a speculative save is
    cheaper to drop than a request's own state (1.0: no difference).

    Where we differ from the paper: Marconi scores radix-tree nodes (a token
    segment's KV plus one SSM state) over the whole cache; we score single
    blocks of vLLM's paged pool within a bounded window, and a node's "KV +
    state" becomes "one page" since the pool's pages have one size. Marconi's
    admission policy (checkpoint SSM states only at predicted reuse points:
    the branch point of a purely-input reuse, the end of the last decode of an
    input-plus-output reuse) is not modelled separately: vLLM's align mode
    with ``retention_interval: 0`` already keeps states only at the prompt's
    last block boundary and at the shared-prefix junction, which covers both
    reuse kinds of a trace whose next turn extends the previous prompt.
    """

    name = "marconi"

    def __init__(self, alpha: float = 1.0, window: int = 512, extra_weight: float = 0.5) -> None:
        super().__init__(window)
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or alpha < 0:
            raise ValueError(f"marconi: option alpha must be a non-negative number, got {alpha!r}")
        if isinstance(extra_weight, bool) or not isinstance(extra_weight, (int, float)) or not 0 <= extra_weight <= 1:
            raise ValueError(f"marconi: option extra_weight must be a number in [0, 1], got {extra_weight!r}")
        self.alpha = float(alpha)
        self.extra_weight = float(extra_weight)

    def check_context(self, context: EvictionContext) -> None:
        if context.prefill_flops is None:
            raise ValueError(
                "marconi needs the step-time model's per-layer costs for its FLOP term: give the scenario "
                "clock: time, or a model preset and a hardware preset; or use group_coherent"
            )

    def bind(self, pool: PolicyBlockPool, config: KVCacheConfig, context: EvictionContext) -> None:
        super().bind(pool, config, context)
        assert context.prefill_flops is not None
        self._flops = context.prefill_flops
        self._page_bytes = float(config.bytes_per_block or 1)

    def select(self, num_blocks: int) -> list[KVCacheBlock]:
        index = self.index
        window: list[KVCacheBlock] = []
        for block in free_cached_blocks(self.pool):
            if len(window) == self.window:
                break
            window.append(block)
        last = max(len(window) - 1, 1)
        flops = self._flops
        extra_ids = self.pool.extra_state_ids
        scored: list[tuple[int, float, KVCacheBlock]] = []
        best = 0.0
        for rank, block in enumerate(window):
            if index.is_dead(block):
                scored.append((rank, 0.0, block))
            elif block.block_hash[1] in index.mamba_groups if index.mamba_groups else not index.continued(block):  # type: ignore[index]
                eff = flops(block.block_hash_num_tokens or 0) / self._page_bytes
                if block.block_id in extra_ids:
                    eff *= self.extra_weight
                best = max(best, eff)
                scored.append((rank, eff, block))
        alpha = self.alpha / best if best > 0 else 0.0
        scored.sort(key=lambda item: (item[0] / last + alpha * item[1], item[0]))
        return fill_lru(self.pool, [block for _, _, block in scored[:num_blocks]], num_blocks)


class ReuseValuePolicy(BaseEvictionPolicy):
    """Aged reuse value: keep the chains a later request is likely to extend (a what-if, not vLLM).

    A GreedyDual-style order on a block clock. The policy counts the blocks
    freed so far (``clock``); each time blocks are freed (a request's table
    per group, tail first, or a state freed during prefill), every one that
    reached no reference and is cached gets the priority

        H = clock + horizon * (n / (n + M) + reuse_bonus * reused)

    where ``n`` is the deepest boundary of the freed blocks, in blocks (for a
    request's full-attention table: its chain length), ``M`` the number of
    Mamba groups (the pages a state costs, so ``n / (n + M)`` is the share of
    a chain plus its state that the hit pays back), and ``reused`` is 1 when a
    freed block already held its entry when it was freed before (the request
    hit it: a continued conversation, which is likelier to be continued again).
    The lowest ``H`` is evicted first (ties: freed first, so a table goes tail
    first), so a block outlives a fresh, short one by up to ``horizon`` freed
    blocks, and every priority ages: nothing long is kept forever (unlike a
    rank-scaled score such as ``marconi``'s). A unit is kept whole: a freed
    full-attention table lifts the states at its deepest boundary that has any
    (the request's last state) to its own ``H``, a freed state takes the ``H``
    of the full-attention block at its boundary when higher, and when a
    full-attention block is evicted the states at its boundary (now unusable)
    go first at the next allocation. Extra states of a what-if placement are
    freed alone during prefill and so age as short fresh chains do: cheaper
    to drop than a request's last state.

    Cost: O(blocks freed x groups) bookkeeping and a heap push per stamp;
    ``select`` pops O(log pool) per victim (stale stamps are skipped; the
    heap is rebuilt from the live stamps when it exceeds 4 entries a block, so
    it holds O(pool) entries). The
    defaults (``horizon: 40000``, ``reuse_bonus: 0.5``) were tuned on the
    Mooncake conversation trace at half rate (docs/checkpoints.md).
    """

    name = "reuse_value"

    def __init__(self, horizon: int = 40000, reuse_bonus: float = 0.5) -> None:
        self.horizon = _positive_int(horizon, "horizon", self.name)
        if isinstance(reuse_bonus, bool) or not isinstance(reuse_bonus, (int, float)) or reuse_bonus < 0:
            raise ValueError(f"reuse_value: option reuse_bonus must be a non-negative number, got {reuse_bonus!r}")
        self.reuse_bonus = float(reuse_bonus)

    def bind(self, pool: PolicyBlockPool, config: KVCacheConfig, context: EvictionContext) -> None:
        super().bind(pool, config, context)
        groups = config.groups
        self._fa = tuple(g for g, grp in enumerate(groups) if isinstance(grp.spec, FullAttentionSpec))
        self._mamba = tuple(g for g, grp in enumerate(groups) if isinstance(grp.spec, MambaSpec))
        self._state_pages = max(len(self._mamba), 1)
        self._block_size = config.scheduler_block_size
        self._clock = 0
        self._seq = 0
        #: block id -> (H, seq) of its current stamp (kept while the block holds its entry).
        self._stamp: dict[int, tuple[float, int]] = {}
        self._heap: list[tuple[float, int, int]] = []
        #: blocks whose entry became unusable (a state whose full-attention block was evicted).
        self._dead: list[tuple[KVCacheBlock, tuple[BlockHash, int]]] = []

    def _put(self, block: KVCacheBlock, priority: float) -> None:
        self._seq += 1
        self._stamp[block.block_id] = (priority, self._seq)
        heap = self._heap
        heapq.heappush(heap, (priority, self._seq, block.block_id))
        if len(heap) > 4 * len(self.pool.blocks) + 64:
            # drop the stale entries: at most one live entry per block remains (pops unchanged)
            stamp = self._stamp
            self._heap = [e for e in heap if stamp.get(e[2], (0.0, -1))[1] == e[1]]
            heapq.heapify(self._heap)

    def _entry(self, gid: int, h: BlockHash) -> KVCacheBlock | None:
        """The block holding entry ``h`` in group ``gid`` (``None``: none, or several)."""
        entry = self.pool.cached_block_hash_to_block.get(gid, {}).get(h)
        return entry if isinstance(entry, KVCacheBlock) else None

    def _partner(self, gid: int, block: KVCacheBlock) -> KVCacheBlock | None:
        key = block.block_hash
        assert key is not None
        return self._entry(gid, key[0])

    def on_uncached(self, block: KVCacheBlock, key: tuple[BlockHash, int]) -> None:
        self._stamp.pop(block.block_id, None)
        if key[1] in self._fa:
            for gid in self._mamba:
                entry = self._entry(gid, key[0])
                if entry is not None and entry.ref_cnt == 0:
                    self._dead.append((entry, (key[0], gid)))

    def on_reset(self) -> None:
        self._stamp.clear()
        self._heap.clear()
        self._dead.clear()

    def on_freed(self, blocks: Sequence[KVCacheBlock]) -> None:
        stamp = self._stamp
        kept = [b for b in blocks if b.ref_cnt == 0 and b.block_hash is not None]
        if not kept:
            return
        self._clock += len(kept)
        reused = any(b.block_id in stamp for b in blocks)
        n = max(b.block_hash_num_tokens or 0 for b in kept) // self._block_size
        value = n / (n + self._state_pages) + (self.reuse_bonus if reused else 0.0)
        priority = self._clock + self.horizon * value
        fa = self._fa
        gid = kept[0].block_hash[1]  # type: ignore[index]
        if gid in fa:
            for block in kept:
                self._put(block, priority)
            # the request's last state: at the deepest boundary of the table that has one
            for block in sorted(kept, key=lambda b: -(b.block_hash_num_tokens or 0)):
                states = [s for m in self._mamba if (s := self._partner(m, block)) is not None]
                if states:
                    for state in states:
                        if state.ref_cnt == 0 and stamp.get(state.block_id, (-1.0, 0))[0] < priority:
                            self._put(state, priority)
                    break
        else:
            for block in kept:
                own = priority
                for f in fa:
                    partner = self._partner(f, block)
                    if partner is not None and partner.block_id in stamp:
                        own = max(own, stamp[partner.block_id][0])
                self._put(block, own)

    def select(self, num_blocks: int) -> list[KVCacheBlock]:
        chosen: list[KVCacheBlock] = []
        taken: set[int] = set()
        while self._dead and len(chosen) < num_blocks:
            block, entry_key = self._dead.pop()
            if block.ref_cnt == 0 and block.block_hash == entry_key and block.block_id not in taken:
                chosen.append(block)
                taken.add(block.block_id)
        heap, stamp, blocks = self._heap, self._stamp, self.pool.blocks
        while heap and len(chosen) < num_blocks:
            priority, seq, bid = heapq.heappop(heap)
            block = blocks[bid]
            current = stamp.get(bid)
            if current is None or current[1] != seq or block.ref_cnt != 0 or bid in taken:
                continue
            chosen.append(block)
            taken.add(bid)
        return fill_lru(self.pool, chosen, num_blocks)


for _cls in (GroupCoherentPolicy, MarconiPolicy, ReuseValuePolicy):
    register_eviction_policy(_cls)
