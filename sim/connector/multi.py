"""The ``multi`` connector: an ordered list of connectors acting as one (vLLM's ``MultiConnector``).

``connector: {type: multi, connectors: [{type: remote}, {type: offload, capacity_gb: 64}]}``. A cluster with
both a shared tier and prefill/decode roles gives its instances one (:mod:`sim.cluster.instances`), as an
llm-d deployment runs NIXL and LMCache together on one vLLM engine.

Rules (the scheduler-side behaviour of vLLM 0.33/0.34's ``MultiConnector``):

* **Lookup.** Every child is asked, in order. A child answering ``None`` (not ready) makes the whole answer
  ``None`` at once, and the children after it are not asked. Otherwise the *first* child with a non-zero
  count serves the request: its ``(count, load_async)`` is the answer, and it is remembered as the request's
  loader (a later lookup that finds a non-zero child again replaces it; one that finds none keeps it).
* **Allocation.** ``update_state_after_alloc`` goes to every child: the request's loader gets the external
  token count, every other child the same blocks with 0 (so a storing child still sees the request). When
  the loader loads something, the others are told first (:meth:`~sim.connector.base.KVConnector.served_elsewhere`,
  ours: vLLM's children cannot tell), so a shared tier's hit statistics leave out the admissions NIXL served.
* **Finish.** ``request_finished_all_groups`` goes to every child; the blocks are kept (``delay_free``) if
  any child keeps them, and freed only when *every* child that kept them has reported the request in
  ``finished_sending`` (vLLM's extra pending saves count). Transfer params of several children are merged; a
  key two children both set is an error, as in vLLM.
* **Everything else.** ``on_new_request``, ``get_finished`` (loads: union), load errors (union),
  ``take_events`` (concatenated) go to every child; ``has_pending_block_frees``, ``has_step_counted_loads``
  and vLLM 0.34's ``may_load_async`` are true if any child's is; ``supports_hma`` and
  ``supports_divergent_local_hybrid_hits`` only if every child's is. An arrival (the P/D proxy,
  :meth:`~sim.connector.base.KVConnector.route_arrival`) is offered to the children in order; the first
  that holds it keeps it.

What a load writes (``supplies_mamba_state``, ``pulls_unhashed_blocks``, read by the admission truth checker
right after the lookup that admits a request) is the serving child's: the composite answers for the child that
gave the last non-zero lookup answer.

Metrics: ``queries`` (its ``get_num_new_matched_tokens`` calls) and ``hit_tokens`` (the sum of its answers) are
the composite's own; ``loads``, ``bytes_loaded``, ``stores`` and ``bytes_stored`` are summed over the children
(each load is served by one child); every child's own metrics follow under ``<type>.`` (``remote.loads``,
``offload.tier_bytes``). Step columns are the children's, summed where two children report the same column
(``conn_loads_in_flight``).

Invariants: at most one child loads a request per admission; a request's blocks are freed once, after the
last delaying child let them go; with one child the composite decides exactly as that child alone.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence, TypeVar

from sim.connector.base import KVConnector
from sim.connector.context import ConnectorContext
from sim.core.interfaces import KVTransferParams
from sim.core.kv.block_pool import KVEvent
from sim.core.kv.kv_cache_manager import KVCacheBlocks
from sim.core.request import Request

#: Children's metrics summed into the composite's own keys.
_SUMMED_METRICS = ("loads", "bytes_loaded", "stores", "bytes_stored")

C = TypeVar("C", bound=KVConnector)


class MultiConnector(KVConnector):
    """Several connectors in order, with vLLM ``MultiConnector``'s rules (see the module docstring)."""

    name = "multi"

    def __init__(self, connectors: Sequence[Mapping[str, Any] | KVConnector] | None = None) -> None:
        if not isinstance(connectors, (list, tuple)) or not connectors:
            raise ValueError(
                f"connector.connectors: multi needs a non-empty list of connectors (each a mapping with a 'type'), "
                f"got {connectors!r}"
            )
        self.children: list[KVConnector] = [
            c if isinstance(c, KVConnector) else _build_child(c, i) for i, c in enumerate(connectors)
        ]
        names = [c.name for c in self.children]
        for i, child in enumerate(self.children):
            if child.name == self.name:
                raise ValueError(f"connector.connectors.{i}.type: 'multi' cannot be nested in multi")
            if names.index(child.name) != i:
                raise ValueError(
                    f"connector.connectors.{i}.type: {child.name!r} is listed twice (each connector type at most once)"
                )
        self.supports_hma = all(c.supports_hma for c in self.children)
        self.supports_divergent_local_hybrid_hits = all(c.supports_divergent_local_hybrid_hits for c in self.children)
        self.side_effect_free_lookup = all(c.side_effect_free_lookup for c in self.children)
        #: Per request: the index of the child that serves its load (vLLM ``_requests_to_connector``).
        self._loader: dict[str, int] = {}
        #: Per request: how many more children must report it in ``finished_sending`` before it is reported.
        self._extra_sends: dict[str, int] = {}
        #: The child of the last non-zero lookup answer (what the admission it leads to loads).
        self._serving = 0
        self.counters = {"queries": 0, "hit_tokens": 0}

    # ------------------------------------------------------------------ what a load writes
    @property
    def supplies_mamba_state(self) -> bool:  # type: ignore[override]
        return self.children[self._serving].supplies_mamba_state

    @property
    def pulls_unhashed_blocks(self) -> bool:  # type: ignore[override]
        return self.children[self._serving].pulls_unhashed_blocks

    def part(self, cls: type[C]) -> C | None:
        """The child of class ``cls`` (``None``: there is none)."""
        return next((c for c in self.children if isinstance(c, cls)), None)

    # ------------------------------------------------------------------ plumbing
    def bind(self, ctx: ConnectorContext) -> None:
        """Each child gets the run's context with a generator of its own (children of the composite's)."""
        super().bind(ctx)
        for child, rng in zip(self.children, ctx.rng.spawn(len(self.children))):
            child.bind(
                ConnectorContext(
                    groups=ctx.groups,
                    clock=ctx.clock,
                    rng=rng,
                    transfers=ctx.transfers,
                    kv_cache_config=ctx.kv_cache_config,
                    scheduler_block_size=ctx.scheduler_block_size,
                    hash_block_size=ctx.hash_block_size,
                )
            )

    def route_arrival(self, request: Request, hand_over: Callable[[Request], None]) -> bool:
        return any(child.route_arrival(request, hand_over) for child in self.children)

    def on_new_request(self, request: Request) -> None:
        for child in self.children:
            child.on_new_request(request)

    def may_load_async(self, request: Request) -> bool:
        return any(child.may_load_async(request) for child in self.children)

    # ------------------------------------------------------------------ lookup and allocation
    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> tuple[int | None, bool]:
        self.counters["queries"] += 1
        answer: tuple[int | None, bool] = (0, False)
        for i, child in enumerate(self.children):
            count, load_async = child.get_num_new_matched_tokens(request, num_computed_tokens)
            if count is None:
                return None, False
            if answer[0] == 0 and count > 0:
                self._loader[request.request_id] = i
                self._serving = i
                answer = (count, load_async)
        self.counters["hit_tokens"] += answer[0] or 0
        return answer

    def peek_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> int | None:
        """The first non-zero child's answer, ``None`` if a child before it (or any, when none is non-zero)
        cannot answer now."""
        for child in self.children:
            count = child.peek_num_new_matched_tokens(request, num_computed_tokens)
            if count is None:
                return None
            if count > 0:
                return count
        return 0

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int) -> None:
        loader = self._loader.get(request.request_id, -1)
        for i, child in enumerate(self.children):
            if i != loader and num_external_tokens > 0 and loader >= 0:
                child.served_elsewhere(request)
            child.update_state_after_alloc(request, blocks, num_external_tokens if i == loader else 0)

    # ------------------------------------------------------------------ finish
    def _finish(
        self, request: Request, call: Callable[[KVConnector], tuple[bool, KVTransferParams | None]]
    ) -> tuple[bool, KVTransferParams | None]:
        delays = 0
        params: dict[str, Any] | None = None
        for child in self.children:
            delay, child_params = call(child)
            delays += bool(delay)
            if child_params is None:
                continue
            if params is None:
                params = dict(child_params)
                continue
            clash = sorted(set(params) & set(child_params))
            if clash:
                raise RuntimeError(f"Key clash in kv_transfer_params from multiple connectors: {set(clash)}")
            params.update(child_params)
        if delays > 1:
            self._extra_sends[request.request_id] = delays - 1
        self._loader.pop(request.request_id, None)
        return delays > 0, params

    def request_finished_all_groups(
        self, request: Request, block_ids: tuple[list[int], ...]
    ) -> tuple[bool, KVTransferParams | None]:
        return self._finish(request, lambda c: c.request_finished_all_groups(request, block_ids))

    def request_finished(self, request: Request, block_ids: list[int]) -> tuple[bool, KVTransferParams | None]:
        return self._finish(request, lambda c: c.request_finished(request, block_ids))

    def get_finished(self) -> tuple[set[str], set[str]]:
        recving: set[str] = set()
        sending: set[str] = set()
        for child in self.children:
            got, sent = child.get_finished()
            recving |= got
            for rid in sorted(sent):
                extra = self._extra_sends.get(rid)
                if extra is None:
                    sending.add(rid)
                elif extra == 1:
                    del self._extra_sends[rid]
                else:
                    self._extra_sends[rid] = extra - 1
        return recving, sending

    def has_pending_block_frees(self) -> bool:
        return any(child.has_pending_block_frees() for child in self.children)

    def has_step_counted_loads(self) -> bool:
        return any(child.has_step_counted_loads() for child in self.children)

    def get_block_ids_with_load_errors(self) -> set[int]:
        errors: set[int] = set()
        for child in self.children:
            errors |= child.get_block_ids_with_load_errors()
        return errors

    def take_events(self) -> list[KVEvent]:
        return [event for child in self.children for event in child.take_events()]

    # ------------------------------------------------------------------ metrics
    def metrics(self) -> dict[str, Any]:
        per_child = [(child.name, child.metrics()) for child in self.children]
        out: dict[str, Any] = dict(self.counters)
        for key in _SUMMED_METRICS:
            values = [m[key] for _, m in per_child if key in m]
            if values:
                out[key] = sum(values)
        for name, m in per_child:
            out.update({f"{name}.{key}": value for key, value in m.items()})
        return out

    def step_columns(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for child in self.children:
            for key, value in child.step_columns().items():
                out[key] = out[key] + value if key in out else value
        return out


def _build_child(spec: Any, index: int) -> KVConnector:
    where = f"connector.connectors.{index}"
    if not isinstance(spec, Mapping) or "type" not in spec:
        raise ValueError(f"{where}: expected a connector mapping with a 'type', got {spec!r}")
    from sim.connector import create_connector

    options = dict(spec)
    kind = options.pop("type")
    try:
        return create_connector(kind, **options)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None


def connector_part(connector: Any, cls: type[C]) -> C | None:
    """``connector`` itself if it is a ``cls``, else its child of class ``cls`` when it is a composite."""
    if isinstance(connector, cls):
        return connector
    if isinstance(connector, MultiConnector):
        return connector.part(cls)
    return None
