"""Scheduler side of a KV connector (vLLM ``KVConnectorBase_V1``).

A connector supplies *external* KV beyond the local prefix-cache hit. The
scheduler asks it, at every admission attempt that does a lookup, how many
tokens it can add (:meth:`KVConnector.get_num_new_matched_tokens`), tells it
which blocks were allocated (:meth:`KVConnector.update_state_after_alloc`), and
hands it the block table when the request finishes
(:meth:`KVConnector.request_finished_all_groups`).

Invariants (vLLM's contract, which the scheduler relies on):

* ``get_num_new_matched_tokens`` is free of side effects: it may be called
  again for the same request (a skipped or failed admission, a re-admission
  after preemption) and must answer from the current state only. ``None``
  means "not known yet, ask again next step". The second element (load
  asynchronously) must be ``False`` when the first is 0.
* ``update_state_after_alloc`` is called once per successful allocation; for an
  asynchronous load it is the moment the transfer starts.
* ``request_finished_all_groups`` is called exactly once per finished request,
  before its blocks are freed; returning ``True`` keeps the blocks until the
  engine reports the request in ``finished_sending``.

Simulation-side additions (vLLM's worker side, which we fold in here):
:meth:`KVConnector.bind` gives the connector its
:class:`~sim.connector.context.ConnectorContext` once, before the first step;
:meth:`KVConnector.get_finished` returns ``(finished_recving,
finished_sending)``, the transfers that completed since the last call; the
engine calls it once per step before ``schedule()`` and hands the result to
``Scheduler.update_from_kv_xfer_finished``.
"""

from __future__ import annotations

from typing import Any, Callable, ClassVar

from sim.connector.context import ConnectorContext
from sim.core.interfaces import KVTransferParams
from sim.core.kv.block_pool import KVEvent
from sim.core.kv.kv_cache_manager import KVCacheBlocks
from sim.core.request import Request


class KVConnector:
    """Base class of every connector; subclasses override the hooks they need.

    Capability flags mirror vLLM's: ``supports_hma`` (the connector implements
    ``request_finished_all_groups``; a model with more than one KV-cache group
    cannot run with a connector lacking it) and
    ``supports_divergent_local_hybrid_hits`` (vLLM 0.33's gate for
    ``get_computed_blocks_for_connector``; default ``False``).
    """

    #: Registry name of the connector type.
    name: ClassVar[str] = "base"

    supports_hma: bool = True
    supports_divergent_local_hybrid_hits: bool = False
    #: ``get_num_new_matched_tokens`` can be asked again with no side effect (the truth checker asks).
    side_effect_free_lookup: bool = False
    #: A non-zero answer ships the Mamba state at the resume boundary (vLLM's NIXL does).
    supplies_mamba_state: bool = True
    #: A load refills the request's unhashed blocks too (the NIXL-like ``remote`` pull).
    pulls_unhashed_blocks: bool = False

    _ctx: ConnectorContext | None = None

    @property
    def ctx(self) -> ConnectorContext:
        """The context given by :meth:`bind`; using a connector that was never bound is an error."""
        if self._ctx is None:
            raise RuntimeError(f"connector {self.name!r}: bind(ctx) must be called before it is used")
        return self._ctx

    @property
    def bound(self) -> bool:
        return self._ctx is not None

    def bind(self, ctx: ConnectorContext) -> None:
        """Receive the run's :class:`~sim.connector.context.ConnectorContext` (once, before step 0)."""
        self._ctx = ctx

    def route_arrival(self, request: Request, hand_over: Callable[[Request], None]) -> bool:
        """Simulation side (the proxy in front of the engine): ``request`` has arrived, and the scheduler has not
        seen it yet. Return True to keep it away from the scheduler until this connector calls
        ``hand_over(request)`` (a P/D proxy hands a request to the decode instance once its remote prefill is
        done, so vLLM's scheduler never sees it before); the default False hands it over at once."""
        return False

    def on_new_request(self, request: Request) -> None:
        """A request entered the scheduler."""

    def may_load_async(self, request: Request) -> bool:
        """vLLM 0.34: whether :meth:`get_num_new_matched_tokens` may answer ``load_async`` for this request
        (asked as it is queued, only with ``scheduler.max_num_inflight_kv_loads`` set; a yes lets its load start
        while the running batch is full, and a wrong yes holds other loads back). vLLM's base answer is the
        request's P/D ``do_remote_prefill`` flag, which only the ``remote`` connector's requests carry: no."""
        return False

    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> tuple[int | None, bool]:
        """External tokens available beyond ``num_computed_tokens`` (block-aligned local hit)."""
        raise NotImplementedError

    def peek_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> int | None:
        """What :meth:`get_num_new_matched_tokens` would answer now (its first element), with no
        side effect at all: no counters, no random draws, no remembered state. The truth checker
        asks it hypothetical questions (what would a load at another boundary have saved).
        ``None``: not answerable now (the real call would say "not ready"), or this connector
        cannot answer hypothetically (the default for third-party connectors that do not override it)."""
        return None

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int) -> None:
        """Blocks were allocated for ``request``; ``num_external_tokens`` > 0 means load them."""

    def served_elsewhere(self, request: Request) -> None:
        """Simulation side (``multi``, :mod:`sim.connector.multi`): another connector loads this admission of
        ``request``; this one's next ``update_state_after_alloc`` gets 0 external tokens for that reason, not
        because its own answer was 0 or refused (an offload connector on a shared tier then leaves the
        admission out of the tier's hit statistics)."""

    def request_finished_all_groups(
        self, request: Request, block_ids: tuple[list[int], ...]
    ) -> tuple[bool, KVTransferParams | None]:
        """The request finished; return ``(delay_free, kv_transfer_params)``."""
        return False, None

    def request_finished(self, request: Request, block_ids: list[int]) -> tuple[bool, KVTransferParams | None]:
        """Single-group variant, used only for connectors without HMA support."""
        return False, None

    def has_pending_block_frees(self) -> bool:
        """Whether pending transfers will release blocks (then the scheduler waits instead of preempting)."""
        return False

    def get_finished(self) -> tuple[set[str], set[str]]:
        """``(finished_recving, finished_sending)`` request ids since the last call."""
        return set(), set()

    def has_step_counted_loads(self) -> bool:
        """Loads are in flight whose completion this connector counts in engine steps
        (calls of :meth:`get_finished`), not through the transfer service. The engine
        then keeps stepping instead of sleeping, as vLLM's engine keeps stepping while a
        request waits for remote KV, until the load is reported in ``finished_recving``."""
        return False

    def get_block_ids_with_load_errors(self) -> set[int]:
        """GPU block ids whose load failed since the last call (none by default)."""
        return set()

    def take_events(self) -> list[KVEvent]:
        """KV events of the connector's own tier since the last call."""
        return []

    def metrics(self) -> dict[str, Any]:
        """Run-level connector metrics for ``summary.json`` (queries, hit tokens, bytes, failures)."""
        return {}

    def step_columns(self) -> dict[str, Any]:
        """Per-step values recorded as extension columns of the ``steps`` table (e.g. tier occupancy)."""
        return {}


class NoConnector(KVConnector):
    """The ``none`` connector: no external KV. The scheduler treats it as no connector at all."""

    name = "none"

    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> tuple[int | None, bool]:
        return 0, False

    def peek_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> int | None:
        return 0
