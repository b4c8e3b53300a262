"""One block-table manager per attention type (vLLM ``single_type_kv_cache_manager.py``).

Each manager owns, for one KV-cache group, ``req_to_blocks[request_id]`` (the
block table; the shared null block fills skipped slots) and
``num_cached_block[request_id]`` (how many leading table slots are already
cached or deliberately skipped). All of them draw from the one shared
:class:`~sim.core.kv.block_pool.BlockPool`.

Hit lookup (``find_longest_cache_hit``) is a classmethod, as in vLLM, because
the hybrid coordinator runs it once for several groups that share a spec.

Groups may have different block sizes. ``Request.block_hashes`` is at the hash
block size (the GCD of the group block sizes); every lookup and every caching
call views it at the group's own block size
(:func:`sim.core.kv.hash_view.block_hashes_at`, vLLM ``resolve_block_hashes``), and
hits are aligned to the coordinator's ``cache_hit_alignment_tokens`` (the LCM,
the scheduler block size).

Not modelled (vLLM features outside our scope; see docs/kv-core.md): EAGLE /
MTP block drops and speculative Mamba blocks, DCP/PCP, fine-grained partial
hits with copy-on-write (layouts that would enable them are rejected by
:func:`sim.core.kv.specs.check_modelled_layout`), the full-attention partial-tail
entry (see :mod:`sim.core.kv.block_pool`), chunked-local attention, cross attention,
R-SWA, boundary-state offload hand-offs, worker zeroing lists.
"""

from __future__ import annotations

from typing import Sequence

from sim.core.kv.block_pool import BlockPool, CacheKey, KVCacheBlock
from sim.core.kv.hash_view import block_hashes_at
from sim.core.kv.hashing import BlockHash
from sim.core.kv.specs import (
    FullAttentionSpec,
    KVCacheSpec,
    MambaSpec,
    SlidingWindowSpec,
    cdiv,
    prefill_checkpoint_position,
    prefill_checkpoint_valid,
)
from sim.core.request import Request

BlockLists = tuple[list[KVCacheBlock], ...]


def num_evictable(blocks: Sequence[KVCacheBlock]) -> int:
    """Hit blocks still in the free queue: touching them takes a free block."""
    return len([b for b in blocks if b.ref_cnt == 0 and not b.is_null])


def trim_null_head(blocks: list[KVCacheBlock]) -> list[KVCacheBlock]:
    """``blocks`` without leading null blocks (a skipped SWA/Mamba prefix)."""
    i = 0
    n = len(blocks)
    while i < n and blocks[i].is_null:
        i += 1
    return blocks[i:] if i else blocks


class SingleTypeKVCacheManager:
    """Shared bookkeeping; subclasses define lookup, skipping and retention."""

    def __init__(
        self,
        spec: KVCacheSpec,
        block_pool: BlockPool,
        kv_cache_group_id: int,
        *,
        enable_caching: bool,
        cache_hit_alignment_tokens: int,
        max_admission_blocks_per_request: int | None = None,
    ) -> None:
        self.kv_cache_spec = spec
        self.block_size = spec.block_size
        self.block_pool = block_pool
        self.kv_cache_group_id = kv_cache_group_id
        self.enable_caching = enable_caching
        self.cache_hit_alignment_tokens = cache_hit_alignment_tokens
        self.max_admission_blocks_per_request = max_admission_blocks_per_request
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        #: Only for requests that took their first allocation with hits (vLLM: "running").
        self.num_cached_block: dict[str, int] = {}
        self._null_block = block_pool.null_block
        self._init_kind()

    def _init_kind(self) -> None:
        """Subclass hook: state a group type derives from its spec, once the shared state exists."""

    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: Sequence[KVCacheBlock],
        total_computed_tokens: int,
        num_local_computed_tokens: int,
        num_tokens_main_model: int,
        apply_admission_cap: bool = False,
        prefill_end: int = 0,
    ) -> int:
        """Free blocks this group needs: new slots beyond what the table and the
        hit cover (skipped slots need none), plus hit blocks still in the free queue."""
        num_required = cdiv(num_tokens, self.block_size)
        if apply_admission_cap and self.max_admission_blocks_per_request is not None:
            num_required = min(num_required, self.max_admission_blocks_per_request)
        num_req_blocks = len(self.req_to_blocks.get(request_id, ()))
        if request_id in self.num_cached_block:
            assert not new_computed_blocks
            return max(num_required - num_req_blocks, 0)
        num_skipped_blocks = self.get_num_skipped_tokens(total_computed_tokens) // self.block_size
        num_local_blocks = len(new_computed_blocks) + num_req_blocks
        num_new = max(num_required - max(num_skipped_blocks, num_local_blocks), 0)
        skip_new_computed = max(0, num_skipped_blocks - num_req_blocks)
        return num_new + num_evictable(new_computed_blocks[skip_new_computed:])

    def add_local_computed_blocks(
        self,
        request_id: str,
        new_computed_blocks: Sequence[KVCacheBlock],
        num_local_computed_tokens: int,
        num_external_computed_tokens: int,
    ) -> None:
        """First allocation: touch the hit blocks, null-pad the skipped prefix."""
        req_blocks = self.req_to_blocks.setdefault(request_id, [])
        assert not req_blocks
        total = num_local_computed_tokens + num_external_computed_tokens
        num_skipped_blocks = self.get_num_skipped_tokens(total) // self.block_size
        if num_skipped_blocks > 0:
            new_computed_blocks = new_computed_blocks[num_skipped_blocks:]
        if self.enable_caching:
            self.block_pool.touch(new_computed_blocks)
        else:
            assert not new_computed_blocks, "computed blocks with prefix caching disabled"
        if num_skipped_blocks > 0:
            req_blocks.extend([self._null_block] * num_skipped_blocks)
        req_blocks.extend(new_computed_blocks)
        self.num_cached_block[request_id] = len(req_blocks)

    def num_external_blocks(
        self, num_table_blocks: int, num_local_computed_tokens: int, num_external_computed_tokens: int
    ) -> int:
        """Blocks :meth:`allocate_external_computed_blocks` takes for a table of ``num_table_blocks``."""
        total = num_local_computed_tokens + num_external_computed_tokens
        skipped = self.get_num_skipped_tokens(total)
        ext = num_external_computed_tokens
        if skipped > 0:
            ext = min(total - skipped, ext)
        if ext <= 0:
            return 0
        return max(0, cdiv(total, self.block_size) - num_table_blocks)

    def allocate_external_computed_blocks(
        self, request_id: str, num_local_computed_tokens: int, num_external_computed_tokens: int
    ) -> None:
        """Blocks for connector-supplied tokens inside the attended range (vLLM #33775 phase 2)."""
        req_blocks = self.req_to_blocks.setdefault(request_id, [])
        n = self.num_external_blocks(len(req_blocks), num_local_computed_tokens, num_external_computed_tokens)
        if n:
            req_blocks.extend(self.block_pool.get_new_blocks(n, request_id))

    def allocate_new_blocks(self, request_id: str, num_tokens: int, num_tokens_main_model: int) -> list[KVCacheBlock]:
        req_blocks = self.req_to_blocks.setdefault(request_id, [])
        num_new = cdiv(num_tokens, self.block_size) - len(req_blocks)
        if num_new <= 0:
            return []
        new_blocks = self.block_pool.get_new_blocks(num_new, request_id)
        req_blocks.extend(new_blocks)
        return new_blocks

    def cache_blocks(
        self,
        request: Request,
        num_tokens: int,
        retention_interval: int | None,
        replay_boundaries: Sequence[int],
    ) -> int:
        """Cache the request's full blocks up to ``num_tokens``, thinned by the retention mask;
        returns the request's cached-slot count afterwards.

        Reachable boundaries: the replay boundary ``P - 1`` and the request's
        shared-prefix junction (vLLM: Marconi-style APC). Block ``i`` is keyed
        by the hash at the last hash-block boundary inside it.
        """
        rid = request.request_id
        num_cached = self.num_cached_block.get(rid, 0)
        fine = request.block_hashes
        hbs = self.block_pool.hash_block_size
        num_full = min(num_tokens, len(fine) * hbs) // self.block_size
        if num_cached >= num_full:
            return num_cached
        hashes = block_hashes_at(fine, hbs, self.block_size)
        boundaries = list(replay_boundaries)
        if request.shared_prefix_boundary:
            boundaries.append(request.shared_prefix_boundary)
        # A what-if checkpoint placement's extra states (sim.core.policy.checkpoint); none under vLLM's.
        boundaries.extend(request.extra_state_positions)
        mask = self.reachable_block_mask(
            num_cached, num_full, self.cache_hit_alignment_tokens, self.kv_cache_spec, retention_interval, boundaries
        )
        self.block_pool.cache_full_blocks(
            rid, self.req_to_blocks[rid], hashes, num_cached, num_full, self.block_size, self.kv_cache_group_id, mask
        )
        self.num_cached_block[rid] = num_full
        return num_full

    @classmethod
    def reachable_block_mask(
        cls,
        start_block: int,
        end_block: int,
        alignment_tokens: int | None,
        kv_cache_spec: KVCacheSpec,
        retention_interval: int | None = None,
        reachable_boundaries: Sequence[int] = (),
    ) -> list[bool] | None:
        """Which of blocks ``[start, end)`` to cache; ``None`` = all (full attention)."""
        return None

    def pop_blocks_for_free(self, request_id: str) -> list[KVCacheBlock]:
        blocks = self.req_to_blocks.pop(request_id, [])
        self.num_cached_block.pop(request_id, None)
        return trim_null_head(blocks)

    def free(self, request_id: str) -> None:
        """Free the table tail first, so the tail is evicted first."""
        blocks = self.pop_blocks_for_free(request_id)
        if blocks:
            self.block_pool.free_blocks(reversed(blocks))

    @classmethod
    def find_longest_cache_hit(
        cls,
        block_hashes: Sequence[BlockHash],
        max_length: int,
        kv_cache_group_ids: Sequence[int],
        block_pool: BlockPool,
        kv_cache_spec: KVCacheSpec,
        alignment_tokens: int,
    ) -> tuple[BlockLists, int]:
        raise NotImplementedError

    def _remove_blocks_in_range(self, request_id: str, first_block: int, last_block: int) -> None:
        """Free ``[first, last)`` from the back, nulling the slots; stop at a null."""
        blocks = self.req_to_blocks.get(request_id)
        if blocks is None or first_block >= last_block:
            return
        last_block = min(last_block, len(blocks))
        null = self._null_block
        freed: list[KVCacheBlock] = []
        for i in range(last_block - 1, first_block - 1, -1):
            if blocks[i] is null:
                break
            freed.append(blocks[i])
            blocks[i] = null
        if freed:
            self.block_pool.free_blocks(freed)

    def remove_skipped_blocks(self, request_id: str, processed_computed_tokens: int) -> None:
        """Free blocks no longer attended, from the processed-token boundary."""
        skipped = self.get_num_skipped_tokens(processed_computed_tokens)
        if skipped <= 0:
            return
        blocks = self.req_to_blocks.get(request_id)
        if blocks is None:
            return
        self._remove_blocks_in_range(request_id, 0, min(skipped // self.block_size, len(blocks)))

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        """Tokens whose KV is no longer read (0 for full attention)."""
        return 0

    def new_step_starts(self) -> None:
        return None

    def num_held_blocks(self) -> int:
        """Distinct real blocks held by this group's tables (steps table ``blocks_gN``), counted in the
        tables: O(blocks held) (the speed layer's managers keep a counter: ``sim.accel.counters``)."""
        return len({b.block_id for blocks in self.req_to_blocks.values() for b in blocks if not b.is_null})


class FullAttentionManager(SingleTypeKVCacheManager):
    @classmethod
    def find_longest_cache_hit(
        cls,
        block_hashes: Sequence[BlockHash],
        max_length: int,
        kv_cache_group_ids: Sequence[int],
        block_pool: BlockPool,
        kv_cache_spec: KVCacheSpec,
        alignment_tokens: int,
    ) -> tuple[BlockLists, int]:
        """Left to right; the first miss ends the hit (hashes are chained).
        The hit is rounded down to ``alignment_tokens``."""
        bs = kv_cache_spec.block_size
        block_hashes = block_hashes_at(block_hashes, block_pool.hash_block_size, bs)
        computed: BlockLists = tuple([] for _ in kv_cache_group_ids)
        for i in range(min(max_length // bs, len(block_hashes))):
            cached = block_pool.get_cached_block(block_hashes[i], kv_cache_group_ids)
            if cached is None:
                break
            for lst, blk in zip(computed, cached):
                lst.append(blk)
        hit = len(computed[0]) * bs
        hit -= hit % alignment_tokens
        keep = cdiv(hit, bs)
        for lst in computed:
            del lst[keep:]
        return computed, hit


class SlidingWindowManager(SingleTypeKVCacheManager):
    def _init_kind(self) -> None:
        spec = self.kv_cache_spec
        assert isinstance(spec, SlidingWindowSpec)
        self.sliding_window = spec.window

    @classmethod
    def find_longest_cache_hit(
        cls,
        block_hashes: Sequence[BlockHash],
        max_length: int,
        kv_cache_group_ids: Sequence[int],
        block_pool: BlockPool,
        kv_cache_spec: KVCacheSpec,
        alignment_tokens: int,
    ) -> tuple[BlockLists, int]:
        """Right to left for ``cdiv(window - 1, B)`` contiguous cached blocks
        (``[null]*i + run``); a shorter run starting at block 0 also counts."""
        assert isinstance(kv_cache_spec, SlidingWindowSpec)
        bs = kv_cache_spec.block_size
        block_hashes = block_hashes_at(block_hashes, block_pool.hash_block_size, bs)
        need = kv_cache_spec.blocks_for_hit
        max_blocks = min(max_length // bs, len(block_hashes))
        null = block_pool.null_block
        computed: BlockLists = tuple([null] * max_blocks for _ in kv_cache_group_ids)
        run = 0
        found = False
        get = block_pool.get_cached_block
        for i in range(max_blocks - 1, -1, -1):
            cached = get(block_hashes[i], kv_cache_group_ids)
            if cached is not None:
                if run == 0 and bs != alignment_tokens and ((i + 1) * bs) % alignment_tokens:
                    continue
                for lst, blk in zip(computed, cached):
                    lst[i] = blk
                run += 1
                if run >= need:
                    for lst in computed:
                        del lst[i + run :]
                    found = True
                    break
            else:
                run = 0
        if not found:
            for lst in computed:
                del lst[run:]
            while bs != alignment_tokens and (len(computed[0]) * bs) % alignment_tokens:
                for lst in computed:
                    lst.pop()
        return computed, len(computed[0]) * bs

    @classmethod
    def reachable_block_mask(
        cls,
        start_block: int,
        end_block: int,
        alignment_tokens: int | None,
        kv_cache_spec: KVCacheSpec,
        retention_interval: int | None = None,
        reachable_boundaries: Sequence[int] = (),
    ) -> list[bool] | None:
        """Keep the ``need``-block tail before each segment boundary (one per
        ``retention_interval``, or per alignment when dense) and before each
        reachable boundary."""
        assert isinstance(kv_cache_spec, SlidingWindowSpec)
        if alignment_tokens is None:
            return None
        bs = kv_cache_spec.block_size
        if alignment_tokens % bs:
            return None
        need = kv_cache_spec.blocks_for_hit
        mask = [False] * (end_block - start_block)
        if retention_interval is None:
            segment: int | None = alignment_tokens
        else:
            segment = retention_interval or None
        if segment is not None:
            per = segment // bs
            if need >= per:
                return None
            for i in range(start_block, end_block):
                if i % per >= per - need:
                    mask[i - start_block] = True
        if retention_interval is not None:
            for boundary in reachable_boundaries:
                end = boundary // alignment_tokens * alignment_tokens // bs
                for j in range(max(start_block, end - need), min(end_block, end)):
                    mask[j - start_block] = True
        return mask

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        return max(0, num_computed_tokens - self.sliding_window + 1)


class MambaManager(SingleTypeKVCacheManager):
    """Recurrent-state groups.

    ``align`` mode: a request holds about two real blocks, the state it resumed
    from / last wrote and the one it is writing; the rest of its table is
    nulls. The previous state block is freed once processing has moved past
    it. States are cached at block boundaries (chunk ends), thinned by
    retention. With prefill checkpoints, one extra block is reserved to export
    the boundary state from inside the final chunk.

    ``corrected_mamba_accounting`` (default False = vLLM 0.33): vLLM's estimate
    ignores the state block :meth:`allocate_external_computed_blocks` takes for
    connector-supplied tokens, so it counts 1 block where 2 are taken and an
    exactly full pool raises ``Cannot get 1 free blocks from the pool`` (open
    vLLM PR #46892). True counts that block (a what-if, not vLLM).
    """

    def __init__(
        self,
        spec: MambaSpec,
        block_pool: BlockPool,
        kv_cache_group_id: int,
        *,
        enable_caching: bool,
        cache_hit_alignment_tokens: int,
        corrected_mamba_accounting: bool = False,
    ) -> None:
        super().__init__(
            spec,
            block_pool,
            kv_cache_group_id,
            enable_caching=enable_caching,
            cache_hit_alignment_tokens=cache_hit_alignment_tokens,
        )
        self.mamba_cache_mode = spec.mamba_cache_mode
        assert self.mamba_cache_mode == "align" or not self.enable_caching, "Mamba prefix caching requires align mode"
        self.has_prefill_checkpoint_blocks = self.mamba_cache_mode == "align" and spec.prefill_checkpoints
        self.corrected_mamba_accounting = corrected_mamba_accounting
        self.cached_blocks_this_step: set[CacheKey] = set()
        self.last_state_block_idx: dict[str, int] = {}
        self.num_retired_blocks: dict[str, int] = {}
        #: request -> (checkpoint position, reserved block index) of the current allocation.
        self.checkpoints: dict[str, tuple[int, int]] = {}

    @classmethod
    def find_longest_cache_hit(
        cls,
        block_hashes: Sequence[BlockHash],
        max_length: int,
        kv_cache_group_ids: Sequence[int],
        block_pool: BlockPool,
        kv_cache_spec: KVCacheSpec,
        alignment_tokens: int,
    ) -> tuple[BlockLists, int]:
        """Right to left: the first cached, aligned state ``i`` gives ``[null]*i + [state]``."""
        bs = kv_cache_spec.block_size
        block_hashes = block_hashes_at(block_hashes, block_pool.hash_block_size, bs)
        computed: BlockLists = tuple([] for _ in kv_cache_group_ids)
        for i in range(min(max_length // bs, len(block_hashes)) - 1, -1, -1):
            cached = block_pool.get_cached_block(block_hashes[i], kv_cache_group_ids)
            if cached is None:
                continue
            if bs != alignment_tokens and ((i + 1) * bs) % alignment_tokens:
                continue
            null = block_pool.null_block
            for lst, blk in zip(computed, cached):
                lst.extend([null] * i)
                lst.append(blk)
            return computed, (i + 1) * bs
        return computed, 0

    @classmethod
    def reachable_block_mask(
        cls,
        start_block: int,
        end_block: int,
        alignment_tokens: int | None,
        kv_cache_spec: KVCacheSpec,
        retention_interval: int | None = None,
        reachable_boundaries: Sequence[int] = (),
    ) -> list[bool] | None:
        """``None`` retention: every state; ``0``: only the states ending on a
        reachable boundary; ``N``: also one per ``N``-token segment."""
        if retention_interval is None or alignment_tokens is None:
            return None
        bs = kv_cache_spec.block_size
        mask = [False] * (end_block - start_block)
        if retention_interval:
            per = retention_interval // bs
            if per <= 1:
                return None
            first = (start_block + per) // per * per - 1
            for i in range(first - start_block, len(mask), per):
                mask[i] = True
        for boundary in reachable_boundaries:
            idx = boundary // alignment_tokens * alignment_tokens // bs - 1
            if start_block <= idx < end_block:
                mask[idx - start_block] = True
        return mask

    def _remove_blocks_in_range(self, request_id: str, first_block: int, last_block: int) -> None:
        """Align mode: free every non-null block in range (states leave null gaps)."""
        if self.mamba_cache_mode != "align":
            super()._remove_blocks_in_range(request_id, first_block, last_block)
            return
        blocks = self.req_to_blocks.get(request_id, [])
        first_block = max(first_block, self.num_retired_blocks.get(request_id, 0))
        last_block = min(last_block, len(blocks))
        if first_block >= last_block:
            return
        null = self._null_block
        freed: list[KVCacheBlock] = []
        for i in range(last_block - 1, first_block - 1, -1):
            if blocks[i].is_null:
                continue
            freed.append(blocks[i])
            blocks[i] = null
        if freed:
            self.block_pool.free_blocks(freed)
        self.num_retired_blocks[request_id] = last_block

    def remove_skipped_blocks(self, request_id: str, processed_computed_tokens: int) -> None:
        """The base rule (align mode: retire the slots before ``(processed - 1) // B`` not yet
        retired), then, in align mode, the previous state block once processing has passed it."""
        super().remove_skipped_blocks(request_id, processed_computed_tokens)
        if self.mamba_cache_mode != "align":
            return
        idx = self.last_state_block_idx.get(request_id)
        if idx is not None and idx < cdiv(processed_computed_tokens, self.block_size) - 1:
            blocks = self.req_to_blocks[request_id]
            if not blocks[idx].is_null:
                self.block_pool.free_blocks((blocks[idx],))
                blocks[idx] = self._null_block

    def _needs_internal_checkpoint(
        self, request_id: str, query_start: int, query_end: int, checkpoint_position: int, prefill_end: int
    ) -> bool:
        """The chunk ``[query_start, query_end)`` can export ``checkpoint_position``
        into the reserved block ``cdiv(query_end, B) - 2`` (vLLM
        ``is_mamba_prefill_checkpoint_valid``, checkpoint alignment 1)."""
        if not self.has_prefill_checkpoint_blocks or query_end < prefill_end:
            return False
        if not prefill_checkpoint_valid(
            query_start, query_end, checkpoint_position, self.block_pool.hash_block_size, self.block_size
        ):
            return False
        checkpoint_idx = cdiv(query_end, self.block_size) - 2
        if checkpoint_idx < 0:
            return False
        blocks = self.req_to_blocks.get(request_id, ())
        return checkpoint_idx >= len(blocks) or blocks[checkpoint_idx].is_null

    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: Sequence[KVCacheBlock],
        total_computed_tokens: int,
        num_local_computed_tokens: int,
        num_tokens_main_model: int,
        apply_admission_cap: bool = False,
        prefill_end: int = 0,
    ) -> int:
        """Same-step guard: a hit on a state cached during this step cannot be
        used yet, so report ``num_gpu_blocks + 1`` (the request waits a step).
        In align mode count at most one new block (+1 checkpoint) per step."""
        if new_computed_blocks and new_computed_blocks[-1].block_hash in self.cached_blocks_this_step:
            return self.block_pool.num_gpu_blocks + 1
        if self.mamba_cache_mode != "align":
            return super().get_num_blocks_to_allocate(
                request_id,
                num_tokens,
                new_computed_blocks,
                total_computed_tokens,
                num_local_computed_tokens,
                num_tokens_main_model,
                apply_admission_cap,
                prefill_end,
            )
        num_tokens = num_tokens_main_model
        num_required = cdiv(num_tokens, self.block_size)
        table = self.req_to_blocks.get(request_id)
        table_len = len(table) if table is not None else 0
        extra = 0
        if self.corrected_mamba_accounting and table_len == 0 and total_computed_tokens > num_local_computed_tokens:
            skipped_blocks = self.get_num_skipped_tokens(total_computed_tokens) // self.block_size
            after_local = (
                max(skipped_blocks, len(new_computed_blocks)) if skipped_blocks > 0 else len(new_computed_blocks)
            )
            extra = self.num_external_blocks(
                after_local, num_local_computed_tokens, total_computed_tokens - num_local_computed_tokens
            )
            num_new = num_required - after_local - extra
        else:
            num_new = num_required - len(new_computed_blocks) - table_len
        checkpoint_position = prefill_checkpoint_position(num_tokens, self.cache_hit_alignment_tokens)
        if not self._needs_internal_checkpoint(
            request_id, total_computed_tokens, num_tokens, checkpoint_position, prefill_end
        ):
            checkpoint_position = 0
        if not apply_admission_cap:
            if checkpoint_position > 0:
                self.checkpoints[request_id] = (checkpoint_position, num_required - 2)
            else:
                self.checkpoints.pop(request_id, None)
        if num_new > 0:
            num_new = min(num_new, 2 if checkpoint_position > 0 else 1)
        return num_new + extra + num_evictable(new_computed_blocks)

    def allocate_new_blocks(self, request_id: str, num_tokens: int, num_tokens_main_model: int) -> list[KVCacheBlock]:
        if self.mamba_cache_mode != "align":
            return super().allocate_new_blocks(request_id, num_tokens, num_tokens_main_model)
        req_blocks = self.req_to_blocks.setdefault(request_id, [])
        num_required = cdiv(num_tokens_main_model, self.block_size)
        checkpoint_block = int(request_id in self.checkpoints)
        if num_required <= len(req_blocks) and not checkpoint_block:
            return []
        prev_len = len(req_blocks)
        if prev_len > 0:
            # The block written last step (or the hit state) is the state the
            # next step copies from; it is freed once processing passes it.
            self.last_state_block_idx[request_id] = prev_len - 1
        num_skipped_blocks = num_required - 1
        if prev_len < num_skipped_blocks:
            null_end = num_skipped_blocks - checkpoint_block
            if null_end > prev_len:
                req_blocks.extend([self._null_block] * (null_end - prev_len))
        num_new = max(num_required - len(req_blocks), 0)
        assert num_new <= 1 + checkpoint_block, "num_new_blocks <= max_new_blocks"
        new_blocks = self.block_pool.get_new_blocks(num_new, request_id)
        returned = req_blocks[prev_len:]
        req_blocks.extend(new_blocks)
        returned.extend(new_blocks)
        return returned

    def pop_blocks_for_free(self, request_id: str) -> list[KVCacheBlock]:
        self.last_state_block_idx.pop(request_id, None)
        self.num_retired_blocks.pop(request_id, None)
        self.checkpoints.pop(request_id, None)
        return super().pop_blocks_for_free(request_id)

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        return num_computed_tokens - 1

    def cache_blocks(
        self,
        request: Request,
        num_tokens: int,
        retention_interval: int | None,
        replay_boundaries: Sequence[int],
    ) -> int:
        """Cache boundary states; re-key (or drop) this chunk's checkpoint block;
        remember every state cached now for the same-step guard."""
        rid = request.request_id
        before = self.num_cached_block.get(rid, 0)
        after = super().cache_blocks(request, num_tokens, retention_interval, replay_boundaries)
        if self.mamba_cache_mode == "align":
            if rid in self.checkpoints:
                key = self._cache_checkpoint_block(request, retention_interval)
            else:
                key = self._cache_prompt_boundary_block(request, num_tokens)
            if key is not None:
                self.cached_blocks_this_step.add(key)
        if after > before:
            blocks = self.req_to_blocks[rid]
            this_step = self.cached_blocks_this_step
            for idx in range(before, after):
                key = blocks[idx].block_hash
                if key is not None:
                    this_step.add(key)
        return after

    def new_step_starts(self) -> None:
        self.cached_blocks_this_step.clear()

    def _cache_checkpoint_block(self, request: Request, retention_interval: int | None) -> CacheKey | None:
        """vLLM ``MambaManager._cache_partial_tail_block``, checkpoint branch.

        The non-checkpoint branch is :meth:`_cache_prompt_boundary_block`.
        """
        checkpoint = self.checkpoints.get(request.request_id)
        if checkpoint is None:
            return None
        position, idx = checkpoint
        blocks = self.req_to_blocks[request.request_id]
        block = blocks[idx]
        is_prompt_checkpoint = position == prefill_checkpoint_position(
            request.num_prompt_tokens, self.cache_hit_alignment_tokens
        )
        retained = False
        if position % self.block_size == 0:
            bidx = position // self.block_size - 1
            mask = self.reachable_block_mask(
                bidx, bidx + 1, self.cache_hit_alignment_tokens, self.kv_cache_spec, retention_interval
            )
            retained = mask is None or mask[0]
        if not is_prompt_checkpoint and not retained and position != request.shared_prefix_boundary:
            # A transient state overwrites this slot: neither it nor a key set earlier is reusable.
            self.block_pool._maybe_evict_cached_block(block, request.request_id, "checkpoint")
            return None
        if block.block_hash_num_tokens == position:
            return None
        # The checkpoint sits on a scheduler-block boundary, hence on a hash-block one.
        fine_index = position // self.block_pool.hash_block_size - 1
        return self.block_pool.cache_partial_block(
            request.request_id, block, request.block_hashes[fine_index], position, self.kv_cache_group_id
        )

    def _cache_prompt_boundary_block(self, request: Request, num_tokens: int) -> CacheKey | None:
        """vLLM ``MambaManager._cache_partial_tail_block``, non-checkpoint branch (no fine-grained hits).

        When the cached prefix reaches the prompt's last hash boundary, the block
        holding that state is keyed there unless it already is. The full-block
        caching above normally did it in the same call (a no-op then); it matters
        when the entry was dropped while the request still owns the block (a
        forced eviction): vLLM keys the block again at the request's next
        ``allocate_slots`` whose cacheable prefix is that boundary, and so do we.
        """
        hbs = self.block_pool.hash_block_size
        if num_tokens <= 0 or num_tokens % hbs:
            return None
        if num_tokens != prefill_checkpoint_position(request.num_prompt_tokens, hbs):
            return None
        blocks = self.req_to_blocks[request.request_id]
        idx = cdiv(num_tokens, self.block_size) - 1
        if idx >= len(blocks):
            return None
        block = blocks[idx]
        if block.is_null or block.block_hash_num_tokens == num_tokens:
            return None
        if block.block_hash is not None and (block.block_hash_num_tokens or 0) > num_tokens:
            return None  # vLLM would add a second key to the block; not reached without fine-grained hits
        return self.block_pool.cache_partial_block(
            request.request_id, block, request.block_hashes[num_tokens // hbs - 1], num_tokens, self.kv_cache_group_id
        )


def manager_class_for(spec: KVCacheSpec) -> type[SingleTypeKVCacheManager]:
    if isinstance(spec, FullAttentionSpec):
        return FullAttentionManager
    if isinstance(spec, SlidingWindowSpec):
        return SlidingWindowManager
    if isinstance(spec, MambaSpec):
        return MambaManager
    raise TypeError(f"no manager for spec {spec!r}")
