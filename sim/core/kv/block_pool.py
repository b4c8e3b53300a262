"""The block pool: every KV-cache page, the LRU free queue and the prefix-cache map.

Mirrors vLLM 0.33 ``vllm/v1/core/block_pool.py`` and the ``KVCacheBlock`` /
``FreeKVCacheBlockQueue`` of ``kv_cache_utils.py``:

* Block 0 is the null block (popped first from the initial id-ordered queue);
  it fills skipped table slots, is never cached and its ref count is not kept.
  Usable blocks: ``num_blocks - 1``.
* A block whose ref count drops to 0 joins the free queue: at the **front** if
  it holds no cache key (reused first), at the **back** if it is cached (LRU).
* Eviction is lazy: a cached free block stays findable until
  :meth:`BlockPool.get_new_blocks` pops it; only then are its keys dropped.
* The cached map may hold several blocks under one key (equal content computed
  twice); blocks are never merged, so block tables stay append-only. A lookup
  returns the earliest inserted block still holding the key.

Deliberate differences from vLLM:

* A block holds at most one cache key. vLLM keeps extra keys only for
  partial-block entries (``cache_partial_block`` without replacement). Without
  fine-grained partial hits (never modelled; see
  :func:`sim.core.kv.specs.check_modelled_layout`) the only such entry is the one a
  full-attention group whose block is larger than the hash block registers at
  the prompt's last hash boundary (``FullAttentionManager._cache_partial_tail_block``),
  always on a block that already holds its full key. Lookups at that group's
  block size never ask for it, so leaving it out changes no decision, only the
  ``stored``/``removed`` events and the per-group entry counts.
* Events are our own small :class:`KVEvent` records and carry the request and a
  cause; they are always buffered (vLLM's are optional and carry token ids).
* The cached map is one dict per group keyed by the plain hash (vLLM: one dict
  keyed by hash + group id); the lookups and their order are the same.
"""

from __future__ import annotations

from typing import Callable, Iterable, Iterator, NamedTuple, Sequence

from sim.core.kv.hashing import BlockHash, group_key

CacheKey = tuple[BlockHash, int]


class KVEvent(NamedTuple):
    """One change of the prefix cache.

    ``kind`` is ``stored`` (a block got a new cache entry), ``removed`` (an
    entry was dropped) or ``cleared`` (the whole cache was reset; group and
    block are -1, hash 0). ``request_id`` is the request whose action caused
    it ("" if none); ``cause`` is ``cache``, ``evict_lru`` (lazy eviction by an
    allocation), ``evict_policy`` (the same, the block chosen by a non-``lru``
    eviction policy: :mod:`sim.core.kv.eviction`), ``evict_forced`` (:meth:`BlockPool.evict_blocks`),
    ``checkpoint`` (a transient Mamba checkpoint entry dropped or re-keyed),
    ``reset`` or a caller-given cause such as ``load_error``.
    """

    kind: str
    group: int
    block_id: int
    block_hash: int
    request_id: str
    cause: str


class KVEventLog:
    """Buffered :class:`KVEvent` s, one list per field (the ``kv_events`` columns they become).

    Invariant: the six lists always have the same length; entry ``i`` of each
    is event ``i``, in emission order. The recorder extends its columns from
    the lists directly (the events become a table, not records).
    """

    __slots__ = ("kind", "group", "block_id", "block_hash", "request_id", "cause")

    def __init__(self) -> None:
        self.kind: list[str] = []
        self.group: list[int] = []
        self.block_id: list[int] = []
        self.block_hash: list[int] = []
        self.request_id: list[str] = []
        self.cause: list[str] = []

    def append(self, kind: str, group: int, block_id: int, block_hash: int, request_id: str, cause: str) -> None:
        self.kind.append(kind)
        self.group.append(group)
        self.block_id.append(block_id)
        self.block_hash.append(block_hash)
        self.request_id.append(request_id)
        self.cause.append(cause)

    def extend(self, events: Iterable[KVEvent]) -> None:
        """Append events given as records (a connector's), in order."""
        for e in events:
            self.append(e.kind, e.group, e.block_id, e.block_hash, e.request_id, e.cause)

    def extend_log(self, other: KVEventLog) -> None:
        """Append ``other``'s events, in order (column by column)."""
        self.kind.extend(other.kind)
        self.group.extend(other.group)
        self.block_id.extend(other.block_id)
        self.block_hash.extend(other.block_hash)
        self.request_id.extend(other.request_id)
        self.cause.extend(other.cause)

    def __len__(self) -> int:
        return len(self.kind)

    def rows(self) -> list[KVEvent]:
        """The events as records, in order."""
        return [
            KVEvent(*fields)
            for fields in zip(self.kind, self.group, self.block_id, self.block_hash, self.request_id, self.cause)
        ]


class KVCacheBlock:
    """Metadata of one KV-cache page.

    Invariants: ``ref_cnt`` is the number of (request, group) table slots that
    hold the block (the null block excepted); a block is in the free queue iff
    ``ref_cnt == 0`` and it is not the null block; ``block_hash`` is the cache
    key ``(hash, group_id)`` it is findable under, or ``None``.
    ``taint`` names the request whose admission left wrong content in the block
    (set by the divergence checker); it is cleared when the cache entry goes.
    """

    __slots__ = (
        "block_id",
        "ref_cnt",
        "block_hash",
        "block_hash_num_tokens",
        "prev_free_block",
        "next_free_block",
        "is_null",
        "taint",
    )

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        self.block_hash: CacheKey | None = None
        #: Prefix length (tokens) the cache key covers.
        self.block_hash_num_tokens: int | None = None
        self.prev_free_block: KVCacheBlock | None = None
        self.next_free_block: KVCacheBlock | None = None
        self.is_null = False
        self.taint: str | None = None

    def __repr__(self) -> str:
        return f"KVCacheBlock({self.block_id}, ref={self.ref_cnt}, hash={self.block_hash})"


class FreeKVCacheBlockQueue:
    """Doubly linked list of free blocks in eviction order (front = evicted first).

    All operations are O(1) per block and allocate nothing: the links live in
    the blocks themselves, between a fake head and a fake tail.
    """

    __slots__ = ("num_free_blocks", "_head", "_tail")

    def __init__(self, blocks: Sequence[KVCacheBlock]) -> None:
        self._head = KVCacheBlock(-1)
        self._tail = KVCacheBlock(-1)
        self._head.next_free_block = self._tail
        self._tail.prev_free_block = self._head
        self.num_free_blocks = 0
        self.append_n(list(blocks))

    def __len__(self) -> int:
        return self.num_free_blocks

    def __iter__(self) -> Iterator[KVCacheBlock]:
        block = self._head.next_free_block
        tail = self._tail
        while block is not tail:
            assert block is not None
            yield block
            block = block.next_free_block

    def popleft(self) -> KVCacheBlock:
        first = self._head.next_free_block
        if first is self._tail or first is None:
            raise ValueError("No free blocks available")
        self._unlink(first)
        return first

    def popleft_n(self, n: int) -> list[KVCacheBlock]:
        if n > self.num_free_blocks:
            raise ValueError(f"Cannot pop {n} of {self.num_free_blocks} free blocks")
        out: list[KVCacheBlock] = []
        block = self._head.next_free_block
        for _ in range(n):
            assert block is not None
            out.append(block)
            nxt = block.next_free_block
            block.prev_free_block = block.next_free_block = None
            block = nxt
        assert block is not None
        self._head.next_free_block = block
        block.prev_free_block = self._head
        self.num_free_blocks -= n
        return out

    def remove(self, block: KVCacheBlock) -> None:
        if block.prev_free_block is None or block.next_free_block is None:
            raise RuntimeError(f"remove() of a block not in the free queue: {block}")
        self._unlink(block)

    def _unlink(self, block: KVCacheBlock) -> None:
        prev, nxt = block.prev_free_block, block.next_free_block
        assert prev is not None and nxt is not None
        prev.next_free_block = nxt
        nxt.prev_free_block = prev
        block.prev_free_block = block.next_free_block = None
        self.num_free_blocks -= 1

    def append(self, block: KVCacheBlock) -> None:
        self.append_n((block,))

    def append_n(self, blocks: Sequence[KVCacheBlock]) -> None:
        if not blocks:
            return
        last = self._tail.prev_free_block
        assert last is not None
        for block in blocks:
            block.prev_free_block = last
            last.next_free_block = block
            last = block
        last.next_free_block = self._tail
        self._tail.prev_free_block = last
        self.num_free_blocks += len(blocks)

    def prepend_n(self, blocks: Sequence[KVCacheBlock]) -> None:
        """Insert ``blocks`` at the front, keeping their order (first = next popped)."""
        if not blocks:
            return
        first = self._head.next_free_block
        assert first is not None
        prev = self._head
        for block in blocks:
            block.prev_free_block = prev
            prev.next_free_block = block
            prev = block
        prev.next_free_block = first
        first.prev_free_block = prev
        self.num_free_blocks += len(blocks)

    def block_ids(self) -> list[int]:
        """Free block ids in eviction order (for tests and diagnostics)."""
        return [b.block_id for b in self]


class BlockPool:
    """All ``num_blocks`` pages shared by every KV-cache group.

    Methods in the order of vLLM's ``BlockPool``: lookup, caching, allocation,
    lazy eviction, touch, free, forced eviction, reset, stats, events; ours
    (multi-block lookups for checks, entry counts, the event log) follow. See
    the module docstring for the free-queue and eviction rules.
    """

    def __init__(
        self, num_blocks: int, enable_caching: bool, enable_kv_cache_events: bool = True, *, hash_block_size: int
    ) -> None:
        if not isinstance(num_blocks, int) or num_blocks < 1:
            raise ValueError(f"num_blocks must be a positive integer, got {num_blocks!r}")
        self.num_gpu_blocks = num_blocks
        #: Granularity of ``Request.block_hashes``; groups view them at their own block size.
        self.hash_block_size = hash_block_size
        self.enable_caching = enable_caching
        self.enable_kv_cache_events = enable_kv_cache_events
        self.blocks = [KVCacheBlock(i) for i in range(num_blocks)]
        self.free_block_queue = FreeKVCacheBlockQueue(self.blocks)
        #: group id -> hash -> block, or {block_id: block} in insertion order when several hold it.
        self.cached_block_hash_to_block: dict[int, dict[BlockHash, KVCacheBlock | dict[int, KVCacheBlock]]] = {}
        self.null_block = self.free_block_queue.popleft()
        self.null_block.is_null = True
        self._events = KVEventLog()
        #: Called as ``listener(block, request_id)`` whenever a block gets a new
        #: cache entry (the divergence checker taints blocks through it), or None.
        self.cache_listener: Callable[[KVCacheBlock, str], None] | None = None

    # ----------------------------------------------------------------- lookup
    def get_cached_block(self, block_hash: BlockHash, kv_cache_group_ids: Sequence[int]) -> list[KVCacheBlock] | None:
        """One cached block per group for ``block_hash``, or None if any group misses.

        Where several blocks hold the key, the earliest inserted of those still
        holding it (vLLM ``BlockHashToBlockMap.get_one_block``)."""
        cached_blocks: list[KVCacheBlock] = []
        for group_id in kv_cache_group_ids:
            entry = self.cached_block_hash_to_block.get(group_id, {}).get(block_hash)
            if entry is None:
                return None
            cached_blocks.append(next(iter(entry.values())) if isinstance(entry, dict) else entry)
        return cached_blocks

    # ---------------------------------------------------------------- caching
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
        """Give ``blocks[num_cached_blocks:num_full_blocks]`` their cache keys, in order.

        ``block_hashes`` are the request's hashes viewed at ``block_size``
        (:func:`sim.core.kv.hash_view.block_hashes_at`), so a group with blocks
        coarser than the hash block stores the fine hash at each block's last
        hash boundary (vLLM ``resolve_block_hashes`` here). ``block_mask`` is
        aligned with that span: null blocks and masked-out blocks are skipped
        (vLLM: sparse SWA/Mamba retention). A block that already holds this
        exact key (a prefix hit) emits nothing.
        """
        if num_cached_blocks >= num_full_blocks:
            return
        new_full_blocks = blocks[num_cached_blocks:num_full_blocks]
        for i, blk in enumerate(new_full_blocks):
            if blk.is_null or (block_mask is not None and not block_mask[i]):
                continue
            index = num_cached_blocks + i
            self._insert_block_hash(request_id, blk, block_hashes[index], kv_cache_group_id, (index + 1) * block_size)

    def cache_partial_block(
        self,
        request_id: str,
        block: KVCacheBlock,
        block_hash: BlockHash,
        num_tokens: int,
        kv_cache_group_id: int,
    ) -> CacheKey | None:
        """Re-key ``block`` to ``block_hash``, its entry covering ``num_tokens`` (vLLM ``cache_partial_block``
        with ``replace_existing_hashes=True``, the form Mamba prefill checkpoints use): drop whatever
        it holds (cause ``checkpoint``), then insert and emit ``stored``. Returns the new key."""
        if block.is_null:
            return None
        self._maybe_evict_cached_block(block, request_id, "checkpoint")
        self._insert_block_hash(request_id, block, block_hash, kv_cache_group_id, num_tokens)
        return block.block_hash

    def _insert_block_hash(
        self, request_id: str, block: KVCacheBlock, block_hash: BlockHash, group_id: int, num_tokens: int
    ) -> None:
        """Key ``block`` under ``block_hash`` in ``group_id``, its entry covering ``num_tokens`` tokens: add
        the entry after any block already cached under that hash (vLLM ``BlockHashToBlockMap.insert``),
        emit ``stored`` (cause ``cache``) and call the cache listener. A block already holding that
        exact key is left alone (no event); one holding another key is an error (one key per block)."""
        key = block.block_hash
        if key is not None:
            if key[0] == block_hash and key[1] == group_id:
                return
            raise AssertionError(
                f"block {block.block_id} already cached under {key}, cannot cache {(block_hash, group_id)}"
            )
        group_map = self.cached_block_hash_to_block.setdefault(group_id, {})
        entry = group_map.get(block_hash)
        if entry is None:
            group_map[block_hash] = block
        elif isinstance(entry, dict):
            entry[block.block_id] = block
        else:
            group_map[block_hash] = {entry.block_id: entry, block.block_id: block}
        block.block_hash = group_key(block_hash, group_id)
        block.block_hash_num_tokens = num_tokens
        if self.enable_kv_cache_events:
            self._events.append("stored", group_id, block.block_id, block_hash, request_id, "cache")
        if self.cache_listener is not None:
            self.cache_listener(block, request_id)

    # ------------------------------------------------------------- allocation
    def get_new_blocks(self, num_blocks: int, request_id: str = "") -> list[KVCacheBlock]:
        """Pop ``num_blocks`` from the front of the free queue, evicting their entries.

        Raises ``ValueError("Cannot get N free blocks from the pool")`` when
        short, exactly as vLLM does (the crash an undercounted admission hits).
        """
        if num_blocks > self.get_num_free_blocks():
            raise ValueError(f"Cannot get {num_blocks} free blocks from the pool")
        ret = self.free_block_queue.popleft_n(num_blocks)
        for block in ret:
            if self.enable_caching:
                self._maybe_evict_cached_block(block, request_id, "evict_lru")
            assert block.ref_cnt == 0
            block.ref_cnt += 1
        return ret

    def _maybe_evict_cached_block(self, block: KVCacheBlock, request_id: str, cause: str) -> bool:
        """Remove ``block``'s cache entry if it has one: emit ``removed`` with ``cause``, clear its taint.
        Returns whether there was one. A shared entry keeps its other blocks, re-inserted last (as
        vLLM's ``BlockHashToBlockMap.pop`` puts them back)."""
        key = block.block_hash
        if key is None:
            return False
        block_hash, group_id = key
        group_map = self.cached_block_hash_to_block[group_id]
        entry = group_map.pop(block_hash)
        if isinstance(entry, dict):
            del entry[block.block_id]
            if entry:
                group_map[block_hash] = entry
        block.block_hash = None
        block.block_hash_num_tokens = None
        block.taint = None
        if self.enable_kv_cache_events:
            self._events.append("removed", group_id, block.block_id, block_hash, request_id, cause)
        return True

    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Take a reference on each (non-null) block; a free one leaves the queue."""
        for block in blocks:
            if block.is_null:
                continue
            if block.ref_cnt == 0:
                self.free_block_queue.remove(block)
            block.ref_cnt += 1

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        """Drop one reference on each block, given in eviction-priority order.

        Blocks reaching 0 go to the front if uncached (in the given order) and
        to the back if cached (in the given order).
        """
        blocks_to_evict_last: list[KVCacheBlock] = []
        blocks_to_evict_first: list[KVCacheBlock] = []
        for block in ordered_blocks:
            if block.is_null:
                continue
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                if block.block_hash is None or not self.enable_caching:
                    blocks_to_evict_first.append(block)
                else:
                    blocks_to_evict_last.append(block)
            elif block.ref_cnt < 0:
                raise AssertionError(f"negative ref count on block {block.block_id}")
        self.free_block_queue.prepend_n(blocks_to_evict_first)
        self.free_block_queue.append_n(blocks_to_evict_last)

    def evict_blocks(self, block_ids: Iterable[int], request_id: str = "", cause: str = "evict_forced") -> None:
        """Drop the cache entries of the given blocks (vLLM ``evict_blocks``).

        Owned blocks stay owned and free blocks keep their place in the queue.
        """
        for block_id in block_ids:
            if not 0 <= block_id < len(self.blocks):
                raise ValueError(f"evict_blocks: block id {block_id} outside 0..{len(self.blocks) - 1}")
            self._maybe_evict_cached_block(self.blocks[block_id], request_id, cause)

    def reset_prefix_cache(self) -> bool:
        """Forget every cache entry; only when every usable block is free. Emits ``cleared``."""
        num_used_blocks = self.num_gpu_blocks - self.get_num_free_blocks()
        if num_used_blocks != 1:  # the null block is always in use
            return False
        self.cached_block_hash_to_block = {}
        for block in self.blocks:
            block.block_hash = None
            block.block_hash_num_tokens = None
            block.taint = None
        if self.enable_kv_cache_events:
            self._events.append("cleared", -1, -1, 0, "", "reset")
        return True

    # ------------------------------------------------------------------ stats
    def get_num_free_blocks(self) -> int:
        return self.free_block_queue.num_free_blocks

    def get_usage(self) -> float:
        total = self.num_gpu_blocks - 1  # the null block
        if not total:
            return 0.0
        return 1.0 - self.get_num_free_blocks() / total

    # ----------------------------------------------------------------- events
    def take_events(self) -> list[KVEvent]:
        """The events emitted since the last take, as records (:meth:`take_event_log` as rows)."""
        return self.take_event_log().rows()

    # ------------------------------------------------------------------- ours
    def get_all_cached_blocks(self, block_hash: BlockHash, group_id: int) -> list[KVCacheBlock]:
        """Every block cached under ``block_hash`` in ``group_id``, by ascending block id
        (equal content computed twice is cached twice; vLLM does not de-duplicate). Read-only."""
        entry = self.cached_block_hash_to_block.get(group_id, {}).get(block_hash)
        if entry is None:
            return []
        if isinstance(entry, dict):
            return sorted(entry.values(), key=lambda b: b.block_id)
        return [entry]

    def num_cached_entries(self, group_id: int) -> int:
        """Cache entries (blocks findable by a key) of one group, counted in the cached map: O(its entries)
        (the speed layer's pool keeps a counter: ``sim.accel.counters``)."""
        group_map = self.cached_block_hash_to_block.get(group_id)
        if not group_map:
            return 0
        return sum([len(entry) if isinstance(entry, dict) else 1 for entry in group_map.values()])

    @property
    def num_pending_events(self) -> int:
        """Events emitted and not yet taken (their ``kv_events.seq`` continues the recorded ones)."""
        return len(self._events)

    def take_event_log(self) -> KVEventLog:
        """The events emitted since the last take, as columns (the recorder's ``kv_events``); the pool
        starts a new log."""
        log = self._events
        self._events = KVEventLog()
        return log
