"""Replica groups: identical Mamba groups whose per-request decisions are made once (a speed mechanism, not vLLM).

vLLM splits a hybrid model's Mamba layers into several KV-cache groups of one
spec (Nemotron-H 8B: six identical align-mode Mamba groups next to one
full-attention group). The core's coordinator runs every group's skip, count,
allocate, cache and free steps in turn, and for identical groups each of them
decides the same thing on its own table: which slots to retire and free, how
many blocks to take, which slots to key under which hashes and with which
retention mask, where the pending prefill checkpoint is.

:class:`ReplicaCoordinator` (a :class:`HybridKVCacheCoordinator`) keeps the
first group of each such class (the *leader*) a plain
:class:`~sim.core.kv.single_type_kv_cache_manager.MambaManager`; the others are
:class:`MambaFollower` s. At each step of the group loop the leader runs the
core's code; before it (or after it, for the count) the coordinator reads the
decision off the leader's state, and each follower applies that decision to its
own table at its own place in the group order: it takes, frees and keys its own
blocks through the shared pool's public calls, so the pool sees the core's
sequence of operations and emits the core's events. What depends on a block's
own state stays per follower (the same-step guard on its own hit, its own hit
blocks still in the free queue, whether its tail state already holds the key).

The decisions read off the leader are the core's rules, written against
``sim/core/kv/single_type_kv_cache_manager.py`` (``MambaManager``'s align-mode
``remove_skipped_blocks``, ``get_num_blocks_to_allocate``, ``cache_blocks`` with
``_cache_checkpoint_block`` / ``_cache_prompt_boundary_block``, and
``pop_blocks_for_free``): change one, change the other. The contract is the
plain-vs-accel differential test and ``tests/accel/test_replicas.py`` (every
group's table, counters and the pool's events after every operation).

Chosen by :class:`~sim.accel.quiet.QuietKVCacheManager` once, at construction,
for layouts with two or more identical align-mode Mamba groups and the LRU pool.
"""

from __future__ import annotations

from typing import Sequence

from sim.accel.counters import CountingMambaManager
from sim.core.kv.block_pool import KVCacheBlock
from sim.core.kv.hash_view import block_hashes_at
from sim.core.kv.kv_cache_coordinator import HybridKVCacheCoordinator, KVCacheOptions
from sim.core.kv.single_type_kv_cache_manager import (
    BlockLists,
    MambaManager,
    SingleTypeKVCacheManager,
    num_evictable,
)
from sim.core.kv.specs import KVCacheConfig, MambaSpec, prefill_checkpoint_position
from sim.core.request import Request

#: A group's role in the coordinator's loop.
_PLAIN, _LEADER, _FOLLOWER = 0, 1, 2


class MambaFollower(CountingMambaManager):
    """An align-mode Mamba group identical to an earlier one (its *leader*): it applies the leader's decisions.

    Invariant (kept by :class:`ReplicaCoordinator`, which alone calls the ``follow_*`` methods): for every
    request, this group's table has the leader's length and null slots, and ``num_cached_block``,
    ``last_state_block_idx``, ``num_retired_blocks`` and ``checkpoints`` hold the leader's values; each
    field is exactly what the core's :class:`MambaManager` would hold in this group's place. The fields are
    this class's own (inherited from :class:`MambaManager`); the follower writes only its own. Its blocks
    are its own (taken from, freed to and keyed in the shared pool in its place in the group order), and
    so are its held-block counter (:class:`~sim.accel.counters.HeldBlockCounter`, moved by the free queue's
    change across each ``follow_*`` call that takes or frees blocks) and same-step set. Its plain methods stay exact: the coordinator calls them
    whenever a decision cannot be shared.
    """

    def follow_count(
        self,
        request_id: str,
        hits: Sequence[KVCacheBlock],
        shape: int,
        checkpoint: tuple[int, int] | None,
        apply_admission_cap: bool,
    ) -> int:
        """``get_num_blocks_to_allocate`` given the leader's count without its hit blocks still in the free
        queue (``shape``) and the leader's pending checkpoint after its call."""
        if hits:
            if hits[-1].block_hash in self.cached_blocks_this_step:
                return self.block_pool.num_gpu_blocks + 1  # the same-step guard, on this group's own hit
            shape += num_evictable(hits)
        if not apply_admission_cap:
            if checkpoint is not None:
                self.checkpoints[request_id] = checkpoint
            elif self.checkpoints:
                self.checkpoints.pop(request_id, None)
        return shape

    def follow_remove_skipped(
        self, request_id: str, freed: Sequence[int], retire_to: int, state_idx: int | None
    ) -> None:
        """``remove_skipped_blocks``: free the slots ``freed`` (in that order, one pool call), retire up to
        ``retire_to`` (if >= 0), then free the previous state slot ``state_idx`` (its own call)."""
        blocks = self.req_to_blocks[request_id]
        null = self._null_block
        queue = self.block_pool.free_block_queue
        free = queue.num_free_blocks
        if freed:
            released = [blocks[i] for i in freed]
            for i in freed:
                blocks[i] = null
            self.block_pool.free_blocks(released)
        if retire_to >= 0:
            self.num_retired_blocks[request_id] = retire_to
        if state_idx is not None:
            self.block_pool.free_blocks((blocks[state_idx],))
            blocks[state_idx] = null
        self.held_blocks += free - queue.num_free_blocks

    def follow_allocate(self, request_id: str, prev_len: int, num_nulls: int, num_new: int) -> list[KVCacheBlock]:
        """``allocate_new_blocks`` after the leader's: its table grew from ``prev_len`` by ``num_nulls`` null
        slots and ``num_new`` fresh blocks (``num_nulls == num_new == -1``: it returned nothing)."""
        table = self.req_to_blocks.setdefault(request_id, [])
        if num_new < 0:
            return []
        if prev_len > 0:
            self.last_state_block_idx[request_id] = prev_len - 1
        if num_nulls:
            table.extend([self._null_block] * num_nulls)
        new_blocks = self.block_pool.get_new_blocks(num_new, request_id)
        self.held_blocks += num_new
        returned = table[prev_len:]
        table.extend(new_blocks)
        returned.extend(new_blocks)
        return returned

    def follow_cache(self, request: Request, num_tokens: int, plan: _CachePlan) -> None:
        """``cache_blocks`` with the leader's plan: the newly full slots under the leader's mask, then the
        tail state (a pending checkpoint dropped or re-keyed, or the prompt boundary's state re-keyed),
        each on this group's own blocks; every key stored now joins the same-step set."""
        rid = request.request_id
        blocks = self.req_to_blocks[rid]
        pool = self.block_pool
        gid = self.kv_cache_group_id
        before, after = plan.before, plan.after
        if plan.base:
            pool.cache_full_blocks(rid, blocks, plan.hashes, before, after, self.block_size, gid, plan.mask)
            self.num_cached_block[rid] = after
        this_step = self.cached_blocks_this_step
        idx = plan.tail_idx
        if idx >= 0:
            key = None
            block = blocks[idx]
            position = plan.tail_pos
            if plan.checkpoint:
                if plan.transient:
                    # As MambaManager._cache_checkpoint_block: the transient state's slot keeps no key.
                    pool._maybe_evict_cached_block(block, rid, "checkpoint")
                elif block.block_hash_num_tokens != position:
                    key = pool.cache_partial_block(
                        rid, block, request.block_hashes[position // pool.hash_block_size - 1], position, gid
                    )
            else:
                key = self._cache_prompt_boundary_block(request, num_tokens)
            if key is not None:
                this_step.add(key)
        for i in range(before, after):
            key = blocks[i].block_hash
            if key is not None:
                this_step.add(key)

    def follow_free(self, request_id: str, head: int) -> None:
        """``free`` given the number of leading null slots of the leader's table (the same here)."""
        self.last_state_block_idx.pop(request_id, None)
        self.num_retired_blocks.pop(request_id, None)
        self.checkpoints.pop(request_id, None)
        self.num_cached_block.pop(request_id, None)
        blocks = self.req_to_blocks.pop(request_id, None)
        if blocks:
            tail = blocks[head:]
            if tail:
                tail.reverse()
                queue = self.block_pool.free_block_queue
                free = queue.num_free_blocks
                self.block_pool.free_blocks(tail)
                self.held_blocks += free - queue.num_free_blocks


class _CachePlan:
    """One ``cache_blocks`` decision of a leader (see :meth:`MambaFollower.follow_cache`)."""

    __slots__ = ("before", "after", "base", "hashes", "mask", "tail_idx", "tail_pos", "checkpoint", "transient")

    def __init__(self) -> None:
        self.before = self.after = 0
        self.base = False
        self.hashes: Sequence[int] = ()
        self.mask: list[bool] | None = None
        #: The tail state's slot (-1: none) and position; ``checkpoint``: a pending checkpoint (else the
        #: prompt boundary's state); ``transient``: the checkpoint's state is dropped, not keyed.
        self.tail_idx = -1
        self.tail_pos = 0
        self.checkpoint = False
        self.transient = False


def replica_classes(managers: Sequence[SingleTypeKVCacheManager]) -> list[list[int]]:
    """Group ids of each class of two or more identical align-mode Mamba groups with caching on, in group order."""
    classes: dict[tuple[object, ...], list[int]] = {}
    for gid, manager in enumerate(managers):
        if (
            isinstance(manager, MambaManager)
            and type(manager) in (MambaManager, CountingMambaManager)
            and manager.enable_caching
            and manager.mamba_cache_mode == "align"
        ):
            key = (manager.kv_cache_spec, manager.corrected_mamba_accounting, manager.cache_hit_alignment_tokens)
            classes.setdefault(key, []).append(gid)
    return [gids for gids in classes.values() if len(gids) >= 2]


class ReplicaCoordinator(HybridKVCacheCoordinator):
    """The hybrid coordinator with replica groups (module docstring): lookups are the core's; the group loops
    of count, skip, allocate, cache and free let each class's leader decide once for its followers.

    A prefix hit handed in with lists of different lengths for one class (no built-in policy makes one)
    would give its groups different table shapes: from then on every group runs the core's code
    (``replicas_on`` False), which is exact since every follower's state is the core's.
    """

    @staticmethod
    def applies(kv_cache_config: KVCacheConfig, options: KVCacheOptions) -> bool:
        """Two or more identical align-mode Mamba groups, prefix caching on, the LRU pool (vLLM's)."""
        if not kv_cache_config.enable_prefix_caching or options.eviction_policy is not None:
            return False
        groups = kv_cache_config.groups
        if len(groups) < 2:
            return False
        specs = [g.spec for g in groups if isinstance(g.spec, MambaSpec) and g.spec.mamba_cache_mode == "align"]
        return any(specs.count(s) >= 2 for s in specs)

    def __init__(self, kv_cache_config: KVCacheConfig, options: KVCacheOptions) -> None:
        super().__init__(kv_cache_config, options)
        managers = list(self.single_type_managers)
        classes = replica_classes(managers)
        if not classes:
            raise ValueError("ReplicaCoordinator needs two or more identical align-mode Mamba groups")
        role = [_PLAIN] * len(managers)
        leader_of = [-1] * len(managers)
        for gids in classes:
            lead = gids[0]
            role[lead] = _LEADER
            leader_of[lead] = lead
            for gid in gids[1:]:
                old = managers[gid]
                assert isinstance(old, MambaManager)
                spec = old.kv_cache_spec
                assert isinstance(spec, MambaSpec)
                managers[gid] = MambaFollower(
                    spec,
                    self.block_pool,
                    gid,
                    enable_caching=old.enable_caching,
                    cache_hit_alignment_tokens=old.cache_hit_alignment_tokens,
                    corrected_mamba_accounting=old.corrected_mamba_accounting,
                )
                role[gid] = _FOLLOWER
                leader_of[gid] = lead
        self.single_type_managers = tuple(managers)
        #: Per group in group order: (manager, role, its class's leader id or -1).
        self._roles: tuple[tuple[SingleTypeKVCacheManager, int, int], ...] = tuple(
            zip(managers, role, leader_of, strict=True)
        )
        #: The groups that are not followers (what the quiet horizons read).
        self.deciding_managers: tuple[SingleTypeKVCacheManager, ...] = tuple(
            m for m, r, _ in self._roles if r != _FOLLOWER
        )
        self._leaders: dict[int, MambaManager] = {}
        for m, r, _ in self._roles:
            if r == _LEADER:
                assert isinstance(m, MambaManager)
                self._leaders[m.kv_cache_group_id] = m
        self.replicas_on = True

    # ------------------------------------------------------------- accounting
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
        if not self.replicas_on:
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
        if self.retention_interval != 0:
            prefill_end = 0
        total = 0
        #: leader id -> (shape count, pending checkpoint, hit length), or None: its followers count plainly.
        decided: dict[int, tuple[int, tuple[int, int] | None, int] | None] = {}
        for gid, (manager, role, lead) in enumerate(self._roles):
            hits = new_computed_blocks[gid]
            if role == _FOLLOWER and self.replicas_on:
                shared = decided[lead]
                if shared is not None and len(hits) != shared[2]:
                    self.replicas_on = False  # different table shapes from here on: every group runs plain
                elif shared is not None:
                    assert isinstance(manager, MambaFollower)
                    total += manager.follow_count(request_id, hits, shared[0], shared[1], apply_admission_cap)
                    continue
            count = manager.get_num_blocks_to_allocate(
                request_id,
                num_tokens,
                hits,
                total_computed_tokens,
                num_local_computed_tokens,
                num_tokens_main_model,
                apply_admission_cap,
                prefill_end,
            )
            total += count
            if role == _LEADER:
                assert isinstance(manager, MambaManager)
                if hits and hits[-1].block_hash in manager.cached_blocks_this_step:
                    decided[gid] = None  # the leader's same-step guard: no shape to share
                else:
                    shape = count - num_evictable(hits) if hits else count
                    decided[gid] = (shape, manager.checkpoints.get(request_id), len(hits))
        return total

    # ------------------------------------------------------------- allocation
    def allocate_new_blocks(self, request_id: str, num_tokens: int, num_tokens_main_model: int) -> BlockLists:
        if not self.replicas_on:
            return super().allocate_new_blocks(request_id, num_tokens, num_tokens_main_model)
        out: list[list[KVCacheBlock]] = []
        #: leader id -> (previous table length, null slots added, fresh blocks taken; -1, -1: nothing).
        decided: dict[int, tuple[int, int, int]] = {}
        for manager, role, lead in self._roles:
            if role == _FOLLOWER:
                assert isinstance(manager, MambaFollower)
                prev_len, num_nulls, num_new = decided[lead]
                out.append(manager.follow_allocate(request_id, prev_len, num_nulls, num_new))
                continue
            if role != _LEADER:
                out.append(manager.allocate_new_blocks(request_id, num_tokens, num_tokens_main_model))
                continue
            assert isinstance(manager, MambaManager)
            table = manager.req_to_blocks.get(request_id)
            prev_len = len(table) if table is not None else 0
            # MambaManager.allocate_new_blocks (align mode) returns at once, changing nothing, exactly here.
            unchanged = -(-num_tokens_main_model // manager.block_size) <= prev_len and (
                request_id not in manager.checkpoints
            )
            got = manager.allocate_new_blocks(request_id, num_tokens, num_tokens_main_model)
            if unchanged:
                decided[manager.kv_cache_group_id] = (prev_len, -1, -1)
            else:
                num_new = 0
                while num_new < len(got) and not got[-1 - num_new].is_null:
                    num_new += 1
                decided[manager.kv_cache_group_id] = (prev_len, len(got) - num_new, num_new)
            out.append(got)
        return tuple(out)

    def remove_skipped_blocks(self, request_id: str, processed_computed_tokens: int) -> None:
        if not self.replicas_on:
            super().remove_skipped_blocks(request_id, processed_computed_tokens)
            return
        #: leader id -> (slots freed in order, retired up to (-1: unchanged), previous state slot freed), or
        #: None: nothing to do in its class.
        decided: dict[int, tuple[list[int], int, int | None] | None] = {}
        for manager, role, lead in self._roles:
            if role == _FOLLOWER:
                plan = decided[lead]
                if plan is not None:
                    assert isinstance(manager, MambaFollower)
                    manager.follow_remove_skipped(request_id, *plan)
                continue
            if role == _LEADER:
                assert isinstance(manager, MambaManager)
                decided[manager.kv_cache_group_id] = _skip_plan(manager, request_id, processed_computed_tokens)
            manager.remove_skipped_blocks(request_id, processed_computed_tokens)

    # ---------------------------------------------------------------- caching
    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        if not self.replicas_on:
            super().cache_blocks(request, num_computed_tokens)
            return
        boundaries = (request.num_prompt_tokens - 1,)
        retention = self.retention_interval
        cacheable = self.get_num_cacheable_tokens(num_computed_tokens)
        decided: dict[int, _CachePlan | None] = {}
        for manager, role, lead in self._roles:
            if not manager.enable_caching:
                continue
            if role == _FOLLOWER:
                plan = decided[lead]
                assert isinstance(manager, MambaFollower)
                if plan is None:
                    manager.cache_blocks(request, cacheable, retention, boundaries)
                else:
                    manager.follow_cache(request, cacheable, plan)
                continue
            if role == _LEADER:
                assert isinstance(manager, MambaManager)
                decided[manager.kv_cache_group_id] = _cache_plan(manager, request, cacheable, retention, boundaries)
            manager.cache_blocks(request, cacheable, retention, boundaries)

    # ------------------------------------------------------------------- misc
    def free(self, request_id: str) -> None:
        if not self.replicas_on:
            super().free(request_id)
            return
        heads: dict[int, int] = {}
        for manager, role, lead in self._roles:
            if role == _FOLLOWER:
                assert isinstance(manager, MambaFollower)
                manager.follow_free(request_id, heads[lead])
                continue
            if role == _LEADER:
                table = manager.req_to_blocks.get(request_id)
                head = 0
                if table:
                    n = len(table)
                    while head < n and table[head].is_null:
                        head += 1
                heads[manager.kv_cache_group_id] = head
            manager.free(request_id)

    def new_step_starts(self) -> None:
        for manager in self.single_type_managers:
            if not isinstance(manager, MambaManager) or manager.cached_blocks_this_step:
                manager.new_step_starts()


def _skip_plan(leader: MambaManager, request_id: str, processed: int) -> tuple[list[int], int, int | None] | None:
    """What the leader's align-mode ``remove_skipped_blocks`` will do (read before it runs), or None: nothing."""
    bs = leader.block_size
    table = leader.req_to_blocks.get(request_id)
    freed: list[int] = []
    retire_to = -1
    retired = 0
    if table is not None:
        last = (processed - 1) // bs
        if last > len(table):
            last = len(table)
        retired = leader.num_retired_blocks.get(request_id, 0)
        if retired < last:
            freed = [i for i in range(last - 1, retired - 1, -1) if not table[i].is_null]
            retire_to = last
    state: int | None = leader.last_state_block_idx.get(request_id)
    if state is not None:
        if table is None or not state < -(-processed // bs) - 1 or table[state].is_null:
            state = None
        elif retire_to >= 0 and retired <= state < retire_to:
            state = None  # the range already freed it
    if not freed and retire_to < 0 and state is None:
        return None
    return freed, retire_to, state


def _cache_plan(
    leader: MambaManager,
    request: Request,
    num_tokens: int,
    retention_interval: int | None,
    replay_boundaries: Sequence[int],
) -> _CachePlan | None:
    """What the leader's ``cache_blocks`` will decide (read before it runs), or None: the followers cache plainly
    (the request holds no table)."""
    rid = request.request_id
    table = leader.req_to_blocks.get(rid)
    if table is None:
        return None
    pool = leader.block_pool
    hbs = pool.hash_block_size
    bs = leader.block_size
    plan = _CachePlan()
    before = leader.num_cached_block.get(rid, 0)
    fine = request.block_hashes
    num_full = min(num_tokens, len(fine) * hbs) // bs
    plan.before = before
    if before < num_full:
        plan.base = True
        plan.after = num_full
        plan.hashes = block_hashes_at(fine, hbs, bs)
        boundaries = list(replay_boundaries)
        if request.shared_prefix_boundary:
            boundaries.append(request.shared_prefix_boundary)
        boundaries.extend(request.extra_state_positions)
        plan.mask = leader.reachable_block_mask(
            before, num_full, leader.cache_hit_alignment_tokens, leader.kv_cache_spec, retention_interval, boundaries
        )
    else:
        plan.after = before
    checkpoint = leader.checkpoints.get(rid)
    if checkpoint is not None:
        position, idx = checkpoint
        plan.checkpoint = True
        plan.tail_idx, plan.tail_pos = idx, position
        retained = False
        if position % bs == 0:
            bidx = position // bs - 1
            mask = leader.reachable_block_mask(
                bidx, bidx + 1, leader.cache_hit_alignment_tokens, leader.kv_cache_spec, retention_interval
            )
            retained = mask is None or mask[0]
        plan.transient = (
            position != prefill_checkpoint_position(request.num_prompt_tokens, leader.cache_hit_alignment_tokens)
            and not retained
            and position != request.shared_prefix_boundary
        )
    elif (
        num_tokens > 0
        and not num_tokens % hbs
        and num_tokens == prefill_checkpoint_position(request.num_prompt_tokens, hbs)
        and -(-num_tokens // bs) - 1 < len(table)
    ):
        plan.tail_idx, plan.tail_pos = -(-num_tokens // bs) - 1, num_tokens
    return plan
