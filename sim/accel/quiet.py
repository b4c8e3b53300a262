"""Quiet horizons: the running loop's ``allocate_slots`` calls that provably change nothing.

Most calls of the scheduler's running loop give a running request a few more
tokens inside blocks it already holds; then vLLM's per-group steps (skip,
count, allocate, cache) change nothing and return no block. After each full
``allocate_slots`` the manager notes, per request, a *quiet horizon*: bounds on
``computed + new`` and on the processed tokens under which the next plain call
(no hit, no external or lookahead tokens) provably changes nothing in any
group; a call inside the horizon returns no blocks without the per-group work.

Supported layouts (:meth:`QuietKVCacheManager.supports`): full attention and
align-mode Mamba groups with one common block size. Any other layout is built
with the plain :class:`~sim.core.kv.kv_cache_manager.KVCacheManager`.

The bounds read the single-type managers' tables (never write them):
:func:`quiet_horizon` is the per-group rule, written against
``sim/core/kv/single_type_kv_cache_manager.py``; a change to how a group type skips, allocates or
caches must be mirrored here (the differential test catches a miss).
"""

from __future__ import annotations

from typing import Final, Sequence

from sim.accel.counters import CachedEntryCounter, CountingBlockPool, CountingKVCacheManager
from sim.accel.lookups import HeadOfLineLookups
from sim.accel.replicas import ReplicaCoordinator
from sim.core.kv.block_pool import KVCacheBlock, KVEvent, KVEventLog
from sim.core.kv.kv_cache_manager import KVCacheBlocks
from sim.core.kv.single_type_kv_cache_manager import (
    FullAttentionManager,
    MambaManager,
    SingleTypeKVCacheManager,
    manager_class_for,
)
from sim.core.kv.specs import KVCacheConfig, MambaSpec
from sim.core.request import Request, RequestStatus

#: "No bound" in a :func:`quiet_horizon` answer.
NO_BOUND: Final = 1 << 62


def _has_quiet_horizon(manager_cls: type[SingleTypeKVCacheManager], spec: object) -> bool:
    """Whether :func:`quiet_horizon` knows the group type (exact classes: a subclass may change the rules)."""
    if manager_cls is FullAttentionManager:
        return True
    return manager_cls is MambaManager and isinstance(spec, MambaSpec) and spec.mamba_cache_mode == "align"


def quiet_horizon(manager: SingleTypeKVCacheManager, request_id: str) -> tuple[int, int] | None:
    """``(max_main_tokens, max_processed_tokens)`` of one group: while a plain ``allocate_slots``
    call (no hit, no external or lookahead tokens) has ``computed + new <= max_main_tokens`` and
    ``processed <= max_processed_tokens``, it changes nothing in this group's table and returns
    no block for it. ``None``: no such bound now.

    Full attention (block size ``B``, table length ``L``, ``N`` cached slots): no new
    block while ``computed + new <= B * L``; nothing to cache while ``computed + new <
    (N + 1) * B``; processing frees nothing.

    Align-mode Mamba adds: nothing retired while ``processed <= (R + 1) * B`` (``R``
    retired slots, if ``R < L``), and the previous state block is kept while
    ``processed <= (idx + 1) * B``. A pending prefill checkpoint gives no horizon (the
    next call re-keys or drops it).
    """
    table = manager.req_to_blocks.get(request_id)
    if table is None:
        return None
    mamba = manager if isinstance(manager, MambaManager) else None
    if mamba is not None and request_id in mamba.checkpoints:
        return None
    bs = manager.block_size
    max_main = len(table) * bs
    if manager.enable_caching:
        cache_bound = (manager.num_cached_block.get(request_id, 0) + 1) * bs - 1
        if cache_bound < max_main:
            max_main = cache_bound
    max_processed = NO_BOUND
    if mamba is not None:
        retired = mamba.num_retired_blocks.get(request_id, 0)
        if retired < len(table) and (retired + 1) * bs < max_processed:
            max_processed = (retired + 1) * bs
        idx = mamba.last_state_block_idx.get(request_id)
        if idx is not None and not table[idx].is_null and (idx + 1) * bs < max_processed:
            max_processed = (idx + 1) * bs
    return max_main, max_processed


class QuietHorizon:
    """One request's horizon: valid while its first group's table is ``table``.

    ``max_decode_computed``: the largest ``num_computed_tokens`` at which a one-token
    ``allocate_slots`` call is inside the horizon (``computed + 1 <= max_main_tokens`` and
    ``computed <= max_processed_tokens``): the bound :class:`~sim.accel.decodes.QuietDecodeScheduler`
    checks.
    """

    __slots__ = ("table", "max_main_tokens", "max_processed_tokens", "max_decode_computed")

    def __init__(self, table: list[KVCacheBlock], max_main_tokens: int, max_processed_tokens: int) -> None:
        self.table = table
        self.max_main_tokens = max_main_tokens
        self.max_processed_tokens = max_processed_tokens
        self.max_decode_computed = min(max_main_tokens - 1, max_processed_tokens)


class QuietHorizons:
    """The quiet horizons of every request, for one KV manager's groups.

    Invariant: a stored horizon is exact for the tables as they were after the
    last full ``allocate_slots`` of its request. The manager drops it before
    anything that could move a bound or replace a table (free, skip, cache, a
    full allocation). ``max_tokens`` caps ``num_new_tokens``: a longer chunk may
    export a Mamba prefill checkpoint.
    """

    def __init__(
        self,
        groups: Sequence[SingleTypeKVCacheManager],
        *,
        max_model_len: int,
        watermark_blocks: int,
        max_tokens: int,
        deciding: ReplicaCoordinator | None = None,
    ) -> None:
        if not groups:
            raise ValueError("QuietHorizons needs at least one group")
        self._groups = tuple(groups)
        #: With replica groups, their followers' bounds are their leaders' (same table shapes): only the
        #: deciding groups are asked, while the replicas are on.
        self._replicas = deciding
        self._deciding = tuple(deciding.deciding_managers) if deciding is not None else self._groups
        self.max_model_len = max_model_len
        self.max_tokens = max_tokens
        self._watermark = watermark_blocks > 0
        #: The first group's table of each request (the horizons' validity check).
        self._first_tables: dict[str, list[KVCacheBlock]] = groups[0].req_to_blocks
        #: request id -> its horizon (read-only outside this class).
        self.horizons: dict[str, QuietHorizon] = {}

    def get(self, request_id: str) -> QuietHorizon | None:
        return self.horizons.get(request_id)

    def drop(self, request_id: str) -> None:
        self.horizons.pop(request_id, None)

    def note(self, request_id: str) -> None:
        """After a full ``allocate_slots``: store the minimum of every group's bounds (or none)."""
        first = self._first_tables.get(request_id)
        if first is None:
            return
        max_main = max_processed = NO_BOUND
        replicas = self._replicas
        for group in self._deciding if replicas is None or replicas.replicas_on else self._groups:
            bounds = quiet_horizon(group, request_id)
            if bounds is None:
                return
            if bounds[0] < max_main:
                max_main = bounds[0]
            if bounds[1] < max_processed:
                max_processed = bounds[1]
        self.horizons[request_id] = QuietHorizon(first, max_main, max_processed)

    def covers(self, request: Request, num_new_tokens: int) -> bool:
        """A plain ``allocate_slots(request, num_new_tokens)`` is a proven no-op now.

        Checks the table is the one the horizon was noted for, and (under a
        watermark) that the request is not a WAITING/PREEMPTED admission.
        """
        horizon = self.horizons.get(request.request_id)
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


class QuietKVCacheManager(CountingKVCacheManager):
    """:class:`~sim.accel.counters.CountingKVCacheManager` that skips ``allocate_slots`` calls inside a request's quiet horizon.

    Every other call goes to the plain manager: the horizon is dropped before
    anything that may change the request's tables and noted again after a
    full allocation that cached its blocks.

    It also keeps the :class:`~sim.accel.lookups.HeadOfLineLookups` of the
    scheduler's waiting phase (``head_lookups``; None when the pool emits no
    events). :meth:`sync_events` shows them the events the pool emitted since
    the last sync and holds those events pending: :meth:`take_event_log`,
    :meth:`take_events` and :attr:`num_pending_events` answer as the plain
    manager would (the same events, in the same order).
    """

    @staticmethod
    def supports(kv_cache_config: KVCacheConfig) -> bool:
        """Whether every group has a quiet-horizon rule and all share one block size."""
        groups = kv_cache_config.groups
        return (
            bool(groups)
            and len({g.spec.block_size for g in groups}) == 1
            and all(_has_quiet_horizon(manager_class_for(g.spec), g.spec) for g in groups)
        )

    def __init__(self, kv_cache_config: KVCacheConfig, **options: object) -> None:
        if not self.supports(kv_cache_config):
            raise ValueError("quiet horizons need full-attention / align-mode Mamba groups of one block size")
        super().__init__(kv_cache_config, **options)  # type: ignore[arg-type]
        kv_options = self.kv_cache_options
        #: The replica groups' coordinator (sim.accel.replicas) where the layout has them, else None.
        self.replicas: ReplicaCoordinator | None = None
        if ReplicaCoordinator.applies(kv_cache_config, kv_options):
            # Built in place of the core's coordinator before anything used it (the LRU pool it made is dropped).
            self.replicas = self.coordinator = ReplicaCoordinator(kv_cache_config, kv_options)
            pool = self.coordinator.block_pool
            assert isinstance(pool, CachedEntryCounter)
            self.block_pool = pool
        managers = self.coordinator.single_type_managers
        self._managers = managers
        #: Events taken from the pool so far, and num_cached_per_group's last answer with the count it was
        #: computed at (-1: never).
        self._events_taken = 0
        self._count_events = type(self.block_pool) is CountingBlockPool and self.block_pool.enable_kv_cache_events
        self._cached_counts: tuple[int, ...] = ()
        self._cached_counts_at = -1
        self.quiet = QuietHorizons(
            managers,
            deciding=self.replicas,
            max_model_len=self.max_model_len,
            watermark_blocks=self.watermark_blocks,
            # A chunk longer than the alignment may export a Mamba prefill checkpoint.
            max_tokens=min(
                (
                    m.cache_hit_alignment_tokens
                    for m in managers
                    if isinstance(m, MambaManager) and m.has_prefill_checkpoint_blocks
                ),
                default=self.max_model_len,
            ),
        )
        self.head_lookups = HeadOfLineLookups() if self.block_pool.enable_kv_cache_events else None
        #: Events taken from the pool by :meth:`sync_events` and not yet by a caller (oldest first).
        self._held: KVEventLog | None = None

    def sync_events(self) -> None:
        """Show the events emitted since the last sync to ``head_lookups``; they stay pending."""
        if not self.block_pool.num_pending_events:
            return
        log = self.block_pool.take_event_log()
        self._events_taken += len(log)
        if self.head_lookups is not None:
            self.head_lookups.forget_changed(log)
        held = self._held
        if held is None:
            self._held = log
        else:
            held.extend_log(log)

    def take_event_log(self) -> KVEventLog:
        held = self._held
        if held is None:  # (the common case: nothing held, so the pool's log is the answer)
            log = self.block_pool.take_event_log()
            self._events_taken += len(log)
            if self.head_lookups is not None:
                self.head_lookups.forget_changed(log)
            return log
        self.sync_events()
        self._held = None
        return held

    def num_blocks_per_group(self) -> tuple[int, ...]:
        return tuple([m.held_blocks for m in self._managers])  # type: ignore[attr-defined]

    def num_cached_per_group(self) -> tuple[int, ...]:
        """The counters' answer (the steps table asks every step), kept while no event left the pool meanwhile.

        A group's entry count changes only where the pool emits an event (``stored``, ``removed``,
        ``cleared``), and every event leaves the pool through this manager (:meth:`take_event_log`,
        :meth:`sync_events`, which count them): the same count of events seen and pending means no change.
        Only with the plain pool and its events on; else asked every time.
        """
        seen = self._events_taken + self.block_pool.num_pending_events
        if seen != self._cached_counts_at or not self._count_events:
            self._cached_counts = self.block_pool.cached_entries_per_group(self.num_kv_cache_groups)
            self._cached_counts_at = seen
        return self._cached_counts

    def take_events(self) -> list[KVEvent]:
        return self.take_event_log().rows()

    @property
    def num_pending_events(self) -> int:
        held = self._held
        return self.block_pool.num_pending_events + (len(held) if held is not None else 0)

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
        quiet = self.quiet
        if (
            new_computed_blocks is None
            and has_scheduled_reqs
            and not (num_new_computed_tokens or num_external_computed_tokens or num_lookahead_tokens or reserved_blocks)
            and not (delay_cache_blocks or full_sequence_must_fit)
            and quiet.covers(request, num_new_tokens)
        ):
            return self.empty_kv_cache_blocks
        rid = request.request_id
        quiet.drop(rid)
        blocks = super().allocate_slots(
            request,
            num_new_tokens,
            num_new_computed_tokens,
            new_computed_blocks,
            num_lookahead_tokens,
            num_external_computed_tokens,
            delay_cache_blocks,
            full_sequence_must_fit,
            reserved_blocks,
            has_scheduled_reqs,
        )
        if blocks is not None and not delay_cache_blocks:
            quiet.note(rid)
        return blocks

    def free(self, request: Request) -> None:
        self.quiet.drop(request.request_id)
        if self.head_lookups is not None:
            self.head_lookups.forget(request.request_id)
        super().free(request)

    def remove_skipped_blocks(
        self, request_id: str, processed_computed_tokens: int, num_prompt_tokens: int | None = None
    ) -> None:
        self.quiet.drop(request_id)
        super().remove_skipped_blocks(request_id, processed_computed_tokens, num_prompt_tokens)

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        self.quiet.drop(request.request_id)
        super().cache_blocks(request, num_computed_tokens)
