"""One waiting request's admission attempt, as a record the scheduler fills phase by phase.

The scheduler's waiting phase runs each attempt through the same phases, in
order, and every phase only adds to the record:

1. **begin**: the kind (``first``, ``after_preemption``, ``after_async_load``)
   and where the lookup stands in ``kv_events`` (``lookup_seq``);
2. **lookup**: the per-group ``hits`` and the prefix policy's ``lookup``, which
   set ``blocks`` and ``local``;
3. **connector**: ``ext`` and ``load_async`` from the connector, the asked
   position and raw answer (``asked_at``, ``answer``), and the #48425
   ``fallback`` when a diverged hit is not backed by external tokens;
4. **size**: ``num_new_tokens`` (budget, long-prefill threshold, Mamba split);
5. **allocate** and **verdict**: the truth checker's ``outcome``,
   ``tokens_lost`` and ``taint_origin``.

A phase that ends the attempt early sets ``end`` (and ``outcome`` /
``reason``); a crash sets ``outcome = "crash"`` and ``crash_reason``. The
record is written to the ``admissions`` table exactly once, when the attempt
ends, whatever the end. Invariant: ``computed == local + ext`` for a fresh
attempt, and the request's own ``num_computed_tokens`` after an async load.
"""

from __future__ import annotations

import enum
from typing import Callable

from sim.core.kv.kv_cache_manager import KVCacheBlocks
from sim.core.policy.prefix import PrefixLookup
from sim.core.request import Request


class AttemptEnd(enum.Enum):
    """How an attempt leaves the waiting phase."""

    #: Scheduled this step: the request runs.
    ADMITTED = "admitted"
    #: Stays queued; the phase goes on with the next waiting request (connector
    #: not ready, or parked on an async load).
    SKIPPED = "skipped"
    #: Admission stops for this step (head-of-line: no blocks, no aligned chunk).
    STOPPED = "stopped"
    #: vLLM 0.34: the request stays at the head of its queue, not allowed to go now (its async load is past
    #: ``max_num_inflight_kv_loads``, or it needs a running seat in loads-only mode). From ``waiting`` this
    #: stops admission like ``STOPPED``; from ``async_kv_waiting`` only that queue stops for the step.
    REFUSED = "refused"


class AdmissionAttempt:
    """Everything one admission attempt decided; see the module docstring for who sets what.

    A plain class with its own ``__init__``: one attempt is built per waiting-request visit.
    The keyword arguments are the fields, with the defaults shown.
    """

    __slots__ = (
        "request",
        "kind",
        "hits",
        "blocks",
        "lookup_seq",
        "lookup",
        "local",
        "ext",
        "load_async",
        "fallback",
        "asked_at",
        "answer",
        "computed",
        "num_new_tokens",
        "end",
        "outcome",
        "reason",
        "crash_reason",
        "tokens_lost",
        "taint_origin",
    )

    def __init__(
        self,
        request: Request,
        kind: str,
        hits: tuple[int, ...],
        blocks: KVCacheBlocks,
        lookup_seq: int = 0,
        lookup: PrefixLookup | None = None,
        local: int = 0,
        ext: int = 0,
        load_async: bool = False,
        fallback: bool = False,
        computed: int = 0,
    ) -> None:
        self.request = request
        self.kind = kind
        self.hits = hits
        self.blocks = blocks
        self.lookup_seq = lookup_seq
        self.lookup = lookup
        self.local = local
        self.ext = ext
        self.load_async = load_async
        self.fallback = fallback
        #: Block-aligned position the connector was last shown (-1: not asked).
        self.asked_at = -1
        #: The connector's last raw answer (-1: not answered, i.e. not ready).
        self.answer = -1
        self.computed = computed
        self.num_new_tokens = 0
        self.end: AttemptEnd | None = None
        self.outcome = ""
        self.reason = ""
        self.crash_reason = ""
        self.tokens_lost = 0
        self.taint_origin = ""

    @property
    def hit_diverged(self) -> bool:
        return self.lookup is not None and self.lookup.hit_diverged

    def stop(self, end: AttemptEnd, reason: str) -> None:
        """End the attempt without admitting: outcome ``not_admitted`` for ``reason``."""
        self.end, self.outcome, self.reason = end, "not_admitted", reason


#: Classifies a successful allocation: returns ``(outcome, tokens_lost, taint_origin)``. It reads the
#: attempt (request, kind, hits, lookup, blocks, local, ext, fallback, load_async) and never changes it.
AdmissionChecker = Callable[[AdmissionAttempt], tuple[str, int, str]]
