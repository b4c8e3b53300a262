"""The admission truth checker: what the engine would really compute after an admission.

The scheduler calls the checker (its ``admission_checker`` hook) after every
successful ``allocate_slots`` of a waiting request, with the policy's claimed
blocks and the ``local`` / ``external`` tokens it was given. The checker
compares that claim with what the block pool really holds and returns
``(outcome, tokens_lost, taint_origin)``:

* ``corrupt`` — the real engine would go on with wrong state, silently:
  a full-attention position below ``local`` that no claimed, resident block
  with the right hash backs (vLLM #44243 claims such positions and
  ``allocate_slots`` fills them with fresh, never-computed blocks: "dirty
  KV"); a sliding-window group missing a block of its window before
  ``local``; or no valid Mamba state exactly at the resume boundary
  ``R = local + external`` (vLLM derives ``has_initial_states`` from the
  scalar ``num_computed_tokens``, so it starts from whatever the slot holds:
  #43090, LMCache #4674). Reusing a *tainted* block is corrupt too.
* ``recompute`` — valid, but the local cache alone held a deeper valid
  boundary; ``tokens_lost`` = that boundary − ``R``.
* ``ok`` — valid and no shallower than the best local choice.
* ``crash`` is recorded by the scheduler itself (an assert fired before
  the admission completed); the checker never sees those.

**What a connector supplies.** A connector that answers ``external > 0``
supplies everything it claims: every group's KV for tokens ``[local, R)``
and the Mamba state at ``R`` (vLLM's NIXL ships the last Mamba state
unconditionally; the ``scripted`` connector is truthful by construction).
A connector may opt out with a ``supplies_mamba_state = False`` attribute
(then its Mamba state at ``R`` must be local, like a non-HMA-aware store).
A connector answering 0 supplies nothing. Connector data is assumed clean
(the checker does not track taint through a connector's own store). A
connector with a true ``pulls_unhashed_blocks`` attribute (the NIXL-like
``remote``: NIXL pulls every block of the request that holds no cache entry,
paired from the tail) also refills attention positions below ``local`` that
the policy claimed but that no claimed block backs, when it answers
``external > 0``: those positions are then correct.

**Taint.** A request admitted ``corrupt`` has a *bad point* ``p`` (the first
token position whose KV or state is wrong). Every block it caches whose
cache entry covers more than ``p`` tokens gets ``block.taint = origin``
(the first corrupt request of the chain); the blocks it already cached in
``allocate_slots`` are tainted at once, later ones through the block pool's
``cache_listener``. A later admission whose claimed blocks include a tainted
block is ``corrupt`` with ``taint_origin`` = that origin. The pool clears
the taint when the block's cache entry is evicted.

**Best valid boundary** (for ``recompute``): the deeper of two candidates.
(1) Local: the deepest boundary ``b > R``, aligned to the scheduler block
size, with full attention contiguous to ``b`` at lookup time (the
admission's per-group hits), every Mamba group holding a clean cached state
at ``b`` now, and ``b`` within every sliding-window group's independent hit.
(2) Connector: the full-attention hit ``F`` plus what the connector answers
when shown ``F`` (what #48425 does when Mamba lags), if that answer is
positive and stops short of the prompt's end. Deliberate approximation: a
Mamba state this very allocation evicted is not seen.

Cost per admission: O(claimed blocks), plus O(blocks between ``R`` and the
full-attention hit) when the chosen boundary is shallower than that hit.
"""

from __future__ import annotations

from typing import Any

from sim.interfaces import SchedulerConnector
from sim.kv.hash_view import block_hashes_at
from sim.kv.manager import KVCacheManager
from sim.kv.specs import SlidingWindowSpec

OK, RECOMPUTE, CORRUPT = "ok", "recompute", "corrupt"

#: Connectors whose ``get_num_new_matched_tokens`` may be asked a hypothetical
#: question (vLLM requires it to be side-effect free, but e.g. the ``faulty``
#: wrapper draws random numbers there). Others opt in with a true
#: ``side_effect_free_lookup`` attribute.
SIDE_EFFECT_FREE_CONNECTORS = frozenset({"scripted"})


def _side_effect_free(connector: SchedulerConnector) -> bool:
    return connector.side_effect_free_lookup or connector.name in SIDE_EFFECT_FREE_CONNECTORS


class TruthChecker:
    """Callable ``Admission -> (outcome, tokens_lost, taint_origin)`` over one kv manager.

    Installs itself as the block pool's ``cache_listener`` (to taint blocks a
    corrupt request caches later); one checker per kv manager.
    """

    def __init__(self, kv_manager: KVCacheManager, connector: SchedulerConnector | None = None) -> None:
        self.kv = kv_manager
        self.pool = kv_manager.block_pool
        if connector is not None and connector.name == "none":
            connector = None
        self.connector = connector
        self.align = kv_manager.kv_cache_config.scheduler_block_size
        #: ``Request.block_hashes`` granularity; each group is checked against its own view.
        self.hash_block_size = kv_manager.kv_cache_config.hash_block_size
        #: (group id, kind, block size, blocks a sliding window needs).
        self.groups: list[tuple[int, str, int, int]] = []
        for gid, group in enumerate(kv_manager.kv_cache_config.groups):
            spec = group.spec
            need = spec.blocks_for_hit if isinstance(spec, SlidingWindowSpec) else 0
            self.groups.append((gid, spec.kind, spec.block_size, need))
        #: request id -> (taint origin, bad point in tokens) while it may still cache blocks.
        self.bad: dict[str, tuple[str, int]] = {}
        #: request id -> verdict of its async-load admission, repeated at the resume.
        self._async_verdicts: dict[str, tuple[str, str]] = {}
        self.pool.cache_listener = self._on_cache

    # --------------------------------------------------------------- taint
    def _on_cache(self, block: Any, request_id: str) -> None:
        bad = self.bad.get(request_id)
        if bad is not None and block.block_hash_num_tokens is not None and block.block_hash_num_tokens > bad[1]:
            block.taint = bad[0]

    def _taint_cached(self, request_id: str, claimed: tuple, origin: str, bad_point: int) -> None:
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
    def __call__(self, adm: Any) -> tuple[str, int, str]:
        rid = adm.request.request_id
        if adm.kind == "after_async_load":
            outcome, origin = self._async_verdicts.pop(rid, (OK, ""))
            return outcome, 0, origin
        self.bad.pop(rid, None)
        outcome, lost, origin = self._classify(adm)
        if adm.load_async:
            self._async_verdicts[rid] = (outcome, origin)
        return outcome, lost, origin

    def _supplies_mamba(self, ext: int) -> bool:
        return ext > 0 and self.connector is not None and self.connector.supplies_mamba_state

    def _classify(self, adm: Any) -> tuple[str, int, str]:
        request = adm.request
        local, ext = adm.local_tokens, adm.external_tokens
        resume = local + ext
        claimed = adm.blocks.blocks if adm.blocks is not None else ()
        mamba_supplied = self._supplies_mamba(ext)
        refilled = ext > 0 and self.connector is not None and self.connector.pulls_unhashed_blocks
        bad: int | None = None
        origin = ""

        def note(point: int, taint: str | None) -> None:
            nonlocal bad, origin
            if bad is None or point < bad:
                bad, origin = point, taint or ""

        for gid, kind, bs, need in self.groups:
            lst = claimed[gid] if gid < len(claimed) else ()
            hashes = block_hashes_at(request.block_hashes, self.hash_block_size, bs)
            if kind == "mamba":
                if resume == 0 or mamba_supplied:
                    continue
                idx = resume // bs - 1
                if resume % bs or idx >= len(lst) or not _holds(lst[idx], hashes, idx, gid):
                    note(resume, None)
                elif lst[idx].taint is not None:
                    note(resume, lst[idx].taint)
                continue
            end = local // bs
            start = 0 if kind == "full_attention" else max(0, end - need)
            for i in range(start, end):
                if i >= len(lst) and refilled:
                    break  # unclaimed positions get fresh blocks, which the pull fills
                if i >= len(lst) or not _holds(lst[i], hashes, i, gid):
                    note(i * bs, None)
                    break
                if lst[i].taint is not None:
                    note(i * bs, lst[i].taint)
                    break

        if bad is not None:
            root = origin or request.request_id
            self.bad[request.request_id] = (root, bad)
            self._taint_cached(request.request_id, claimed, root, bad)
            return CORRUPT, 0, origin
        best = max(self._best_local_boundary(adm, resume), self._best_connector_boundary(adm))
        return (RECOMPUTE, best - resume, "") if best > resume else (OK, 0, "")

    def _best_connector_boundary(self, adm: Any) -> int:
        """Resume boundary had the connector been shown the full-attention hit (0 if none).

        Valid when the connector would supply external tokens (and with them
        the Mamba state) without reaching the end of the prompt. Only asked of
        connectors whose ``get_num_new_matched_tokens`` is known to be free of
        side effects (see :data:`SIDE_EFFECT_FREE_CONNECTORS`).
        """
        conn = self.connector
        if conn is None or adm.request.skip_reading_prefix_cache or not _side_effect_free(conn):
            return 0
        if not conn.supplies_mamba_state and any(k == "mamba" for _, k, _, _ in self.groups):
            return 0
        hits = [adm.hits[gid] for gid, kind, _, _ in self.groups if kind == "full_attention"]
        if not hits:
            return 0
        shown = min(hits) // self.align * self.align
        ext, _ = conn.get_num_new_matched_tokens(adm.request, shown)
        if not ext or shown + ext >= adm.request.num_tokens:
            return 0
        return shown + ext

    def _best_local_boundary(self, adm: Any, resume: int) -> int:
        """Deepest clean boundary the local cache offered beyond ``resume`` (0 if none)."""
        hits = adm.hits
        cap = adm.request.num_tokens - 1
        mamba: list[tuple[int, int]] = []
        for gid, kind, bs, _ in self.groups:
            if kind == "mamba":
                mamba.append((gid, bs))
            else:
                cap = min(cap, hits[gid])
        if cap <= resume:
            return 0
        if not mamba:
            return cap
        hashes = adm.request.block_hashes
        hbs = self.hash_block_size
        get = self.pool.get_cached_block
        own = self.kv.coordinator.get_blocks(adm.request.request_id)
        align = self.align
        best = 0
        b = resume + align
        while b <= cap:
            # The state ending at b is keyed by the fine hash at b (b is a hash-block boundary).
            if all(_clean_state(get(hashes[b // hbs - 1], (gid,)), own[gid], b // bs - 1) for gid, bs in mamba):
                best = b
            b += align
        return best


def _holds(block: Any, hashes: Any, index: int, group_id: int) -> bool:
    """``block`` is a real block cached under the request's hash ``index`` in ``group_id``
    (``hashes`` viewed at the group's block size)."""
    key = block.block_hash
    return not block.is_null and key is not None and key[1] == group_id and index < len(hashes) and key[0] == hashes[index]


def _clean_state(found: list | None, own_table: Any, index: int) -> bool:
    """A cached, untainted state that was there before this request cached its own."""
    if found is None:
        return False
    blk = found[0]
    if blk.taint is not None:
        return False
    return not (index < len(own_table) and own_table[index] is blk)


def make_truth_checker(kv_manager: KVCacheManager, connector: SchedulerConnector | None = None) -> TruthChecker:
    """The checker the engine passes to the scheduler as ``admission_checker``."""
    return TruthChecker(kv_manager, connector)
