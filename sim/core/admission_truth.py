"""The admission truth checker: what the engine would really compute after an admission.

The scheduler calls the checker (its ``admission_checker`` hook) after every
successful ``allocate_slots`` of a waiting request, with the policy's claimed
blocks and the ``local`` / ``external`` tokens it was given. The checker
compares that claim with what the block pool really holds and returns
``(outcome, tokens_lost, taint_origin)``.

**The validity rule** (one rule, applied by :func:`resident_block_range`):
to continue at ``b = local + external`` a real model reads, per group,

* full attention: the KV of every position in ``[0, b)``;
* sliding window ``W``: the KV of ``[b - W + 1, b)`` (older positions are out
  of the window; ``allocate_slots`` frees their blocks, and with a tight pool
  the same allocation may evict and reuse them, which is harmless);
* Mamba: the state at exactly ``b`` (vLLM derives ``has_initial_states``
  from the scalar ``num_computed_tokens``, so it starts from whatever the
  slot holds: #43090, LMCache #4674).

A connector that answers ``external > 0`` writes, by its declared
capabilities (:class:`~sim.connector.base.KVConnector`): every attention
group's KV for ``[local, b)``; the Mamba state at ``b`` when
``supplies_mamba_state``; and, when ``pulls_unhashed_blocks`` (NIXL), the
attention positions below ``local`` that no claimed block backs. A
connector answering 0 writes nothing. Everything read and not written must
be *resident*: a claimed, real block cached under the request's hash for that
position in that group, at the moment of the allocation (claimed blocks are
touched by it, so they cannot be evicted by it). Connector data is assumed
clean (no taint is tracked through a connector's own store).

Outcomes:

* ``corrupt`` — the rule fails somewhere (e.g. vLLM #44243 claims
  full-attention positions that ``allocate_slots`` then fills with fresh,
  never-computed blocks: "dirty KV"), or a resident block is *tainted*.
* ``recompute`` — valid, but a deeper valid boundary existed;
  ``tokens_lost`` = that boundary − ``b``.
* ``ok`` — valid and no shallower than the best valid boundary.
* ``crash`` is recorded by the scheduler itself (an assert fired before
  the admission completed); the checker never sees those.

**Taint.** A request admitted ``corrupt`` has a *bad point* ``p`` (the first
token position whose KV or state is wrong). Every block it caches whose
cache entry covers more than ``p`` tokens gets ``block.taint = origin``
(the first corrupt request of the chain); the blocks it already cached in
``allocate_slots`` are tainted at once, later ones through the block pool's
``cache_listener``. A later admission whose resident blocks include a tainted
block is ``corrupt`` with ``taint_origin`` = that origin. The pool clears
the taint when the block's cache entry is evicted.

**Best valid boundary** (for ``recompute``), the deepest of, by the same rule:
(1) local: an aligned ``c > b`` up to every full-attention group's hit (at
lookup time) with every sliding-window block of ``[c - W + 1, c)`` and every
Mamba state at ``c`` cached (clean, and not cached by this very request);
(2) connector: shown ``s`` (the full-attention hit, and the admission's own
block-aligned ``local``, which differs from the position the connector was
asked at after vLLM 0.33's ``hit_diverged`` fallback: that fallback does not
ask the connector again, and the cost must show), the boundary
``s + peek(s)`` when the connector's side-effect-free
:meth:`~sim.connector.base.KVConnector.peek_num_new_matched_tokens` answers
a positive count that stops short of the prompt's end, with what it does not
write resident. Deliberate approximation: a cache entry this very
allocation evicted is not seen.

Cost per admission: O(claimed blocks), plus O(blocks between ``b`` and the
full-attention hit) when the chosen boundary is shallower than that hit.
"""

from __future__ import annotations

from typing import Sequence

from sim.core.admission import AdmissionAttempt
from sim.core.interfaces import SchedulerConnector
from sim.core.kv.block_pool import KVCacheBlock
from sim.core.kv.hash_view import cached_block_hashes
from sim.core.kv.hashing import BlockHash
from sim.core.kv.kv_cache_manager import KVCacheManager
from sim.core.kv.specs import SlidingWindowSpec, cdiv
from sim.core.request import Request

OK, RECOMPUTE, CORRUPT = "ok", "recompute", "corrupt"


def resident_block_range(
    kind: str, block_size: int, window: int, boundary: int, local: int, state_supplied: bool
) -> tuple[int, int] | None:
    """The block indices ``[start, stop)`` of one group that must be resident to continue at ``boundary``.

    ``local`` is where the connector's writes start (``local == boundary``
    when it supplies nothing); ``state_supplied`` says it writes the Mamba
    state at ``boundary``. ``None``: no block can hold what is read (a
    Mamba state off a block boundary). This is the module's validity rule;
    everything else only looks the blocks up.
    """
    if kind == "mamba":
        if boundary == 0 or state_supplied:
            return (0, 0)
        if boundary % block_size:
            return None
        return (boundary // block_size - 1, boundary // block_size)
    first = 0 if kind == "full_attention" else max(0, boundary - window + 1)
    return (first // block_size, cdiv(local, block_size))


class TruthChecker:
    """Callable ``AdmissionAttempt -> (outcome, tokens_lost, taint_origin)`` over one kv manager.

    Installs itself as the block pool's ``cache_listener`` (to taint blocks a
    corrupt request caches later) while some request is marked bad, and only
    then: with ``bad`` empty the listener would do nothing, so the pool calls
    none (one call per cached block saved). One checker per kv manager.
    """

    def __init__(self, kv_manager: KVCacheManager, connector: SchedulerConnector | None = None) -> None:
        self.kv = kv_manager
        self.pool = kv_manager.block_pool
        if connector is not None and connector.name == "none":
            connector = None
        self.connector = connector
        self.align = kv_manager.kv_cache_config.scheduler_block_size
        self.kv_cache_config = kv_manager.kv_cache_config
        #: (group id, kind, block size, window; 0 unless sliding window).
        self.groups: list[tuple[int, str, int, int]] = []
        for gid, group in enumerate(kv_manager.kv_cache_config.groups):
            spec = group.spec
            window = spec.window if isinstance(spec, SlidingWindowSpec) else 0
            self.groups.append((gid, spec.kind, spec.block_size, window))
        #: request id -> (taint origin, bad point in tokens) while it may still cache blocks.
        self.bad: dict[str, tuple[str, int]] = {}
        #: request id -> verdict of its async-load admission, repeated at the resume.
        self._async_verdicts: dict[str, tuple[str, str]] = {}
        self.pool.cache_listener = None

    def _listen_while_bad(self) -> None:
        """The pool's listener is :meth:`_on_cache` iff some request is marked bad (call after ``bad`` changes)."""
        self.pool.cache_listener = self._on_cache if self.bad else None

    # --------------------------------------------------------------- taint
    def _on_cache(self, block: KVCacheBlock, request_id: str) -> None:
        bad = self.bad.get(request_id)
        if bad is not None and block.block_hash_num_tokens is not None and block.block_hash_num_tokens > bad[1]:
            block.taint = bad[0]

    def _taint_cached(
        self, request_id: str, claimed: Sequence[Sequence[KVCacheBlock]], origin: str, bad_point: int
    ) -> None:
        """Taint what ``allocate_slots`` already cached for the request beyond ``bad_point``
        (its claimed hit blocks are reused, not computed, and stay as they are)."""
        for (gid, _, bs, _), table in zip(self.groups, self.kv.coordinator.get_blocks(request_id)):
            mine = claimed[gid] if gid < len(claimed) else ()
            for i in range(bad_point // bs, len(table)):
                blk = table[i]
                if blk.is_null or blk.block_hash is None or (i < len(mine) and mine[i] is blk):
                    continue
                if blk.block_hash_num_tokens is not None and blk.block_hash_num_tokens > bad_point:
                    blk.taint = origin

    # ------------------------------------------------------------- verdict
    def __call__(self, adm: AdmissionAttempt) -> tuple[str, int, str]:
        rid = adm.request.request_id
        if adm.kind == "after_async_load":
            outcome, origin = self._async_verdicts.pop(rid, (OK, ""))
            return outcome, 0, origin
        if rid in self.bad:
            del self.bad[rid]
            self._listen_while_bad()
        outcome, lost, origin = self._classify(adm)
        if adm.load_async:
            self._async_verdicts[rid] = (outcome, origin)
        return outcome, lost, origin

    def _hashes_at(self, request: Request, block_size: int) -> Sequence[BlockHash]:
        """The request's block hashes at ``block_size`` (none without prefix caching: nothing is cached)."""
        return cached_block_hashes(request.block_hashes, self.kv_cache_config, block_size)

    def _writes_state(self, ext: int) -> bool:
        return ext > 0 and self.connector is not None and self.connector.supplies_mamba_state

    def _classify(self, adm: AdmissionAttempt) -> tuple[str, int, str]:
        request = adm.request
        local, ext = adm.local, adm.ext
        resume = local + ext
        claimed = adm.blocks.blocks
        state_supplied = self._writes_state(ext)
        refilled = ext > 0 and self.connector is not None and self.connector.pulls_unhashed_blocks
        bad: int | None = None
        origin = ""

        for gid, kind, bs, window in self.groups:
            lst = claimed[gid] if gid < len(claimed) else ()
            hashes = self._hashes_at(request, bs)
            need = resident_block_range(kind, bs, window, resume, local, state_supplied)
            point: int | None
            if need is None:
                point, taint = resume, None
            else:
                point, taint = self._first_unbacked(lst, hashes, gid, bs, need, refilled and kind != "mamba")
                if point is not None and kind == "mamba":
                    point = resume  # a wrong state is read at the boundary, so tokens from there on are wrong
            if point is not None and (bad is None or point < bad):
                bad, origin = point, taint or ""

        if bad is not None:
            root = origin or request.request_id
            self.bad[request.request_id] = (root, bad)
            self._listen_while_bad()
            self._taint_cached(request.request_id, claimed, root, bad)
            return CORRUPT, 0, origin
        best = max(self._best_local_boundary(adm, resume), self._best_connector_boundary(adm))
        return (RECOMPUTE, best - resume, "") if best > resume else (OK, 0, "")

    @staticmethod
    def _first_unbacked(
        lst: Sequence[KVCacheBlock],
        hashes: Sequence[BlockHash],
        gid: int,
        bs: int,
        need: tuple[int, int],
        refilled: bool,
    ) -> tuple[int | None, str | None]:
        """First position of ``need`` the claimed list does not back (with the taint found there, if any)."""
        for i in range(*need):
            if i >= len(lst) and refilled:
                return None, None  # unclaimed positions get fresh blocks, which the pull fills
            if i >= len(lst) or not _holds(lst[i], hashes, i, gid):
                return i * bs, None
            if lst[i].taint is not None:
                return i * bs, lst[i].taint
        return None, None

    # ------------------------------------------------- best valid boundary
    def _cached_clean(
        self, request: Request, own: Sequence[Sequence[KVCacheBlock]], gid: int, bs: int, index: int
    ) -> bool:
        """Block ``index`` of group ``gid`` is cached, untainted, and was not cached by this request."""
        hashes = self._hashes_at(request, bs)
        if index >= len(hashes):
            return False
        mine = own[gid][index] if index < len(own[gid]) else None
        return any(blk is not mine and blk.taint is None for blk in self.pool.get_all_cached_blocks(hashes[index], gid))

    def _resident_for(
        self,
        adm: AdmissionAttempt,
        own: Sequence[Sequence[KVCacheBlock]],
        boundary: int,
        local: int,
        state_supplied: bool,
    ) -> bool:
        """The rule for a hypothetical admission at ``boundary`` (connector writes from ``local``),
        looked up in the cache; full attention is taken from the admission's per-group hits."""
        for gid, kind, bs, window in self.groups:
            if kind == "full_attention":
                if adm.hits[gid] < local:
                    return False
                continue
            need = resident_block_range(kind, bs, window, boundary, local, state_supplied)
            if need is None or not all(self._cached_clean(adm.request, own, gid, bs, i) for i in range(*need)):
                return False
        return True

    def _best_local_boundary(self, adm: AdmissionAttempt, resume: int) -> int:
        """Deepest valid boundary the local cache offered beyond ``resume`` (0 if none)."""
        cap: int = adm.request.get_max_cache_hit_length()
        for gid, kind, _, _ in self.groups:
            if kind == "full_attention":
                cap = min(cap, adm.hits[gid])
        b = cap // self.align * self.align
        if b <= resume:
            return 0
        own = self.kv.coordinator.get_blocks(adm.request.request_id)
        while b > resume:
            if self._resident_for(adm, own, b, b, False):
                return b
            b -= self.align
        return 0

    def _best_connector_boundary(self, adm: AdmissionAttempt) -> int:
        """Deepest valid boundary with a connector load (0 if none).

        Shown the full-attention hit, and shown the admission's own aligned
        ``local`` (after the ``hit_diverged`` fallback vLLM 0.33 does not ask
        again), the connector's side-effect-free answer counts when positive,
        short of the prompt's end, and what it does not write is resident.
        """
        conn = self.connector
        request = adm.request
        if conn is None or request.skip_reading_external_kv:
            return 0
        fa_hits = [adm.hits[gid] for gid, kind, _, _ in self.groups if kind == "full_attention"]
        shown_at = {adm.local // self.align * self.align}
        if fa_hits:
            shown_at.add(min(fa_hits) // self.align * self.align)
        own = self.kv.coordinator.get_blocks(request.request_id)
        best = 0
        for shown in sorted(shown_at):
            ext = conn.peek_num_new_matched_tokens(request, shown)
            if not ext or shown + ext >= request.num_tokens:
                continue
            if self._resident_for(adm, own, shown + ext, shown, conn.supplies_mamba_state):
                best = max(best, shown + ext)
        return best


def _holds(block: KVCacheBlock, hashes: Sequence[BlockHash], index: int, group_id: int) -> bool:
    """``block`` is a real block cached under the request's hash ``index`` in ``group_id``
    (``hashes`` viewed at the group's block size)."""
    key = block.block_hash
    return (
        not block.is_null and key is not None and key[1] == group_id and index < len(hashes) and key[0] == hashes[index]
    )


def make_truth_checker(kv_manager: KVCacheManager, connector: SchedulerConnector | None = None) -> TruthChecker:
    """The checker the engine passes to the scheduler as ``admission_checker``."""
    return TruthChecker(kv_manager, connector)
