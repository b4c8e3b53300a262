"""The seams of the scheduler, as Protocols: its connector, its KV manager and its admission recorder.

Part of the core (pure, no clock): the scheduler is typed against these, not
against concrete classes of the edges. :class:`sim.core.kv.kv_cache_manager.KVCacheManager`
is the KV manager, :class:`sim.trace.recorder.Recorder` the recorder and every
:class:`sim.connector.base.KVConnector` a connector; a plug-in connector need
not subclass ``KVConnector`` but must have every member of
:class:`SchedulerConnector` (``sim.connector.protocol.Connector`` adds the
engine's side).

Capability flags are declared members, read directly (never probed with
``getattr``); ``KVConnector`` gives each its default.
"""

from __future__ import annotations

from typing import Protocol, Sequence, Sized, TypeAlias

from sim.core.kv.block_pool import KVEvent, KVEventLog
from sim.core.kv.kv_cache_coordinator import KVCacheCoordinator
from sim.core.kv.kv_cache_manager import KVCacheBlocks
from sim.core.kv.specs import KVCacheConfig
from sim.core.policy.prefix import PrefixCacheView
from sim.core.registry import OptionValue
from sim.core.request import Request

#: What a connector hands on when a request finishes (vLLM's ``kv_transfer_params``: a JSON-like mapping,
#: e.g. where the peer may pull the blocks from). The scheduler reads only the ``delay_free`` flag beside it.
KVTransferParams: TypeAlias = dict[str, OptionValue]


class SchedulerConnector(Protocol):
    """The scheduler side of a KV connector (vLLM ``KVConnectorBase_V1``); see :mod:`sim.connector.base`."""

    @property
    def name(self) -> str:
        """Registry name; ``none`` means no connector at all."""
        ...

    @property
    def supports_hma(self) -> bool:
        """Implements ``request_finished_all_groups`` (required with more than one KV-cache group)."""
        ...

    @property
    def supports_divergent_local_hybrid_hits(self) -> bool:
        """vLLM 0.33's gate for ``get_computed_blocks_for_connector`` (per-group hits shown to the connector)."""
        ...

    @property
    def side_effect_free_lookup(self) -> bool:
        """``get_num_new_matched_tokens`` may be asked again without changing anything (the truth checker asks)."""
        ...

    @property
    def supplies_mamba_state(self) -> bool:
        """A non-zero answer ships the Mamba state at the resume boundary too."""
        ...

    @property
    def pulls_unhashed_blocks(self) -> bool:
        """A load also refills the request's unhashed (partial) blocks (NIXL-like pull)."""
        ...

    def on_new_request(self, request: Request) -> None: ...

    def may_load_async(self, request: Request) -> bool:
        """vLLM 0.34: whether this request's load may be asynchronous (asked once, as it is queued, only with
        ``max_num_inflight_kv_loads`` set; a yes puts it in ``async_kv_waiting``)."""
        ...

    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> tuple[int | None, bool]: ...

    def peek_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> int | None:
        """What ``get_num_new_matched_tokens`` would answer now (its first element), with no side effect."""
        ...

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int) -> None: ...

    def request_finished_all_groups(
        self, request: Request, block_ids: tuple[list[int], ...]
    ) -> tuple[bool, KVTransferParams | None]: ...

    def request_finished(self, request: Request, block_ids: list[int]) -> tuple[bool, KVTransferParams | None]: ...

    def has_pending_block_frees(self) -> bool: ...

    def take_events(self) -> list[KVEvent]: ...


class SchedulerKVManager(PrefixCacheView, Protocol):
    """The KV-cache manager as the scheduler uses it (:class:`sim.core.kv.kv_cache_manager.KVCacheManager`);
    its lookups are what it hands a prefix policy (:class:`~sim.core.policy.prefix.PrefixCacheView`)."""

    kv_cache_config: KVCacheConfig
    coordinator: KVCacheCoordinator
    empty_kv_cache_blocks: KVCacheBlocks

    @property
    def num_pending_events(self) -> int:
        """Events emitted and not yet taken by :meth:`take_events`."""
        ...

    @property
    def usage(self) -> float:
        """The fraction of usable blocks not free (vLLM ``KVCacheManager.usage``)."""
        ...

    def get_computed_blocks(
        self, request: Request, max_cache_hit_length: int | None = None
    ) -> tuple[KVCacheBlocks, int, int]: ...

    def get_num_cached_tokens(self, request: Request) -> int: ...

    def find_per_group_hits(self, request: Request) -> tuple[int, ...]: ...

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
    ) -> KVCacheBlocks | None: ...

    def free(self, request: Request) -> None: ...

    def set_extra_state_positions(self, request: Request) -> None: ...

    def remove_skipped_blocks(
        self, request_id: str, processed_computed_tokens: int, num_prompt_tokens: int | None = None
    ) -> None: ...

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None: ...

    def new_step_starts(self) -> None: ...

    def get_blocks(self, request_id: str) -> KVCacheBlocks: ...

    def get_block_ids_for_computed_tokens(self, request_id: str, num_computed_tokens: int) -> tuple[list[int], ...]: ...

    def truncate_computed_blocks(self, blocks: KVCacheBlocks, num_computed_tokens: int) -> KVCacheBlocks: ...

    def take_event_log(self) -> KVEventLog: ...


class AdmissionRecorder(Protocol):
    """Where the scheduler reports admissions, schedule rows and KV events (:class:`sim.trace.recorder.Recorder`)."""

    #: Whether ``schedule`` rows are wanted (``outputs.schedule_table``).
    schedule_enabled: bool

    @property
    def kv_events(self) -> Sized:
        """The ``kv_events`` table so far (its length is the next event's ``seq``)."""
        ...

    def record_admission(
        self,
        *,
        request_id: str,
        prompt_tokens: int,
        hits: Sequence[int],
        local_tokens: int,
        external_tokens: int,
        hit_diverged: bool,
        fallback: bool,
        policy: str,
        outcome: str,
        crash_reason: str = "",
        kind: str = "first",
        reason: str = "",
        num_computed_tokens: int = 0,
        tokens_lost: int = 0,
        taint_origin: str = "",
        lookup_seq: int = 0,
        connector_asked_at: int = -1,
        connector_answer: int = -1,
    ) -> None: ...

    def record_schedule(
        self, request_id: str, kind: str, num_scheduled_tokens: int, num_computed_tokens: int, preempted: bool
    ) -> None: ...

    def record_schedule_rows(
        self,
        request_ids: Sequence[str],
        kinds: Sequence[str],
        num_scheduled_tokens: Sequence[int],
        num_computed_tokens: Sequence[int],
    ) -> None: ...

    def record_kv_event_log(self, log: KVEventLog) -> None: ...
