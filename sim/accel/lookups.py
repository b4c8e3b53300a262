"""Head-of-line lookups: a waiting request's prefix lookup reused while nothing it reads has changed.

Under load the same waiting request heads its queue step after step and every
attempt fails the same way (no aligned chunk in the budget left, or no
blocks): each one runs the per-group hits and the prefix policy's lookup
again, although the prefix cache entries they read did not change. The
lookup (``Scheduler._prefix_lookup``: ``find_per_group_hits`` and the
policy's ``lookup``) is a function of the request's block hashes, its token
count and hit limit, and the cache map's entries under those hashes; with no
connector every built-in policy takes vLLM's reconciled lookup, which reads
nothing else.

:class:`HeadOfLineLookups` keeps the result of a request's last lookup when
its attempt did not admit it, and hands it back at the next attempt while no
prefix-cache event (``stored``, ``removed``, ``cleared``) names one of the
request's hashes. Every change of the cache map emits such an event (the
pool's rule: :mod:`sim.core.kv.block_pool`), and the KV manager
(:class:`~sim.accel.quiet.QuietKVCacheManager`) shows every event to
:meth:`HeadOfLineLookups.forget_changed` before anyone takes it. The rest of
the attempt (sizing, allocation, the admissions row) runs as in the core.
``tests/test_fastpath_differential.py`` is the contract.
"""

from __future__ import annotations

from sim.core.kv.block_pool import KVEventLog
from sim.core.kv.hashing import BlockHash
from sim.core.policy.prefix import PrefixLookup
from sim.core.request import Request

#: What ``Scheduler._prefix_lookup`` returns: the per-group hits and the policy's lookup.
LookupResult = tuple[tuple[int, ...], PrefixLookup]


class HeadOfLineLookups:
    """Lookups of waiting requests that were not admitted, kept until an event names one of their hashes.

    Invariant: a kept result is what ``Scheduler._prefix_lookup`` would return
    now. It was computed after every earlier event had been shown to
    :meth:`forget_changed` (the scheduler syncs the manager's events first);
    an attempt that does not admit emits no event after its lookup (with no
    connector it ends in sizing, or in ``allocate_slots``'s full-sequence check
    before anything changes); every later event goes through
    :meth:`forget_changed`, which drops each kept result whose request has the
    event's hash (all of them on ``cleared``). A result is handed back once
    (:meth:`reuse` removes it), so it lives only between two attempts of a
    request that stayed waiting, whose hashes, length and hit limit do not
    change meanwhile.
    """

    def __init__(self) -> None:
        #: request id -> (its hashes, as a set, and its lookup).
        self._kept: dict[str, tuple[frozenset[BlockHash], LookupResult]] = {}
        #: Lookups handed back (tests count them).
        self.num_reused = 0

    def reuse(self, request: Request) -> LookupResult | None:
        """The kept result for ``request`` (handed back once), or None."""
        kept = self._kept.pop(request.request_id, None)
        if kept is None:
            return None
        self.num_reused += 1
        return kept[1]

    def keep(self, request: Request, result: LookupResult) -> None:
        """``request``'s attempt ended without admitting it: keep its lookup for the next attempt."""
        self._kept[request.request_id] = (frozenset(request.block_hashes), result)

    def forget(self, request_id: str) -> None:
        self._kept.pop(request_id, None)

    def forget_changed(self, log: KVEventLog) -> None:
        """Drop every kept lookup an event of ``log`` may have changed."""
        if not self._kept or not len(log):
            return
        if "cleared" in log.kind:
            self._kept.clear()
            return
        changed = log.block_hash
        stale = [rid for rid, (watched, _) in self._kept.items() if not watched.isdisjoint(changed)]
        for rid in stale:
            del self._kept[rid]
