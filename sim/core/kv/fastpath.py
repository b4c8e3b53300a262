"""The simulator's fast paths, in one place (none of them is a vLLM feature).

Each one skips work whose answer is already known exactly; with the switch off
(``fast_paths: false``: ``RunOptions(fast_paths=False)``, ``HYBRIDSIM_PLAIN=1``,
``hybridsim run --plain``) every call takes vLLM's plain path. Both paths give
byte-identical tables (``tests/test_fastpath_differential.py``).

* :class:`QuietHorizons` (around ``allocate_slots``). Most calls of the
  scheduler's running loop give a running request a few more tokens inside
  blocks it already holds; then vLLM's per-group steps (skip, count, allocate,
  cache) change nothing and return no block. After each full call the KV
  manager notes, per request, a *quiet horizon*: bounds on ``computed + new``
  and on the processed tokens under which the next plain call (no hit, no
  external or lookahead tokens) provably changes nothing in any group. Each
  single-type manager answers its own bound (``quiet_horizon()``); this class
  only takes the minimum over the groups. Supported layouts: full attention and
  align-mode Mamba with one common block size; any other layout is plain.
* :class:`LookupMemo` (around a group type's ``find_longest_cache_hit``). An
  admission looks the same prefix up several times (the per-group hits of the
  admissions table, then the policy's lookup, which repeats the full-attention
  scan); while the pool's cache map is unchanged the answer is the same. The
  per-group hits ask for the hit alone (``find_hit_length``), so their block
  lists are kept without a copy.

* :class:`MambaReplicas` (around the coordinator's per-group loops). vLLM
  splits a hybrid model's Mamba layers into several groups with one spec (for
  Nemotron-H 8B, six identical Mamba groups next to one attention group). Their
  block tables always have the same *shape* (length, null slots, cached-slot
  count, retired slots, state index, pending checkpoint): every input that
  shapes them is per request, and their hit lists come from one joint lookup.
  So the shape decisions of skip, count, allocate and cache are made once, and
  each group then takes, frees and keys its own blocks from the shared pool in
  group order, as vLLM's loops do (the pool operations, their events and each
  block's own state -- ref counts, keys -- stay per group).

The scheduler's reuse of a head-of-line request's last lookup across steps
(``Scheduler.reuse_prefix_lookups``) is switched with these.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from sim.core.kv.hash_view import block_hashes_at
from sim.core.kv.managers import MambaManager, SingleTypeKVCacheManager, num_evictable
from sim.core.kv.specs import prefill_checkpoint_position
from sim.core.request import Request, RequestStatus

if TYPE_CHECKING:
    from sim.core.kv.pool import BlockPool, CacheKey, KVCacheBlock


class QuietHorizon:
    """One request's horizon: valid while its first group's table is ``table``."""

    __slots__ = ("table", "max_main_tokens", "max_processed_tokens")

    def __init__(self, table: list[KVCacheBlock], max_main_tokens: int, max_processed_tokens: int) -> None:
        self.table = table
        self.max_main_tokens = max_main_tokens
        self.max_processed_tokens = max_processed_tokens


class QuietHorizons:
    """The quiet horizons of every request, for one KV manager.

    Invariant: a stored horizon is exact for the tables as they were after the
    last full ``allocate_slots`` of its request. The KV manager drops it before
    anything that could move a bound or replace a table (free, skip, cache, a
    full allocation), so a caller that changes tables only through the manager
    (the scheduler) may skip the call for a RUNNING request inside its horizon.
    ``max_tokens`` caps ``num_new_tokens``: a longer chunk may export a Mamba
    prefill checkpoint.
    """

    def __init__(
        self,
        groups: Sequence[SingleTypeKVCacheManager],
        *,
        max_model_len: int,
        watermark_blocks: int,
        max_tokens: int,
        enabled: bool = True,
        replicas: MambaReplicas | None = None,
    ) -> None:
        self._groups = tuple(groups)
        #: While ``replicas`` is on, a follower's horizon is its leader's (same shape), so it is not asked.
        self._replicas = replicas
        self._lead_groups = (
            self._groups
            if replicas is None
            else tuple(g for g in self._groups if not any(g is f for f in replicas.followers))
        )
        self.enabled = (
            enabled
            and bool(groups)
            and len({g.block_size for g in groups}) == 1
            and all(g.has_quiet_horizon for g in groups)
        )
        self.max_model_len = max_model_len
        self.max_tokens = max_tokens if self.enabled else 0
        self._watermark = watermark_blocks > 0
        self._first_tables: dict[str, list[KVCacheBlock]] = groups[0].req_to_blocks if groups else {}
        self._horizons: dict[str, QuietHorizon] = {}

    def get(self, request_id: str) -> QuietHorizon | None:
        return self._horizons.get(request_id)

    def drop(self, request_id: str) -> None:
        self._horizons.pop(request_id, None)

    def note(self, request_id: str) -> None:
        """After a full ``allocate_slots``: store the minimum of every group's bounds (or none)."""
        if not self.enabled:
            return
        first = self._first_tables.get(request_id)
        if first is None:
            return
        replicas = self._replicas
        groups = self._lead_groups if replicas is not None and replicas.enabled else self._groups
        # The first group's bounds start the minimum (a bound may be QUIET_NO_BOUND, beyond a
        # compiled short int: every comparison with it takes the slow path).
        bounds = groups[0].quiet_horizon(request_id)
        if bounds is None:
            return
        max_main, max_processed = bounds
        for i in range(1, len(groups)):
            bounds = groups[i].quiet_horizon(request_id)
            if bounds is None:
                return
            if bounds[0] < max_main:
                max_main = bounds[0]
            if bounds[1] < max_processed:
                max_processed = bounds[1]
        self._horizons[request_id] = QuietHorizon(first, max_main, max_processed)

    def covers(self, request: Request, num_new_tokens: int) -> bool:
        """A plain ``allocate_slots(request, num_new_tokens)`` is a proven no-op now.

        Checks the table is the one the horizon was noted for, and (under a
        watermark) that the request is not a WAITING/PREEMPTED admission.
        """
        horizon = self._horizons.get(request.request_id)
        if horizon is None or not 0 < num_new_tokens <= self.max_tokens:
            return False
        computed = request.num_computed_tokens
        if computed > self.max_model_len:
            computed = self.max_model_len
        return (
            computed + num_new_tokens <= horizon.max_main_tokens
            and computed - request.num_in_flight_tokens <= horizon.max_processed_tokens
            and self._first_tables.get(request.request_id) is horizon.table
            and not (self._watermark and request.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED))
        )

    def take_decodes(
        self, running: list[Request], start: int, limit: int, scheduled: list[Request], num_scheduled: dict[str, int]
    ) -> int:
        """The scheduler's running loop over a run of quiet decodes, in one call.

        From ``running[start]``, at most ``limit`` requests (the token budget),
        each RUNNING request that has exactly one token left to compute, is below
        ``max_model_len - 1`` and whose 1-token call is inside its horizon is
        scheduled for 1 token (appended to ``scheduled`` / ``num_scheduled``), as
        the plain loop would: every clip of the plain loop leaves such a request
        at 1 token and ``allocate_slots`` would return no block. Stops at the
        first request that is not such a decode; returns how many it took.
        ``num_in_flight_tokens`` is 0 at ``schedule()`` (no async scheduling).
        """
        if not self.max_tokens:
            return 0
        horizons = self._horizons
        decode_cap = self.max_model_len - 1
        taken = 0
        for request in running[start : start + limit]:
            computed = request.num_computed_tokens
            if computed + 1 != request.num_prompt_tokens + request.num_output_tokens or computed >= decode_cap:
                break
            horizon = horizons.get(request.request_id)
            if horizon is None or computed >= horizon.max_main_tokens or computed > horizon.max_processed_tokens:
                break
            scheduled.append(request)
            num_scheduled[request.request_id] = 1
            taken += 1
        return taken


class LookupMemo:
    """Remembers each group type's last ``find_longest_cache_hit`` answer, for one pool.

    Key: the request's hash list (by identity, held so its id cannot be reused),
    its length (it only grows), ``max_length``, the group ids, and the pool's
    ``cache_generation`` (bumped on every cache-map change: while it is
    unchanged every lookup reads the same map). Answers are copied both ways,
    as callers trim the returned lists in place.

    For a group type whose answer holds for any shorter cap not below its hit
    (``hit_kept_for_shorter_lookups``: Mamba, which takes the deepest cached
    state under the cap), a cap between the remembered hit and the remembered
    cap reuses the answer too: the hybrid fixed point asks Mamba again under the
    full-attention hit after the per-group lookup asked it under the whole prompt.
    """

    def __init__(self, block_pool: BlockPool, *, enabled: bool = True) -> None:
        self.enabled = enabled
        self._pool = block_pool
        #: The last answer per group type, under its first group id (the group types partition the ids).
        self._last: dict[int, _Remembered] = {}

    def find_longest_cache_hit(
        self,
        cls: type[SingleTypeKVCacheManager],
        block_hashes: Sequence[int],
        max_length: int,
        group_ids: Sequence[int],
        spec: Any,
        alignment_tokens: int,
    ) -> tuple[tuple[list[KVCacheBlock], ...], int]:
        """``cls.find_longest_cache_hit(block_hashes, max_length, group_ids, pool, spec, alignment_tokens)``
        (the caller gets lists of its own: the remembered ones are copied)."""
        if not self.enabled:
            return self._find(cls, block_hashes, max_length, group_ids, spec, alignment_tokens)
        last = self._lookup(cls, block_hashes, max_length, group_ids, spec, alignment_tokens)
        return tuple([*lst] for lst in last.found), last.hit

    def find_hit_length(
        self,
        cls: type[SingleTypeKVCacheManager],
        block_hashes: Sequence[int],
        max_length: int,
        group_ids: Sequence[int],
        spec: Any,
        alignment_tokens: int,
    ) -> int:
        """The hit of :meth:`find_longest_cache_hit` alone (the admissions table's per-group hits):
        the blocks found are not handed out, so nothing is copied."""
        if not self.enabled:
            return self._find(cls, block_hashes, max_length, group_ids, spec, alignment_tokens)[1]
        return self._lookup(cls, block_hashes, max_length, group_ids, spec, alignment_tokens).hit

    def _lookup(
        self,
        cls: type[SingleTypeKVCacheManager],
        block_hashes: Sequence[int],
        max_length: int,
        group_ids: Sequence[int],
        spec: Any,
        alignment_tokens: int,
    ) -> _Remembered:
        """The remembered answer if it is exact for this lookup, else a fresh one, remembered."""
        last = self._remembered(cls, block_hashes, max_length, group_ids)
        if last is None:
            found, hit = self._find(cls, block_hashes, max_length, group_ids, spec, alignment_tokens)
            last = _Remembered(block_hashes, max_length, group_ids, self._pool.cache_generation, found, hit)
            self._last[group_ids[0]] = last
        return last

    def _find(
        self,
        cls: type[SingleTypeKVCacheManager],
        block_hashes: Sequence[int],
        max_length: int,
        group_ids: Sequence[int],
        spec: Any,
        alignment_tokens: int,
    ) -> tuple[tuple[list[KVCacheBlock], ...], int]:
        """The plain lookup (what the memo remembers)."""
        found: tuple[tuple[list[KVCacheBlock], ...], int] = cls.find_longest_cache_hit(
            block_hashes, max_length, group_ids, self._pool, spec, alignment_tokens
        )
        return found

    def _remembered(
        self,
        cls: type[SingleTypeKVCacheManager],
        block_hashes: Sequence[int],
        max_length: int,
        group_ids: Sequence[int],
    ) -> _Remembered | None:
        """The remembered answer if it is exact for this lookup (see the class docstring), else None."""
        last = self._last.get(group_ids[0])
        if (
            last is not None
            and last.block_hashes is block_hashes
            and last.num_hashes == len(block_hashes)
            and last.generation == self._pool.cache_generation
            and last.group_ids == group_ids
            and (
                last.max_length == max_length
                or (cls.hit_kept_for_shorter_lookups and last.hit <= max_length <= last.max_length)
            )
        ):
            return last
        return None


class _Remembered:
    """One remembered lookup: its inputs (the hash list held by identity, with its length then),
    the cache generation it read, and its answer."""

    __slots__ = ("block_hashes", "num_hashes", "max_length", "group_ids", "generation", "found", "hit")

    def __init__(
        self,
        block_hashes: Sequence[int],
        max_length: int,
        group_ids: Sequence[int],
        generation: int,
        found: tuple[list[KVCacheBlock], ...],
        hit: int,
    ) -> None:
        self.block_hashes = block_hashes
        self.num_hashes = len(block_hashes)
        self.max_length = max_length
        self.group_ids = group_ids
        self.generation = generation
        self.found = found
        self.hit = hit


class MambaReplicas:
    """Identical align-mode Mamba groups whose shape decisions are made once (see the module docstring).

    ``managers`` are all of a coordinator's groups, in group order; ``members``
    the ids of two or more align-mode Mamba groups with caching on, one spec and
    one accounting rule. The first member (the *leader*) runs the plain
    per-group code; every other member (a *follower*) applies the leader's
    shape decision to its own table and takes, frees and keys its own blocks;
    the other groups run plain. Every group acts in its place in the group
    order, so the shared pool sees vLLM's sequence of operations and events.

    Invariant: each request's table shape (length and null slots,
    ``num_cached_block``, ``last_state_block_idx``, retired slots, pending
    checkpoint) is the same in every member. Only a prefix hit handed in with
    per-group lists of different lengths could break it; such a call turns the
    replicas off for good (``enabled``), and from then on every group runs plain.
    What stays per group: each block's ref count and cache key, so the same-step
    guard, the hit blocks still in the free queue, and the tail-state re-keying
    are decided on each group's own blocks.
    """

    def __init__(self, managers: Sequence[SingleTypeKVCacheManager], members: Sequence[MambaManager]) -> None:
        if len(members) < 2:
            raise ValueError("MambaReplicas needs two or more groups")
        self.managers = tuple(managers)
        self.members = tuple(members)
        self.leader = members[0]
        self.followers = tuple(members[1:])
        self._member_by_id = {m.kv_cache_group_id: m for m in members}
        self._follower_ids = frozenset(m.kv_cache_group_id for m in self.followers)
        self._follower_by_id = {m.kv_cache_group_id: m for m in self.followers}
        #: The group order with each run of consecutive followers as one step:
        #: ``(group id, manager, ())`` for any other group, ``(first id, first, run)`` for a run.
        self._steps = self._runs(self._follower_by_id)
        #: The same with runs of consecutive members (the leader's run starts with it).
        self._member_steps = self._runs(self._member_by_id)
        #: The groups that are not followers, with their ids, in group order.
        self._plain = tuple((gid, m) for gid, m in enumerate(self.managers) if gid not in self._follower_ids)
        self._pool = self.leader.block_pool
        self.enabled = True

    def _runs(
        self, grouped: dict[int, MambaManager]
    ) -> tuple[tuple[int, SingleTypeKVCacheManager, tuple[MambaManager, ...]], ...]:
        steps: list[tuple[int, SingleTypeKVCacheManager, tuple[MambaManager, ...]]] = []
        gid = 0
        while gid < len(self.managers):
            run: list[MambaManager] = []
            while gid + len(run) in grouped:
                run.append(grouped[gid + len(run)])
            steps.append((gid, self.managers[gid], tuple(run)))
            gid += max(len(run), 1)
        return tuple(steps)

    @classmethod
    def find(cls, managers: Sequence[SingleTypeKVCacheManager], *, enabled: bool) -> MambaReplicas | None:
        """The largest set of replica groups (the earliest on a tie), or None (fewer than two, or off)."""
        if not enabled:
            return None
        sets: dict[tuple[Any, ...], list[MambaManager]] = {}
        for manager in managers:
            if isinstance(manager, MambaManager) and manager.enable_caching and manager.mamba_cache_mode == "align":
                key = (manager.kv_cache_spec, manager.corrected_mamba_accounting, manager.cache_hit_alignment_tokens)
                sets.setdefault(key, []).append(manager)
        best = max(sets.values(), key=len, default=[])
        return cls(managers, best) if len(best) >= 2 else None

    # ------------------------------------------------------------- accounting
    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: tuple[Sequence[KVCacheBlock], ...],
        total_computed_tokens: int,
        num_local_computed_tokens: int,
        num_tokens_main_model: int,
        apply_admission_cap: bool,
        prefill_end: int,
    ) -> int | None:
        """The coordinator's sum over groups, or None: sum plainly (the leader's
        same-step guard fired, or the hit lists differ in length: then off for good).

        A follower's count is the leader's shape count (its count minus its own
        hit blocks still in the free queue) plus its own such hits, or its own
        same-step guard; it takes the leader's pending checkpoint, as its plain
        call would have set it.
        """
        leader = self.leader
        lead_hits = new_computed_blocks[leader.kv_cache_group_id]
        n = len(lead_hits)
        for f in self.followers:
            if len(new_computed_blocks[f.kv_cache_group_id]) != n:
                self.enabled = False
                return None
        if n and lead_hits[-1].block_hash in leader.cached_blocks_this_step:
            return None
        total = 0
        lead_count = 0
        for gid, manager in self._plain:
            count = manager.get_num_blocks_to_allocate(
                request_id,
                num_tokens,
                new_computed_blocks[gid],
                total_computed_tokens,
                num_local_computed_tokens,
                num_tokens_main_model,
                apply_admission_cap,
                prefill_end,
            )
            if manager is leader:
                lead_count = count
            total += count
        shape = lead_count - num_evictable(lead_hits) if n else lead_count
        checkpoint = leader.checkpoints.get(request_id)
        guarded = self._pool.num_gpu_blocks + 1
        for f in self.followers:
            hits = new_computed_blocks[f.kv_cache_group_id]
            if n:
                if hits[-1].block_hash in f.cached_blocks_this_step:
                    total += guarded
                    continue
                total += shape + num_evictable(hits)
            else:
                total += shape
            if not apply_admission_cap:
                if checkpoint is not None:
                    f.checkpoints[request_id] = checkpoint
                elif request_id in f.checkpoints:
                    del f.checkpoints[request_id]
        return total

    # ------------------------------------------------------------- allocation
    def allocate_new_blocks(
        self, request_id: str, num_tokens: int, num_tokens_main_model: int
    ) -> tuple[list[KVCacheBlock], ...]:
        """Every group's new blocks; a follower gets the leader's null slots and
        as many fresh blocks from the pool, at its place in the group order."""
        leader = self.leader
        pool = self._pool
        out: list[list[KVCacheBlock]] = []
        got: list[KVCacheBlock] = []
        num_new = 0
        state_idx: int | None = None
        for _, manager, run in self._steps:
            if not run:
                blocks = manager.allocate_new_blocks(request_id, num_tokens, num_tokens_main_model)
                if manager is leader:
                    got = blocks
                    while num_new < len(got) and not got[-1 - num_new].is_null:
                        num_new += 1
                    state_idx = leader.last_state_block_idx.get(request_id)
                out.append(blocks)
                continue
            nulls = got[: len(got) - num_new]
            # One pop for the whole run: the same blocks, evictions and events as one pop per
            # follower in turn (short of blocks: one per follower, for vLLM's error).
            fresh: list[KVCacheBlock] | None = None
            if num_new and num_new * len(run) <= pool.get_num_free_blocks():
                fresh = pool.get_new_blocks(num_new * len(run), request_id)
            for k, follower in enumerate(run):
                tables = follower.req_to_blocks
                table = tables.get(request_id)
                if table is None:
                    table = tables[request_id] = []
                if state_idx is not None:
                    follower.last_state_block_idx[request_id] = state_idx
                if not got:
                    out.append([])
                    continue
                if num_new == 1 and fresh is not None and not nulls:
                    # The common step: one fresh state block, no null slots.
                    block = fresh[k]
                    table.append(block)
                    out.append([block])
                    follower.num_held_blocks += 1
                    continue
                returned = nulls[:]
                if num_new:
                    if fresh is not None:
                        returned.extend(fresh[k * num_new : (k + 1) * num_new])
                    else:
                        returned.extend(pool.get_new_blocks(num_new, request_id))
                    follower.num_held_blocks += num_new
                table.extend(returned)
                out.append(returned)
        return tuple(out)

    def remove_skipped_blocks(self, request_id: str, processed_computed_tokens: int) -> None:
        """Align mode's skip (:meth:`MambaManager.remove_skipped_blocks`), its slots chosen
        once on the leader's table and freed in every member, in group order."""
        leader = self.leader
        bs = leader.block_size
        table = leader.req_to_blocks.get(request_id)
        freed_idx: list[int] = []
        retire_to = -1
        state: int | None = None
        if table is not None:
            last = (processed_computed_tokens - 1) // bs
            if last > len(table):
                last = len(table)
            retired = leader.num_retired_blocks.get(request_id, 0)
            if retired < last:
                freed_idx = [i for i in range(last - 1, retired - 1, -1) if not table[i].is_null]
                retire_to = last
            state = leader.last_state_block_idx.get(request_id)
            if state is not None and not (
                state < -(-processed_computed_tokens // bs) - 1 and not table[state].is_null and state not in freed_idx
            ):
                state = None
        if not freed_idx and retire_to < 0 and state is None:
            for gid, manager in enumerate(self.managers):
                if gid not in self._member_by_id:
                    manager.remove_skipped_blocks(request_id, processed_computed_tokens)
            return
        pool = self._pool
        null = pool.null_block
        for _, manager, run in self._member_steps:
            if not run:
                manager.remove_skipped_blocks(request_id, processed_computed_tokens)
                continue
            # Each member's skipped slots, then its previous state: one pool call for the run.
            lists: list[list[KVCacheBlock]] = []
            for member in run:
                blocks = member.req_to_blocks[request_id]
                if freed_idx:
                    lists.append([blocks[i] for i in freed_idx])
                    for i in freed_idx:
                        blocks[i] = null
                if retire_to >= 0:
                    member.num_retired_blocks[request_id] = retire_to
                if state is not None:
                    lists.append([blocks[state]])
                    blocks[state] = null
            counts = pool.free_blocks_groups(lists)
            per = len(counts) // len(run)
            for k, member in enumerate(run):
                for j in range(k * per, (k + 1) * per):
                    member.num_held_blocks -= counts[j]

    def free(self, request_id: str) -> None:
        """Every group's :meth:`free`, in group order; the members' leading null slots
        (a skipped prefix, the same in each) are counted once, on the leader's table."""
        table = self.leader.req_to_blocks.get(request_id)
        head = 0
        if table:
            n = len(table)
            while head < n and table[head].is_null:
                head += 1
        pool = self._pool
        for _, manager, run in self._member_steps:
            if not run:
                manager.free(request_id)
                continue
            # Each member's table from the tail, in group order: one pool call for the run.
            lists: list[list[KVCacheBlock]] = []
            for member in run:
                _drop(member.last_state_block_idx, request_id)
                _drop(member.num_retired_blocks, request_id)
                _drop(member.checkpoints, request_id)
                _drop(member.num_cached_block, request_id)
                blocks = member.req_to_blocks.get(request_id)
                if blocks is None:
                    lists.append([])
                    continue
                del member.req_to_blocks[request_id]
                tail_first = blocks[head:]
                tail_first.reverse()
                lists.append(tail_first)
            counts = pool.free_blocks_groups(lists)
            for k, member in enumerate(run):
                member.num_held_blocks -= counts[k]

    # ---------------------------------------------------------------- caching
    def cache_blocks(
        self, request: Request, num_tokens: int, retention_interval: int | None, replay_boundaries: Sequence[int]
    ) -> bool:
        """Every caching group's :meth:`cache_blocks`, a follower's decided once; False
        (nothing done: cache plainly) when the request holds no table.

        Per follower, as :meth:`MambaManager.cache_blocks`: key the newly full
        blocks under the leader's retention mask; then the tail state: a pending
        checkpoint is dropped (a transient state) or re-keyed unless its block
        already holds that position; else the prompt-boundary state is re-keyed
        if its block lost or lacks that key; remember every key stored now.
        """
        rid = request.request_id
        first = self.followers[0]
        table = first.req_to_blocks.get(rid)
        if table is None:
            return False
        pool = self._pool
        hbs = pool.hash_block_size
        bs = first.block_size
        before = first.num_cached_block.get(rid, 0)
        fine = request.block_hashes
        num_full = min(num_tokens, len(fine) * hbs) // bs
        base = before < num_full
        after = num_full if base else before
        hashes: Sequence[int] = fine
        mask: list[bool] | None = None
        if base:
            hashes = block_hashes_at(fine, hbs, bs)
            boundaries = list(replay_boundaries)
            if request.shared_prefix_boundary:
                boundaries.append(request.shared_prefix_boundary)
            boundaries.extend(
                request.extra_state_positions
            )  # a what-if checkpoint placement's (sim.core.policy.checkpoint)
            mask = first.reachable_block_mask(
                before, num_full, first.cache_hit_alignment_tokens, first.kv_cache_spec, retention_interval, boundaries
            )
        checkpoint = first.checkpoints.get(rid)
        tail_idx = -1
        tail_pos = 0
        transient = False
        if checkpoint is not None:
            tail_pos, tail_idx = checkpoint
            retained = False
            if tail_pos % bs == 0:
                bidx = tail_pos // bs - 1
                kept = first.reachable_block_mask(
                    bidx, bidx + 1, first.cache_hit_alignment_tokens, first.kv_cache_spec, retention_interval
                )
                retained = kept is None or kept[0]
            transient = (
                tail_pos != first.checkpoint_position(request.num_prompt_tokens)
                and not retained
                and tail_pos != request.shared_prefix_boundary
            )
        elif (
            0 < num_tokens
            and num_tokens % hbs == 0
            and num_tokens == prefill_checkpoint_position(request.num_prompt_tokens, hbs)
        ):
            idx = -(-num_tokens // bs) - 1
            if idx < len(table):
                tail_idx, tail_pos = idx, num_tokens
        for gid, manager, run in self._steps:
            if not run:
                if manager.enable_caching:
                    manager.cache_blocks(request, num_tokens, retention_interval, replay_boundaries)
                continue
            tables = [f.req_to_blocks[rid] for f in run]
            if base and tail_idx < 0:
                # No tail state to touch: every follower's newly full blocks in one pool call.
                pool.cache_full_blocks_groups(
                    rid, tables, hashes, before, num_full, bs, list(range(gid, gid + len(run))), mask
                )
            for k, follower in enumerate(run):
                fid = gid + k
                blocks = tables[k]
                if base:
                    if tail_idx >= 0:
                        pool.cache_full_blocks(rid, blocks, hashes, before, num_full, bs, fid, mask)
                    follower.num_cached_block[rid] = num_full
                this_step = follower.cached_blocks_this_step
                if tail_idx >= 0:
                    block = blocks[tail_idx]
                    key: CacheKey | None = None
                    if checkpoint is not None:
                        if transient:
                            pool.evict_cached_block(block, rid, "checkpoint")
                        elif block.block_hash_num_tokens != tail_pos:
                            key = pool.cache_block_at(rid, block, fine[tail_pos // hbs - 1], tail_pos, fid)
                    elif not (
                        block.is_null
                        or block.block_hash_num_tokens == tail_pos
                        or (block.block_hash is not None and (block.block_hash_num_tokens or 0) > tail_pos)
                    ):
                        key = pool.cache_block_at(rid, block, fine[tail_pos // hbs - 1], tail_pos, fid)
                    if key is not None:
                        this_step.add(key)
                for i in range(before, after):
                    key = blocks[i].block_hash
                    if key is not None:
                        this_step.add(key)
        return True


def _drop(table: dict[str, Any], request_id: str) -> None:
    """``table.pop(request_id, None)`` without the generic method call."""
    if request_id in table:
        del table[request_id]


class _Parked:
    """One parked decode: its counters as offsets from both cohort clocks (constant while parked)."""

    __slots__ = ("request", "computed_base", "output_base")

    def __init__(self, request: Request, sched_clock: int, out_clock: int) -> None:
        self.request = request
        #: ``num_computed_tokens - sched_clock``: its ``num_computed_tokens`` at any later ``sched_clock``
        #: is this plus the clock (each step that scheduled the cohort computed one token).
        self.computed_base = request.num_computed_tokens - sched_clock
        #: ``num_output_tokens - out_clock``, likewise for the steps that sampled it.
        self.output_base = request.num_output_tokens - out_clock


class DecodeCohort:
    """The event-driven running set: quiet decodes parked between their events.

    A RUNNING request that just sampled a token and whose next ``K >= 2`` steps
    are provably plain 1-token decodes (inside its quiet horizon, below
    ``max_model_len``, not reaching ``output_len``) is *parked*: the scheduler
    stops touching it per step. Its counters advance with two clocks instead,
    ``sched_clock`` (steps whose ``schedule()`` scheduled the cohort: its
    ``num_computed_tokens``) and ``out_clock`` (steps whose
    ``update_from_output`` sampled it: its ``num_output_tokens``); the step-time
    model's decode totals come from :meth:`decode_totals`. It is unparked
    (*materialized*: counters written back, block hashes caught up) at its event
    (*due*: the ``sched_clock`` after its K parked steps), or earlier when
    something else needs it: it is preempted, aborted, left unscheduled by the
    token budget, or the run ends.

    Invariant: every member is in the scheduler's ``running`` list, and each
    ``schedule()`` either schedules every member for one token or unparks it
    first; so ``sched_clock`` minus its value at parking is the number of steps
    it was scheduled while parked. Members never finish, never cross a horizon
    bound and never touch a KV table while parked, so the plain path would
    have changed nothing else for them.

    The members due at a clock value are kept in a bucket per value, in parking
    order; :meth:`materialize_due` takes every bucket up to the clock (in the
    scheduler one per call: ``sched_clock`` moves by one per step with members,
    and each such ``schedule()`` calls it first). A member unparked earlier
    leaves a stale entry in its bucket, skipped.
    """

    def __init__(self, *, enabled: bool) -> None:
        self.enabled = enabled
        self.sched_clock = 0
        self.out_clock = 0
        self.members: dict[str, _Parked] = {}
        #: Sum over members of ``computed_base`` (the context sum is this + n * sched_clock).
        self._context_base = 0
        #: due clock value -> the members parked until then, in parking order (maybe stale).
        self._due: dict[int, list[_Parked]] = {}
        #: Every bucket below this clock value has been taken.
        self._next_due = 0

    def park(self, request: Request, steps: int) -> None:
        """Park ``request`` for its next ``steps`` decode steps (its counters are current)."""
        member = _Parked(request, self.sched_clock, self.out_clock)
        self.members[request.request_id] = member
        self._context_base += member.computed_base
        due = self.sched_clock + steps
        bucket = self._due.get(due)
        if bucket is None:
            self._due[due] = [member]
        else:
            bucket.append(member)

    def materialize(self, request_id: str) -> Request | None:
        """Unpark one member (no-op for a non-member): write its counters back; returns it."""
        member = self.members.pop(request_id, None)
        if member is None:
            return None
        return self._write_back(member)

    def _write_back(self, member: _Parked) -> Request:
        """``member`` has left ``members``: its counters back on the request, block hashes caught up."""
        request = member.request
        request.num_computed_tokens = member.computed_base + self.sched_clock
        request.num_output_tokens = member.output_base + self.out_clock
        request.update_block_hashes()
        self._context_base -= member.computed_base
        return request

    def materialize_due(self) -> list[Request]:
        """Before ``schedule()``: unpark every member whose parked steps are used up; returns them
        (in parking order), so the scheduler can track who is active without scanning ``running``."""
        unparked: list[Request] = []
        clock = self.sched_clock
        due = self._due
        members = self.members
        for value in range(self._next_due, clock + 1):
            bucket = due.pop(value, None)
            if bucket is None:
                continue
            for member in bucket:
                rid = member.request.request_id
                if members.get(rid) is member:
                    del members[rid]
                    unparked.append(self._write_back(member))
        if self._next_due <= clock:
            self._next_due = clock + 1
        return unparked

    def materialize_all(self) -> None:
        """Unpark everyone (the run ends, or a step the cohort cannot follow)."""
        for rid in list(self.members):
            self.materialize(rid)
        self._due.clear()

    def decode_totals(self) -> tuple[int, int]:
        """``(members, sum of their num_computed_tokens)`` at the current ``sched_clock``."""
        n = len(self.members)
        return n, self._context_base + n * self.sched_clock

    @staticmethod
    def quiet_steps(request: Request, horizon: QuietHorizon | None, max_model_len: int) -> int:
        """How many next steps are plain 1-token decodes for ``request`` (right after it sampled).

        With ``c`` computed and ``o`` output tokens (``c + 1`` known tokens), its
        ``j``-th next step computes token ``c + j`` from ``c + j - 1``: the running
        loop takes it as a quiet decode while ``c + j - 1 < max_model_len - 1``,
        ``c + j <= max_main_tokens`` and ``c + j - 1 <= max_processed_tokens``
        (:meth:`QuietHorizons.take_decodes`), and it samples without stopping
        while ``o + j < output_len`` and ``c + j + 1 < max_model_len``.
        """
        if horizon is None:
            return 0
        c = request.num_computed_tokens
        # The minimum of the four bounds, as comparisons (the horizon's bounds may be
        # QUIET_NO_BOUND, beyond a compiled short int: compared, not subtracted).
        steps = max_model_len - c - 2
        left = request.output_len - request.num_output_tokens - 1
        if left < steps:
            steps = left
        if horizon.max_main_tokens < c + steps:
            steps = horizon.max_main_tokens - c
        if horizon.max_processed_tokens < c + steps - 1:
            steps = horizon.max_processed_tokens - c + 1
        return steps
