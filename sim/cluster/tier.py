"""The shared KV tier of a cluster (``cluster.tier``, docs/cluster.md): one store every instance uses.

Model: LMCache with a shared storage backend (or any KV store several vLLM engines write to and read
from), seen through each instance's offload connector (:mod:`sim.connector.offload`: vLLM's
OffloadingConnector hit, store and load rules). The connector's own tier and PCIe link are replaced by
:class:`SharedTier` (the one store) and the store's links (:class:`InstancePort`):

* **Objects.** An object is ``(group, chunk-end block hash)``, as the offload connector keys it: a
  full-attention or sliding-window chunk holds the chunk's KV (``chunk_tokens / block_size`` blocks of
  the group), a Mamba object holds the one recurrent state at the chunk's end (one block of the group).
  Their sizes are the groups' page sizes summed over the group's layers.
* **Eviction.** Least recently used object first (a store or a load touches an object), over one byte
  budget (``group_capacity: shared``) or one budget per group; an object being loaded is pinned. FA
  chunks and Mamba states are evicted independently, so the tier itself can hold a prefix's FA chunks
  and not the Mamba state at their end (its divergence).
* **Links.** On the time clock the store has one read link (loads) and one write link (stores), each
  with its bandwidth and latency, shared by every instance's transfers in flight (processor sharing, or
  ``concurrency`` at a time). On the step clock each instance's transfer takes ``transfer_steps`` of that
  instance's steps (the step clock has no bandwidth).

Invariants: an object a store completed is visible to every instance's next lookup; every change of the
store is one :class:`TierEvent` in the order it happened (an eviction is charged to the instance whose
store caused it); the bytes the store holds equal the stored rows' bytes minus the removed rows' bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import simpy

from sim.config.cluster import TierSection
from sim.connector.context import Link, LinkSpec, TransferService
from sim.connector.offload import GB, LookupRecord, OffloadTier
from sim.core.kv.specs import KVCacheConfig
from sim.engine.transfer import SimPyTransferService, TransferLink

#: ``tier_events.kind`` values.
TIER_EVENT_KINDS = ("stored", "removed", "loaded")


@dataclass(frozen=True, slots=True)
class TierEvent:
    """One change of the store, or one object read from it."""

    time: float
    instance: int
    kind: str
    group: int
    key: int
    nbytes: int
    request_id: str
    cause: str


@dataclass
class KindHits:
    """Per group kind, over admissions that looked the tier up: tokens the kind's objects alone could supply."""

    hit_tokens: int = 0


def check_tier(spec: TierSection, config: KVCacheConfig) -> None:
    """Raise ValueError naming the ``cluster.tier`` key that cannot fit the model's cache layout."""
    groups = config.groups
    if not isinstance(spec.group_capacity, str):
        shares = spec.group_capacity
        if len(shares) != len(groups):
            raise ValueError(
                f"cluster.tier.group_capacity: {len(shares)} fractions given for {len(groups)} KV-cache groups "
                "(one per group, or 'shared')"
            )
        if sum(shares) > 1 + 1e-9:
            raise ValueError(f"cluster.tier.group_capacity: the fractions sum to {sum(shares):g} (at most 1)")
    chunk = spec.chunk_tokens
    if chunk is not None and chunk % config.scheduler_block_size:
        raise ValueError(
            f"cluster.tier.chunk_tokens: {chunk} is not a multiple of the scheduler block size "
            f"{config.scheduler_block_size}"
        )


class SharedTier(OffloadTier):
    """The cluster's one store; see the module docstring."""

    def __init__(
        self,
        spec: TierSection,
        group_kinds: Sequence[str],
        now: Callable[[], float],
    ) -> None:
        shares = None if isinstance(spec.group_capacity, str) else list(spec.group_capacity)
        super().__init__(len(group_kinds), int(spec.capacity_gb * GB), shares)
        self.spec = spec
        #: Tokens per object, set from the first instance's connector once it is bound.
        self.chunk_tokens = 0
        self.group_kinds = list(group_kinds)
        self.now = now
        self.log_rows: list[TierEvent] = []
        #: Admissions that looked the tier up, tokens they could have taken (``bound - local``), and took.
        self.admissions = 0
        self.lookup_tokens = 0
        self.usable_hit_tokens = 0
        #: Admissions where the FA objects alone went at least one chunk deeper than the usable hit.
        self.diverged_admissions = 0
        self.kind_hits = {kind: KindHits() for kind in dict.fromkeys(group_kinds)}
        self._read: TransferLink | None = None
        self._write: TransferLink | None = None

    # ------------------------------------------------------------------ what the connector calls
    def log(self, kind: str, group: int, key: int, nbytes: int, request_id: str, cause: str, source: int) -> None:
        self.log_rows.append(TierEvent(self.now(), source, kind, group, key, nbytes, request_id, cause))

    def loaded(self, keys: Sequence[tuple[int, int]], request_id: str, source: int = -1) -> None:
        for group, key in keys:
            entry = self.lru[group].get(key)
            nbytes = entry.nbytes if entry is not None else 0
            self.log_rows.append(TierEvent(self.now(), source, "loaded", group, key, nbytes, request_id, "load"))

    def admitted(self, record: LookupRecord, source: int = -1) -> None:
        """Count one admission's lookup: per kind, the shallowest end over the kind's groups."""
        if record.bound <= record.local:
            return
        self.admissions += 1
        self.lookup_tokens += record.bound - record.local
        used = max(0, record.end - record.local) if record.end else 0
        self.usable_hit_tokens += used
        ends: dict[str, int] = {}
        for kind, end in zip(self.group_kinds, record.group_ends):
            ends[kind] = min(ends.get(kind, end), end)
        for kind, end in ends.items():
            self.kind_hits[kind].hit_tokens += max(0, end - record.local)
        fa_end = ends.get("full_attention", 0)
        chunk = self.chunk_tokens
        if chunk and fa_end - record.local >= chunk and fa_end - record.local >= used + chunk:
            self.diverged_admissions += 1

    # ------------------------------------------------------------------ setup
    def links(self, transfers: TransferService, name: str, source: int) -> tuple[Link, Link]:
        """Instance ``source``'s ``(load, store)`` links (see the module docstring)."""
        spec = self.spec
        if isinstance(transfers, SimPyTransferService):
            if self._read is None or self._write is None:
                env: simpy.Environment = transfers.env
                lat = spec.latency_us * 1e-6
                self._read = TransferLink(env, LinkSpec(spec.read_gbps * GB, lat, spec.concurrency), "tier.read")
                self._write = TransferLink(env, LinkSpec(spec.write_gbps * GB, lat, spec.concurrency), "tier.write")
            return transfers.attach(f"{name}.tier.read", self._read), transfers.attach(
                f"{name}.tier.write", self._write
            )
        steps = LinkSpec(1.0, 0.0, None, spec.transfer_steps)
        return transfers.make_link(f"{name}.tier.read", steps), transfers.make_link(f"{name}.tier.write", steps)

    def summary(self) -> dict[str, Any]:
        """``summary.json``'s ``tier`` section (docs/cluster.md): traffic, hit rates per group kind, evictions."""
        per_kind: dict[str, dict[str, Any]] = {}
        for kind in self.kind_hits:
            rows = [e for e in self.log_rows if self.group_kinds[e.group] == kind]
            per_kind[kind] = {
                "stored": sum(1 for e in rows if e.kind == "stored"),
                "evicted": sum(1 for e in rows if e.kind == "removed"),
                "loaded": sum(1 for e in rows if e.kind == "loaded"),
                "bytes_in": sum(e.nbytes for e in rows if e.kind == "stored"),
                "bytes_out": sum(e.nbytes for e in rows if e.kind == "loaded"),
                "bytes_held": sum(self.used[g] for g, k in enumerate(self.group_kinds) if k == kind),
                "hit_tokens": self.kind_hits[kind].hit_tokens,
                "hit_rate": _rate(self.kind_hits[kind].hit_tokens, self.lookup_tokens),
            }
        return {
            "capacity_bytes": self.capacity_bytes,
            "chunk_tokens": self.chunk_tokens,
            "store": self.spec.store,
            "eviction": self.spec.eviction,
            "bytes_in": sum(k["bytes_in"] for k in per_kind.values()),
            "bytes_out": sum(k["bytes_out"] for k in per_kind.values()),
            "bytes_held": sum(self.used),
            "evictions": sum(k["evicted"] for k in per_kind.values()),
            "admissions": self.admissions,
            "lookup_tokens": self.lookup_tokens,
            "usable_hit_tokens": self.usable_hit_tokens,
            "usable_hit_rate": _rate(self.usable_hit_tokens, self.lookup_tokens),
            "diverged_admissions": self.diverged_admissions,
            "groups": per_kind,
        }


def _rate(part: int, whole: int) -> float | None:
    return part / whole if whole else None


class InstancePort:
    """One instance's backend onto the cluster's :class:`SharedTier` (an offload connector's ``backend``)."""

    def __init__(self, tier: SharedTier, source: int) -> None:
        self.tier = tier
        self.source = source

    def storage(self, num_groups: int, capacity_bytes: int, shares: Sequence[float] | None) -> OffloadTier:
        assert num_groups == len(self.tier.lru), "every instance shares the cluster's cache layout"
        return self.tier

    def links(self, transfers: TransferService, name: str, spec: LinkSpec) -> tuple[Link, Link]:
        return self.tier.links(transfers, name, self.source)
