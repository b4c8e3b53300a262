"""What a connector is given at build time, and the transfer contract it uses.

A connector is bound once, before the first step, with
``connector.bind(ctx)``. The :class:`ConnectorContext` carries:

* the cache layout the connector sees (one :class:`GroupLayout` per KV-cache
  group: kind, block size, bytes per block), plus the raw KV-cache config;
* the clock kind, ``"steps"`` or ``"time"``;
* a seeded ``numpy.random.Generator`` reserved for this connector;
* a :class:`TransferService` that makes :class:`Link` objects.

Transfer contract (implemented by ``sim.engine.transfer``; connectors only
see these protocols, never SimPy):

* ``link.submit(nbytes, on_done, slowdown=1.0)`` starts a transfer of
  ``nbytes`` and returns at once. ``on_done()`` is called exactly once, when
  the transfer completes, from inside the engine (never re-entrantly from
  ``submit``). Transfers submitted on one link complete in an order
  determined only by the simulation (deterministic), never by wall time.
* On the time clock a link has a bandwidth (bytes/s), a base latency paid by
  every transfer, and either processor sharing of the bandwidth among all
  transfers in flight or at most ``concurrency`` transfers in flight (the
  rest wait FIFO); ``slowdown`` multiplies the transfer's effective size.
* On the step clock a link completes a transfer ``steps`` engine steps after
  the step in which it was submitted (``ceil(steps * slowdown)``): the
  callback fires when the engine advances the service at the start of that
  step, before it calls ``connector.get_finished()``. ``steps = 1`` is
  vLLM's best case: a load started in step k is reported finished to the
  scheduler before step k+1's ``schedule()``.

The engine, once per step and before ``schedule()``, advances the transfer
service (step clock; on the time clock SimPy has already run the callbacks up
to ``now``), then calls ``connector.get_finished() -> (finished_recving,
finished_sending)`` and ``connector.get_block_ids_with_load_errors()``, as
vLLM's worker reports them in a ``KVConnectorOutput``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Protocol, Sequence

import numpy as np

from sim.core.interfaces import SchedulerConnector
from sim.core.kv.specs import GroupKind, KVCacheConfig, SlidingWindowSpec

ClockKind = Literal["steps", "time"]
GROUP_KINDS: tuple[str, ...] = ("full_attention", "sliding_window", "mamba")


@dataclass(frozen=True, slots=True)
class LinkSpec:
    """Parameters of one transfer link.

    ``bandwidth_bytes_per_s`` and ``latency_s`` apply on the time clock,
    ``steps`` on the step clock. ``concurrency=None`` shares the bandwidth
    equally among every transfer in flight (processor sharing); an integer
    admits at most that many transfers at once, sharing the bandwidth among
    them, and queues the rest first-in first-out.
    """

    bandwidth_bytes_per_s: float
    latency_s: float
    concurrency: int | None = None
    steps: int = 1

    def __post_init__(self) -> None:
        if not self.bandwidth_bytes_per_s > 0:
            raise ValueError(f"link bandwidth must be > 0 bytes/s, got {self.bandwidth_bytes_per_s}")
        if self.latency_s < 0:
            raise ValueError(f"link latency must be >= 0 s, got {self.latency_s}")
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError(f"link concurrency must be >= 1 or null, got {self.concurrency}")
        if self.steps < 0:
            raise ValueError(f"link steps must be >= 0, got {self.steps}")


@dataclass
class LinkStats:
    """Counters of one link (read by connector metrics)."""

    submitted: int = 0
    completed: int = 0
    bytes_moved: int = 0
    #: Sum over completed transfers of (completion - submission), in seconds
    #: on the time clock and in engine steps on the step clock.
    busy_time: float = 0.0


class Link(Protocol):
    """A transfer path (PCIe to a CPU tier, a network to a prefill node, …)."""

    stats: LinkStats

    def submit(self, nbytes: int, on_done: Callable[[], None], slowdown: float = 1.0) -> None: ...


class TransferService(Protocol):
    """Makes links; one service per run, owned by the engine."""

    clock: ClockKind

    def make_link(self, name: str, spec: LinkSpec) -> Link: ...


@dataclass(frozen=True, slots=True)
class GroupLayout:
    """One KV-cache group as a connector sees it.

    ``bytes_per_block`` is the page size of one block of the group summed over
    the group's layers (the bytes a transfer of one block moves). For a Mamba
    group one block holds one recurrent state.
    """

    index: int
    kind: GroupKind
    block_size: int
    bytes_per_block: int
    window: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in GROUP_KINDS:
            raise ValueError(f"group {self.index}: kind must be one of {GROUP_KINDS}, got {self.kind!r}")
        if self.block_size < 1 or self.bytes_per_block < 0:
            raise ValueError(f"group {self.index}: block_size must be >= 1 and bytes_per_block >= 0")


@dataclass
class ConnectorContext:
    """Everything a connector may use; bound once with ``connector.bind(ctx)``."""

    groups: tuple[GroupLayout, ...]
    clock: ClockKind
    rng: np.random.Generator
    transfers: TransferService
    #: The ``sim.core.kv.specs.KVCacheConfig`` (for connectors that need more).
    kv_cache_config: Any = None
    #: vLLM's scheduler block size: the LCM of the group block sizes.
    scheduler_block_size: int = field(default=0)
    #: Granularity of ``request.block_hashes``.
    hash_block_size: int = field(default=0)

    def __post_init__(self) -> None:
        if not self.groups:
            raise ValueError("a connector context needs at least one KV-cache group")
        if self.clock not in ("steps", "time"):
            raise ValueError(f"clock must be 'steps' or 'time', got {self.clock!r}")
        if not self.scheduler_block_size:
            self.scheduler_block_size = int(np.lcm.reduce([g.block_size for g in self.groups]))
        if not self.hash_block_size:
            self.hash_block_size = int(np.gcd.reduce([g.block_size for g in self.groups]))

    @property
    def num_groups(self) -> int:
        return len(self.groups)

    @property
    def has_mamba(self) -> bool:
        return any(g.kind == "mamba" for g in self.groups)

    def load_target_block_ids(
        self, block_ids: Sequence[Sequence[int]], num_local: int, num_external: int
    ) -> tuple[list[int], ...]:
        """GPU blocks, per group, that a load of tokens ``[num_local, num_local + num_external)`` writes.

        Attention groups: every block overlapping the range (as the
        OffloadingConnector's ``update_state_after_alloc`` computes its
        destination blocks from ``cdiv(num_cached_tokens, block_size)``);
        sliding-window groups only the blocks of the last window. Mamba groups:
        the one block holding the state at the boundary ``num_local +
        num_external`` (vLLM ships only the last state). Null blocks (id 0)
        are never targets.
        """
        end = num_local + num_external
        targets: list[list[int]] = []
        for g, ids in zip(self.groups, block_ids, strict=True):
            if num_external <= 0:
                targets.append([])
                continue
            hi = -(-end // g.block_size)
            if g.kind == "mamba":
                lo = hi - 1
            else:
                lo = num_local // g.block_size
                if g.kind == "sliding_window" and g.window is not None:
                    lo = max(lo, hi - (-(-(g.window - 1) // g.block_size)) - 1)
            targets.append([b for b in list(ids[lo:hi]) if b != 0])
        return tuple(targets)


def block_table(blocks: Any) -> tuple[Sequence[Any], ...]:
    """Per-group block objects of a ``KVCacheBlocks`` (its ``blocks`` field) or of a plain tuple of lists.

    Each block has ``block_id``, ``block_hash`` (``None`` if not cached) and ``is_null``.
    """
    return tuple(getattr(blocks, "blocks", blocks))


def group_layouts_from_kv_cache_config(kv_cache_config: KVCacheConfig) -> tuple[GroupLayout, ...]:
    """The connector view of a :class:`sim.core.kv.specs.KVCacheConfig`.

    A group's ``bytes_per_block`` is its spec's ``page_size_bytes`` times the
    number of layers in the group (what one block id holds across the group's
    layers). A config built from explicit groups has no byte sizes; its groups
    get 0 bytes per block, so transfers then cost only their latency.
    """
    layouts = []
    for i, group in enumerate(kv_cache_config.groups):
        spec = group.spec
        page = spec.page_size_bytes or 0
        layouts.append(
            GroupLayout(
                index=i,
                kind=spec.kind,
                block_size=spec.block_size,
                bytes_per_block=page * max(1, len(group.layer_ids)),
                window=spec.window if isinstance(spec, SlidingWindowSpec) else None,
            )
        )
    return tuple(layouts)


def context_from_kv_cache_config(
    kv_cache_config: Any, clock: ClockKind, rng: np.random.Generator, transfers: TransferService
) -> ConnectorContext:
    """Build the context the engine binds a connector with."""
    return ConnectorContext(
        groups=group_layouts_from_kv_cache_config(kv_cache_config),
        clock=clock,
        rng=rng,
        transfers=transfers,
        kv_cache_config=kv_cache_config,
        scheduler_block_size=kv_cache_config.scheduler_block_size,
        hash_block_size=kv_cache_config.hash_block_size,
    )


def check_connector_compatible(connector: SchedulerConnector, kv_cache_config: Any) -> None:
    """Refuse, at build time, a connector without HMA support on a multi-group model.

    vLLM's ``KVConnectorFactory.create_connector`` raises when the hybrid KV
    cache manager (HMA) is enabled and the connector class is not
    ``SupportsHMA``; disabling HMA is no way out for a model with Mamba layers
    (it needs HMA) and, for one with sliding-window layers, changes the cache
    layout to a single group, which is not the model this scenario describes.
    """
    num_groups = len(kv_cache_config.groups)
    if num_groups > 1 and not connector.supports_hma:
        cls = type(connector).__name__
        raise ValueError(
            f"connector {connector.name!r}: Connector {cls} does not support HMA but "
            f"HMA is enabled. Please set `--disable-hybrid-kv-cache-manager`. "
            f"(vLLM KVConnectorFactory.create_connector; this model has {num_groups} KV-cache groups, "
            f"so the hybrid KV cache manager cannot be disabled: use a connector with supports_hma = True)"
        )
