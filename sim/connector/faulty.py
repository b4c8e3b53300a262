"""The ``faulty`` connector: fault injection around any other connector.

``connector: {type: faulty, wraps: {type: offload, capacity_gb: 64}, load_failure_prob: 0.1}``
(``inner`` is accepted as a synonym of ``wraps``). Every hook is delegated to
the wrapped connector; faults are decided per *load* (an
``update_state_after_alloc`` with external tokens) by probability, drawn from
the run's seeded generator in admission order, or by request id:

* ``load_failure_prob`` / ``fail_loads: [ids]``: every block the load writes
  is reported through :meth:`get_block_ids_with_load_errors` when the load
  completes (vLLM's worker reports ``invalid_block_ids``; the scheduler evicts
  them and recomputes from the first bad block);
* ``partial_load_prob`` (with ``partial_fraction``, default 0.5) /
  ``partial_loads: {id: fraction}``: the first ``fraction`` of the attention
  blocks arrive; the rest of them and the Mamba state at the boundary are
  reported;
* ``mamba_drop_prob`` / ``drop_mamba: [ids]``: only the Mamba state block(s)
  are reported (the attention KV arrived);
* ``slow_prob`` (with ``slowdown``, default 10) / ``slow: {id: factor}``: the
  request's transfers take ``factor`` times as long (time clock) or
  ``ceil(steps * factor)`` steps.

The load itself still completes (the request is reported in
``finished_recving``), as vLLM reports a failed recv as finished together with
its invalid blocks. At most one fault of the first three kinds applies to a
load, checked in the order listed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from sim.connector.base import KVConnector
from sim.connector.context import ConnectorContext, LinkSpec, block_table
from sim.core.interfaces import KVTransferParams
from sim.core.kv.block_pool import KVEvent
from sim.core.kv.kv_cache_manager import KVCacheBlocks
from sim.core.request import Request


def _prob(key: str, value: Any) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value <= 1:
        raise ValueError(f"{key}: expected a probability in [0, 1], got {value!r}")
    return float(value)


#: The options of ``faulty`` that decide faults (everything but ``wraps`` / ``inner``).
FAULT_OPTIONS = (
    "load_failure_prob",
    "partial_load_prob",
    "partial_fraction",
    "mamba_drop_prob",
    "slow_prob",
    "slowdown",
    "fail_loads",
    "partial_loads",
    "drop_mamba",
    "slow",
)
_PROBABILITIES = ("load_failure_prob", "partial_load_prob", "partial_fraction", "mamba_drop_prob", "slow_prob")


def _factor(key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 1:
        raise ValueError(f"{key}: expected a factor >= 1, got {value!r}")
    return float(value)


def _ids(where: str, key: str, faults: Mapping[str, Any]) -> set[str]:
    value = faults.get(key, ())
    if (
        isinstance(value, str)
        or not isinstance(value, (list, tuple, set))
        or not all(isinstance(v, str) for v in value)
    ):
        raise ValueError(f"{where}.{key}: expected a list of request ids, got {value!r}")
    return set(value)


def _mapping(where: str, key: str, faults: Mapping[str, Any]) -> list[tuple[str, Any]]:
    value = faults.get(key) or {}
    if not isinstance(value, Mapping):
        raise ValueError(f"{where}.{key}: expected a mapping of request id to a number, got {value!r}")
    return list(value.items())


@dataclass(frozen=True)
class FaultUpdate:
    """Checked fault options: ``scalars`` (probabilities, ``slowdown``) and the per-request additions."""

    scalars: dict[str, float]
    fail_loads: set[str]
    drop_mamba: set[str]
    partial_loads: dict[str, float]
    slow: dict[str, float]


def parse_faults(faults: Mapping[str, Any], where: str) -> FaultUpdate:
    """Check fault options (keys of :data:`FAULT_OPTIONS`); a bad one raises ValueError naming ``where.key``."""
    unknown = sorted(set(faults) - set(FAULT_OPTIONS))
    if unknown:
        raise ValueError(f"{where}.{unknown[0]}: not a fault option of 'faulty' (valid: {', '.join(FAULT_OPTIONS)})")
    scalars = {k: _prob(f"{where}.{k}", faults[k]) for k in _PROBABILITIES if k in faults}
    if "slowdown" in faults:
        scalars["slowdown"] = _factor(f"{where}.slowdown", faults["slowdown"])
    return FaultUpdate(
        scalars=scalars,
        fail_loads=_ids(where, "fail_loads", faults),
        drop_mamba=_ids(where, "drop_mamba", faults),
        partial_loads={k: _prob(f"{where}.partial_loads.{k}", v) for k, v in _mapping(where, "partial_loads", faults)},
        slow={k: _factor(f"{where}.slow.{k}", v) for k, v in _mapping(where, "slow", faults)},
    )


class _SlowedLink:
    """A link whose transfers are slowed by the factor the wrapper has set for the current hook."""

    def __init__(self, link: Any, factor: Callable[[], float]) -> None:
        self._link = link
        self._factor = factor
        self.stats = link.stats

    def submit(self, nbytes: int, on_done: Callable[[], None], slowdown: float = 1.0) -> None:
        self._link.submit(nbytes, on_done, slowdown * self._factor())


class _SlowedTransfers:
    def __init__(self, service: Any, factor: Callable[[], float]) -> None:
        self._service = service
        self._factor = factor
        self.clock = service.clock

    def make_link(self, name: str, spec: LinkSpec) -> _SlowedLink:
        return _SlowedLink(self._service.make_link(name, spec), self._factor)


@dataclass
class _PlannedFault:
    kind: str
    block_ids: set[int]


class FaultyConnector(KVConnector):
    name = "faulty"

    #: The fault options in force (set from the constructor, changed by ``connector_fault`` actions).
    load_failure_prob: float
    partial_load_prob: float
    partial_fraction: float
    mamba_drop_prob: float
    slow_prob: float
    slowdown: float

    def __init__(
        self,
        wraps: Mapping[str, Any] | KVConnector | None = None,
        inner: Mapping[str, Any] | KVConnector | None = None,
        load_failure_prob: float = 0.0,
        partial_load_prob: float = 0.0,
        partial_fraction: float = 0.5,
        mamba_drop_prob: float = 0.0,
        slow_prob: float = 0.0,
        slowdown: float = 10.0,
        fail_loads: Sequence[str] = (),
        partial_loads: Mapping[str, float] | None = None,
        drop_mamba: Sequence[str] = (),
        slow: Mapping[str, float] | None = None,
    ) -> None:
        if (wraps is None) == (inner is None):
            raise ValueError("connector: faulty needs exactly one of 'wraps' or 'inner' (the connector it wraps)")
        spec = wraps if wraps is not None else inner
        assert spec is not None  # exactly one was given (checked above)
        self.inner = spec if isinstance(spec, KVConnector) else _build_inner(spec)
        self.fail_loads: set[str] = set()
        self.partial_loads: dict[str, float] = {}
        self.drop_mamba: set[str] = set()
        self.slow: dict[str, float] = {}
        self._set_faults(
            dict(
                load_failure_prob=load_failure_prob,
                partial_load_prob=partial_load_prob,
                partial_fraction=partial_fraction,
                mamba_drop_prob=mamba_drop_prob,
                slow_prob=slow_prob,
                slowdown=slowdown,
                fail_loads=fail_loads,
                partial_loads=partial_loads,
                drop_mamba=drop_mamba,
                slow=slow,
            ),
            "connector",
        )
        self.supports_hma = self.inner.supports_hma
        self.supports_divergent_local_hybrid_hits = self.inner.supports_divergent_local_hybrid_hits
        self.supplies_mamba_state = self.inner.supplies_mamba_state
        self.pulls_unhashed_blocks = self.inner.pulls_unhashed_blocks
        self._factor = 1.0
        self._slow_factor: dict[str, float] = {}
        #: Requests whose slow factor is decided (at arrival: :meth:`route_arrival`, or :meth:`on_new_request`).
        self._arrived: set[str] = set()
        self._last_local: dict[str, int] = {}
        self._planned: dict[str, _PlannedFault] = {}
        self._errors: set[int] = set()
        self.counters: dict[str, int] = {
            "loads_seen": 0,
            "failed_loads": 0,
            "partial_loads": 0,
            "mamba_drops": 0,
            "slow_requests": 0,
            "error_blocks": 0,
        }

    # ------------------------------------------------------------------ fault options
    def _set_faults(self, faults: Mapping[str, Any], where: str) -> None:
        """Apply fault options: probabilities and factors replace the current ones, request-id lists and
        maps are added to. Every value is checked (:func:`parse_faults`) before any is changed."""
        update = parse_faults(faults, where)
        for key, value in update.scalars.items():
            setattr(self, key, value)
        self.fail_loads |= update.fail_loads
        self.drop_mamba |= update.drop_mamba
        self.partial_loads.update(update.partial_loads)
        self.slow.update(update.slow)

    def check_fault(self, options: Mapping[str, Any]) -> None:
        """Raise ValueError (naming the key and the valid ones) if ``options`` cannot be injected."""
        parse_faults(options, "connector_fault")

    def inject_fault(self, options: Mapping[str, Any]) -> None:
        """A ``connector_fault`` action: change the fault options from now on (see :meth:`_set_faults`).

        A load already under way keeps the fault planned when it started; a
        slow factor is fixed when a request arrives, so it applies to requests
        that arrive afterwards."""
        self._set_faults(options, "connector_fault")

    # ------------------------------------------------------------------ plumbing
    def bind(self, ctx: ConnectorContext) -> None:
        super().bind(ctx)
        inner_ctx = ConnectorContext(
            groups=ctx.groups,
            clock=ctx.clock,
            rng=ctx.rng,
            transfers=_SlowedTransfers(ctx.transfers, lambda: self._factor),
            kv_cache_config=ctx.kv_cache_config,
            scheduler_block_size=ctx.scheduler_block_size,
            hash_block_size=ctx.hash_block_size,
        )
        self.inner.bind(inner_ctx)

    def _call(self, request_id: str | None, fn: Callable[..., Any], *args: Any) -> Any:
        """Run an inner hook with the request's slowdown applied to the transfers it submits."""
        self._factor = self._slow_factor.get(request_id, 1.0) if request_id else 1.0
        try:
            return fn(*args)
        finally:
            self._factor = 1.0

    def _decide_slowdown(self, request: Request) -> None:
        """Fix the request's slow factor once, when it arrives (one draw per request, in arrival order)."""
        rid = request.request_id
        if rid in self._arrived:
            return
        self._arrived.add(rid)
        if rid in self.slow:
            self._slow_factor[rid] = float(self.slow[rid])
        elif self.slow_prob and self.ctx.rng.random() < self.slow_prob:
            self._slow_factor[rid] = self.slowdown
        if rid in self._slow_factor:
            self.counters["slow_requests"] += 1

    def route_arrival(self, request: Request, hand_over: Callable[[Request], None]) -> bool:
        self._decide_slowdown(request)
        routed: bool = self._call(request.request_id, self.inner.route_arrival, request, hand_over)
        return routed

    def on_new_request(self, request: Request) -> None:
        self._decide_slowdown(request)
        self._call(request.request_id, self.inner.on_new_request, request)

    def may_load_async(self, request: Request) -> bool:
        return self.inner.may_load_async(request)

    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> tuple[int | None, bool]:
        self._last_local[request.request_id] = num_computed_tokens
        return self.inner.get_num_new_matched_tokens(request, num_computed_tokens)

    def peek_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> int | None:
        """The wrapped connector's answer (faults are drawn at load time, not here)."""
        return self.inner.peek_num_new_matched_tokens(request, num_computed_tokens)

    # ------------------------------------------------------------------ faults
    def _plan(self, request: Request, blocks: Any, num_external_tokens: int) -> _PlannedFault | None:
        rid = request.request_id
        rng = self.ctx.rng
        # One draw per kind per load, always, so a probability change never shifts later draws.
        draws = (
            rng.random(3) if (self.load_failure_prob or self.partial_load_prob or self.mamba_drop_prob) else (1, 1, 1)
        )
        local = self._last_local.get(rid, 0)
        ids = tuple([b.block_id for b in group] for group in block_table(blocks))
        targets = self.ctx.load_target_block_ids(ids, local, num_external_tokens)
        attn = [(g, t) for g, t in zip(self.ctx.groups, targets) if g.kind != "mamba"]
        mamba = {b for g, t in zip(self.ctx.groups, targets) if g.kind == "mamba" for b in t}
        if rid in self.fail_loads or draws[0] < self.load_failure_prob:
            return _PlannedFault("failed_loads", {b for t in targets for b in t})
        if rid in self.partial_loads or draws[1] < self.partial_load_prob:
            fraction = self.partial_loads.get(rid, self.partial_fraction)
            lost = {b for _, t in attn for b in t[int(len(t) * fraction) :]}
            return _PlannedFault("partial_loads", lost | mamba)
        if rid in self.drop_mamba or draws[2] < self.mamba_drop_prob:
            return _PlannedFault("mamba_drops", mamba)
        return None

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int) -> None:
        rid = request.request_id
        if num_external_tokens > 0:
            self.counters["loads_seen"] += 1
            fault = self._plan(request, blocks, num_external_tokens)
            if fault is not None and fault.block_ids:
                self._planned[rid] = fault
                self.counters[fault.kind] += 1
        self._call(rid, self.inner.update_state_after_alloc, request, blocks, num_external_tokens)

    def get_finished(self) -> tuple[set[str], set[str]]:
        recving, sending = self._call(None, self.inner.get_finished)
        for rid in sorted(recving):
            fault = self._planned.pop(rid, None)
            if fault is not None:
                self._errors |= fault.block_ids
                self.counters["error_blocks"] += len(fault.block_ids)
        return recving, sending

    def get_block_ids_with_load_errors(self) -> set[int]:
        errors = self._errors | self.inner.get_block_ids_with_load_errors()
        self._errors = set()
        return errors

    # ------------------------------------------------------------------ delegation
    def request_finished_all_groups(
        self, request: Request, block_ids: tuple[list[int], ...]
    ) -> tuple[bool, KVTransferParams | None]:
        rid = request.request_id
        result = self._call(rid, self.inner.request_finished_all_groups, request, block_ids)
        self._slow_factor.pop(rid, None)
        self._last_local.pop(rid, None)
        return result

    def request_finished(self, request: Request, block_ids: list[int]) -> tuple[bool, KVTransferParams | None]:
        return self._call(request.request_id, self.inner.request_finished, request, block_ids)

    def has_pending_block_frees(self) -> bool:
        return self.inner.has_pending_block_frees()

    def has_step_counted_loads(self) -> bool:
        return self.inner.has_step_counted_loads()

    def take_events(self) -> list[KVEvent]:
        return self.inner.take_events()

    def metrics(self) -> dict[str, Any]:
        out = dict(self.inner.metrics())
        out.update({f"fault_{k}": v for k, v in self.counters.items()})
        return out

    def step_columns(self) -> dict[str, float | int]:
        return dict(self.inner.step_columns())


def _build_inner(spec: Mapping[str, Any]) -> KVConnector:
    if not isinstance(spec, Mapping) or "type" not in spec:
        raise ValueError(f"connector.wraps: expected a connector mapping with a 'type', got {spec!r}")
    from sim.connector import create_connector

    options = dict(spec)
    return create_connector(options.pop("type"), **options)
