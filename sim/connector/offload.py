"""The ``offload`` connector: a CPU tier behind a PCIe-like link (vLLM's OffloadingConnector, LMCache).

The tier holds *chunks* of ``chunk_tokens`` tokens, keyed ``(chunk-end block
hash, group)`` as vLLM's ``make_offload_key`` keys them, so each group is
stored, found and evicted on its own. An attention chunk holds the chunk's KV
(``chunk_tokens / block_size`` blocks); a Mamba chunk entry holds the one
recurrent state *at the chunk's end* (one block).

Hit rule (follows ``OffloadingConnectorScheduler._lookup_complete_chunks`` in
vLLM 0.33, where a Mamba group is a sliding window of one chunk,
``get_sliding_window_size_in_chunks`` → 1):

* the hit may not exceed ``num_tokens``; with any non-full-attention group it
  may not exceed ``num_tokens - 1``, rounded down to ``chunk_tokens`` (vLLM
  ``max_hit_size_tokens -= 1`` and the Mamba-align round-down);
* full-attention groups: consecutive chunks present from chunk
  ``local // chunk_tokens`` on, the end of the run bounds the hit;
* sliding-window groups: the hit end ``E`` needs the chunks of the last window
  before ``E`` present;
* Mamba groups: the hit end ``E`` needs the state entry of chunk ``E/C - 1``;
  the largest such ``E`` within the bound is taken;
* groups tighten the bound in turn until it is stable; fewer than one chunk
  beyond ``local`` gives 0.

So for a hybrid the tier reports ``E - local`` where ``E`` is the deepest chunk
boundary at which every FA chunk from ``local`` to ``E`` AND the Mamba state at
``E`` are in the tier. Loads are always asynchronous (vLLM: ``load_async`` is
true for a non-zero hit unless a sync-load budget is configured; we model none).

Stores: ``store: on_compute`` (default, as vLLM 0.33's OffloadingConnector, whose
scheduler builds store jobs every step in ``build_connector_meta``) offers the
chunks each step completed (sampled once per step, in :meth:`get_finished`) and
a Mamba state only at a chunk boundary where a step ended. ``store: on_finish``
offers, when the request finishes, every
full chunk of its computed tokens for attention groups and, for Mamba groups,
the chunk-aligned states its block table still holds; the request's blocks stay
allocated (``delay_free``) until the store transfer completes and it is
reported in ``finished_sending``; for a hybrid model it stores few Mamba states
(only those the table still holds at finish). Keys already in the tier are
touched, not stored again (vLLM ``prepare_store``).

Tier eviction: every group has its own LRU list. ``group_capacity: shared``
(default) draws all groups from one byte budget and evicts the least recently
used entry of any group, which is vLLM's single ``LRUCachePolicy`` over
``(hash, group)`` keys. A list of fractions gives each group its own budget
(``capacity * fraction``) and its own eviction, an extension of ours. Entries
being loaded are pinned. Either way the tier can keep a prefix's FA chunks and
lose its Mamba state, or the reverse.

Differences from vLLM on purpose: no disk tier, no partial-tail (sub-chunk)
hits, no deferral while another request loads the same chunks, no sync loads.
A lookup for a request with a store still in flight answers ``None`` (vLLM
delays requests with in-flight transfer jobs the same way).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, Sequence

from sim.connector.base import KVConnector
from sim.connector.context import ConnectorContext, GroupLayout, Link, LinkSpec, TransferService, block_table
from sim.core.interfaces import KVTransferParams
from sim.core.kv.block_pool import KVEvent
from sim.core.kv.kv_cache_manager import KVCacheBlocks
from sim.core.request import Request

#: PCIe Gen5 x16: 64 GB/s raw per direction, ~50 GB/s effective for pinned-memory DMA.
DEFAULT_PCIE_GBPS = 50.0
#: Per-transfer launch and DMA setup latency of a host<->device copy.
DEFAULT_PCIE_LATENCY_US = 10.0
#: LMCache's default chunk size.
DEFAULT_CHUNK_TOKENS = 256
GB = 1e9


@dataclass(slots=True)
class _Entry:
    nbytes: int
    stamp: int
    pins: int = 0


@dataclass(frozen=True, slots=True)
class LookupRecord:
    """One answer of the tier for a request: computed tokens ``local``, the deepest end the request could
    take (``bound``, before the groups tighten it), each group's own end and the hit end (0: none)."""

    local: int
    bound: int
    group_ends: tuple[int, ...]
    end: int


@dataclass
class _ReqState:
    """What the connector tracks for one request between admission and the end of its stores."""

    request: Request
    #: Per group: chunks ``< stored_chunks[g]`` have been offered to the tier.
    stored_chunks: list[int] = field(default_factory=list)
    pending_stores: int = 0
    finished: bool = False
    loading: bool = False


class OffloadTier:
    """Per-group LRU lists over a byte budget; an entry is ``(group, chunk-end hash)``.

    Invariants: each group's ``OrderedDict`` is in increasing ``stamp`` order
    (least recently used first); ``used[g]`` is the bytes group ``g`` holds;
    a pinned entry (being loaded) is never evicted.
    """

    def __init__(self, num_groups: int, capacity_bytes: int, shares: Sequence[float] | None) -> None:
        self.capacity_bytes = capacity_bytes
        self.lru: list[OrderedDict[int, _Entry]] = [OrderedDict() for _ in range(num_groups)]
        self.used: list[int] = [0] * num_groups
        self.budget: list[int] | None = None if shares is None else [int(capacity_bytes * s) for s in shares]
        self.events: list[KVEvent] = []
        self.evictions: list[int] = [0] * num_groups
        self._clock = 0

    def _stamp(self) -> int:
        self._clock += 1
        return self._clock

    def contains(self, group: int, key: int) -> bool:
        return key in self.lru[group]

    def touch(self, group: int, key: int) -> None:
        entry = self.lru[group].get(key)
        if entry is not None:
            entry.stamp = self._stamp()
            self.lru[group].move_to_end(key)

    def pin(self, group: int, key: int, delta: int) -> None:
        entry = self.lru[group].get(key)
        if entry is not None:
            entry.pins += delta

    def _over(self, group: int, extra: int) -> bool:
        if self.budget is None:
            return sum(self.used) + extra > self.capacity_bytes
        return self.used[group] + extra > self.budget[group]

    def _oldest_unpinned(self, group: int) -> tuple[int, _Entry] | None:
        for key, entry in self.lru[group].items():
            if entry.pins == 0:
                return key, entry
        return None

    def _victim(self, group: int) -> tuple[int, int] | None:
        """The LRU unpinned entry: of ``group`` with per-group budgets, of any group with a shared one."""
        groups = range(len(self.lru)) if self.budget is None else (group,)
        best: tuple[int, int, int] | None = None
        for g in groups:
            found = self._oldest_unpinned(g)
            if found is not None and (best is None or found[1].stamp < best[0]):
                best = (found[1].stamp, g, found[0])
        return None if best is None else (best[1], best[2])

    def insert(self, group: int, key: int, nbytes: int, request_id: str, source: int = -1) -> bool:
        """Store one entry, evicting LRU entries to make room; False if it cannot fit. ``source``: the
        instance storing it (-1: the only one)."""
        if key in self.lru[group]:
            self.touch(group, key)
            return True
        limit = self.capacity_bytes if self.budget is None else self.budget[group]
        if nbytes > limit:
            return False
        while self._over(group, nbytes):
            victim = self._victim(group)
            if victim is None:
                return False
            self.remove(victim[0], victim[1], request_id, "evict_lru", source)
        self.lru[group][key] = _Entry(nbytes, self._stamp())
        self.used[group] += nbytes
        self.log("stored", group, key, nbytes, request_id, "offload_store", source)
        return True

    def remove(self, group: int, key: int, request_id: str = "", cause: str = "evict_lru", source: int = -1) -> None:
        entry = self.lru[group].pop(key)
        self.used[group] -= entry.nbytes
        self.evictions[group] += 1
        self.log("removed", group, key, entry.nbytes, request_id, cause, source)

    def loaded(self, keys: Sequence[tuple[int, int]], request_id: str, source: int = -1) -> None:
        """A load of ``keys`` (``(group, key)``, pinned until now) completed for ``source``."""

    def admitted(self, record: "LookupRecord", source: int = -1) -> None:
        """An admission used the tier's answer ``record`` (its last lookup for the request)."""

    def log(self, kind: str, group: int, key: int, nbytes: int, request_id: str, cause: str, source: int) -> None:
        """Record one change of the tier: here a ``kv_events`` row of the instance (block id -1)."""
        self.events.append(KVEvent(kind, group, -1, key, request_id, cause))


class TierBackend(Protocol):
    """Where an offload connector's tier and links come from (default: its own tier behind one PCIe link;
    :class:`sim.cluster.tier.SharedTier` hands every instance the one store of a cluster)."""

    #: The instance this connector serves (-1: the only one), passed to the tier with every change.
    source: int

    def storage(self, num_groups: int, capacity_bytes: int, shares: Sequence[float] | None) -> OffloadTier:
        """The tier the connector stores to and loads from."""
        ...

    def links(self, transfers: TransferService, name: str, spec: LinkSpec) -> tuple[Link, Link]:
        """``(load link, store link)``; ``spec`` is the connector's own link options."""
        ...


class OwnTier:
    """The default backend: a tier of the connector's own, loads and stores sharing one link."""

    source = -1

    def storage(self, num_groups: int, capacity_bytes: int, shares: Sequence[float] | None) -> OffloadTier:
        return OffloadTier(num_groups, capacity_bytes, shares)

    def links(self, transfers: TransferService, name: str, spec: LinkSpec) -> tuple[Link, Link]:
        link = transfers.make_link(f"{name}.pcie", spec)
        return link, link


class OffloadConnector(KVConnector):
    """CPU-tier offloading; see the module docstring for the hit and store rules."""

    name = "offload"
    supports_hma = True
    supports_divergent_local_hybrid_hits = False

    def __init__(
        self,
        capacity_gb: float | None = None,
        store: Literal["on_finish", "on_compute"] = "on_compute",
        chunk_tokens: int | None = None,
        bandwidth_gbps: float = DEFAULT_PCIE_GBPS,
        latency_us: float = DEFAULT_PCIE_LATENCY_US,
        concurrency: int | None = None,
        transfer_steps: int = 1,
        group_capacity: str | Sequence[float] = "shared",
    ) -> None:
        if capacity_gb is None or not isinstance(capacity_gb, (int, float)) or capacity_gb <= 0:
            raise ValueError(
                f"connector.capacity_gb: the offload tier needs its size in GB (1e9 bytes), > 0; got {capacity_gb!r} "
                "(vLLM's OffloadingConnector likewise requires cpu_bytes_to_use)"
            )
        if store not in ("on_finish", "on_compute"):
            raise ValueError(f"connector.store: expected 'on_finish' or 'on_compute', got {store!r}")
        if chunk_tokens is not None and (not isinstance(chunk_tokens, int) or chunk_tokens < 1):
            raise ValueError(f"connector.chunk_tokens: expected a positive token count, got {chunk_tokens!r}")
        if not isinstance(group_capacity, str):
            shares = list(group_capacity)
            if not shares or any(not isinstance(x, (int, float)) or x <= 0 for x in shares) or sum(shares) > 1 + 1e-9:
                raise ValueError(
                    f"connector.group_capacity: expected 'shared' or a list of fractions > 0 summing to <= 1, got {group_capacity!r}"
                )
        elif group_capacity != "shared":
            raise ValueError(
                f"connector.group_capacity: expected 'shared' or a list of fractions, got {group_capacity!r}"
            )
        self.capacity_bytes = int(capacity_gb * GB)
        self.store = store
        self.chunk_tokens_option = chunk_tokens
        self.link_spec = LinkSpec(bandwidth_gbps * GB, latency_us * 1e-6, concurrency, transfer_steps)
        self.group_capacity = group_capacity
        self._reqs: dict[str, _ReqState] = {}
        self._last_local: dict[str, int] = {}
        #: The last lookup of each request not yet admitted (reported to the tier at admission).
        self._unadmitted: dict[str, LookupRecord] = {}
        self.backend: TierBackend = OwnTier()
        self._recving: set[str] = set()
        self._sending: set[str] = set()
        self._loads_in_flight = 0
        self._stores_in_flight = 0
        self.counters: dict[str, int] = {
            "queries": 0,
            "hit_tokens": 0,
            "loads": 0,
            "load_tokens": 0,
            "bytes_loaded": 0,
            "stores": 0,
            "bytes_stored": 0,
            "store_rejected": 0,
        }

    # ------------------------------------------------------------------ setup
    def bind(self, ctx: ConnectorContext) -> None:
        super().bind(ctx)
        chunk = self.chunk_tokens_option
        if chunk is None:
            sbs = ctx.scheduler_block_size
            chunk = -(-DEFAULT_CHUNK_TOKENS // sbs) * sbs
        for g in ctx.groups:
            if chunk % g.block_size:
                raise ValueError(
                    f"connector.chunk_tokens: {chunk} is not a multiple of group {g.index}'s block size "
                    f"{g.block_size}; use a multiple of {ctx.scheduler_block_size}"
                )
        self.C = chunk
        shares = None if isinstance(self.group_capacity, str) else list(self.group_capacity)
        if shares is not None and len(shares) != ctx.num_groups:
            raise ValueError(
                f"connector.group_capacity: {len(shares)} fractions given for {ctx.num_groups} KV-cache groups"
            )
        self.tier = self.backend.storage(ctx.num_groups, self.capacity_bytes, shares)
        #: GPU-block equivalents of one tier entry per group (a chunk; one state for Mamba).
        self.entry_blocks = [1 if g.kind == "mamba" else chunk // g.block_size for g in ctx.groups]
        self.hit_tokens_per_group = [0] * ctx.num_groups
        self.link, self.store_link = self.backend.links(ctx.transfers, self.name, self.link_spec)

    # ------------------------------------------------------------------ keys
    def _num_keyed_chunks(self, request: Request) -> int:
        return len(request.block_hashes) * self.ctx.hash_block_size // self.C

    def _key(self, request: Request, chunk_idx: int) -> int:
        """The chunk's offload key: the hash of the last hash block of chunk ``chunk_idx``."""
        return request.block_hashes[(chunk_idx + 1) * self.C // self.ctx.hash_block_size - 1]

    def _window_chunks(self, g: GroupLayout) -> int:
        if g.kind == "mamba":
            return 1
        assert g.window is not None
        return -(-g.window // self.C)

    def _group_end(self, g: GroupLayout, request: Request, start: int, bound: int) -> int:
        """Deepest chunk boundary ``<= bound`` that group ``g`` can supply from chunk ``start`` (0: none)."""
        present = self.tier.lru[g.index]
        if g.kind == "full_attention":
            j = start
            while j < bound // self.C and self._key(request, j) in present:
                j += 1
            return j * self.C
        w = self._window_chunks(g)
        for end in range(bound // self.C, start, -1):
            if all(self._key(request, j) in present for j in range(max(start, end - w), end)):
                return end * self.C
        return 0

    def _upper_bound(self, request: Request) -> int:
        bound = request.num_tokens
        if any(g.kind != "full_attention" for g in self.ctx.groups):
            bound = (request.num_tokens - 1) // self.C * self.C
        return min(bound, self._num_keyed_chunks(request) * self.C)

    def lookup(self, request: Request, num_computed_tokens: int) -> LookupRecord:
        """The tier's answer: the hit end (0 when the tier supplies nothing), the per-group independent ends
        and the bound they were looked up to."""
        local = num_computed_tokens
        start = local // self.C
        upper = bound = self._upper_bound(request)
        groups = self.ctx.groups
        independent = tuple(self._group_end(g, request, start, bound) for g in groups)
        if bound - local < self.C:
            return LookupRecord(local, upper, independent, 0)
        stable = False
        while not stable:
            stable = True
            for g in groups:
                end = self._group_end(g, request, start, bound)
                if end < bound:
                    bound, stable = end, False
                if bound - local < self.C:
                    return LookupRecord(local, upper, independent, 0)
        return LookupRecord(local, upper, independent, bound)

    # ------------------------------------------------------------------ scheduler hooks
    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> tuple[int | None, bool]:
        state = self._reqs.get(request.request_id)
        if state is not None and state.pending_stores:
            return None, False
        record = self.lookup(request, num_computed_tokens)
        end = record.end
        ext = max(0, end - num_computed_tokens) if end else 0
        self.counters["queries"] += 1
        self.counters["hit_tokens"] += ext
        for g, e in enumerate(record.group_ends):
            self.hit_tokens_per_group[g] += max(0, e - num_computed_tokens)
        self._last_local[request.request_id] = num_computed_tokens
        self._unadmitted[request.request_id] = record
        return ext, ext > 0

    def peek_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> int | None:
        """The tier's answer without counting a query (``lookup`` reads the tier only)."""
        state = self._reqs.get(request.request_id)
        if state is not None and state.pending_stores:
            return None
        end = self.lookup(request, num_computed_tokens).end
        return max(0, end - num_computed_tokens) if end else 0

    def _state(self, request: Request) -> _ReqState:
        state = self._reqs.get(request.request_id)
        if state is None:
            state = _ReqState(request, stored_chunks=[0] * self.ctx.num_groups)
            self._reqs[request.request_id] = state
        return state

    def load_keys(self, request: Request, local: int, end: int) -> list[tuple[int, int]]:
        """``(group, key)`` entries a load of ``[local, end)`` reads (FA chunks, window chunks, the Mamba state at ``end``)."""
        keys: list[tuple[int, int]] = []
        start, stop = local // self.C, end // self.C
        for g in self.ctx.groups:
            lo = start if g.kind == "full_attention" else max(start, stop - self._window_chunks(g))
            keys.extend((g.index, self._key(request, j)) for j in range(lo, stop))
        return keys

    def served_elsewhere(self, request: Request) -> None:
        """Another connector loads this admission: its lookup is not the tier's to count."""
        self._unadmitted.pop(request.request_id, None)

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int) -> None:
        state = self._state(request)
        record = self._unadmitted.pop(request.request_id, None)
        if record is not None:
            self.tier.admitted(record, self.backend.source)
        if num_external_tokens <= 0:
            return
        rid = request.request_id
        local = self._last_local.get(rid, 0)
        end = local + num_external_tokens
        table = block_table(blocks)
        for g in self.ctx.groups:
            # vLLM OffloadingConnectorScheduler.update_state_after_alloc asserts.
            num_gpu_blocks = -(-end // g.block_size)
            if not len(table[g.index]) >= num_gpu_blocks:
                raise AssertionError("len(group_blocks) >= num_gpu_blocks")
            if local % g.block_size != 0:
                raise AssertionError("num_locally_computed_tokens % tokens_per_block == 0")
        keys = self.load_keys(request, local, end)
        nbytes = sum(self.entry_bytes_for_load(g, local, end) for g in self.ctx.groups)
        for gid, key in keys:
            self.tier.touch(gid, key)
            self.tier.pin(gid, key, +1)
        state.loading = True
        self._loads_in_flight += 1
        self.counters["loads"] += 1
        self.counters["load_tokens"] += num_external_tokens

        def done() -> None:
            self.tier.loaded(keys, rid, self.backend.source)
            for g, k in keys:
                self.tier.pin(g, k, -1)
            state.loading = False
            self._loads_in_flight -= 1
            self.counters["bytes_loaded"] += nbytes
            self._recving.add(rid)

        self.link.submit(nbytes, done)

    def entry_bytes_for_load(self, g: GroupLayout, local: int, end: int) -> int:
        """Bytes group ``g`` moves for a load of ``[local, end)``: the blocks written (Mamba: one state)."""
        if g.kind == "mamba":
            return g.bytes_per_block
        lo = local // g.block_size
        if g.kind == "sliding_window":
            lo = max(lo, end // g.block_size - self._window_chunks(g) * (self.C // g.block_size))
        return (-(-end // g.block_size) - lo) * g.bytes_per_block

    def _offer(
        self, state: _ReqState, computed: int, block_ids: tuple[Sequence[int], ...] | None
    ) -> list[tuple[int, int, int]]:
        """Entries ``(group, key, nbytes)`` of ``state``'s request not yet offered, up to ``computed`` tokens."""
        request = state.request
        limit = min(computed, self._num_keyed_chunks(request) * self.C) // self.C
        entries: list[tuple[int, int, int]] = []
        for g in self.ctx.groups:
            first = state.stored_chunks[g.index]
            if g.kind == "mamba":
                if block_ids is not None:
                    ids = block_ids[g.index]
                    chunks = [
                        (i + 1) * g.block_size // self.C - 1
                        for i, b in enumerate(ids)
                        if b != 0 and (i + 1) * g.block_size % self.C == 0 and (i + 1) * g.block_size <= computed
                    ]
                else:
                    chunks = [computed // self.C - 1] if computed and computed % self.C == 0 else []
                chunks = [j for j in chunks if first <= j < limit]
            else:
                per = self.C // g.block_size
                chunks = []
                for j in range(first, limit):
                    if block_ids is None or all(b != 0 for b in block_ids[g.index][j * per : (j + 1) * per]):
                        chunks.append(j)
            if chunks:
                state.stored_chunks[g.index] = max(chunks) + 1
            for j in chunks:
                key = self._key(request, j)
                if self.tier.contains(g.index, key):
                    self.tier.touch(g.index, key)
                else:
                    entries.append((g.index, key, self.entry_blocks[g.index] * g.bytes_per_block))
        return entries

    def _submit_store(self, state: _ReqState, entries: list[tuple[int, int, int]]) -> None:
        rid = state.request.request_id
        nbytes = sum(e[2] for e in entries)
        state.pending_stores += 1
        self._stores_in_flight += 1
        self.counters["stores"] += 1

        def done() -> None:
            self._stores_in_flight -= 1
            state.pending_stores -= 1
            for g, key, size in entries:
                if self.tier.insert(g, key, size, rid, self.backend.source):
                    self.counters["bytes_stored"] += size
                else:
                    self.counters["store_rejected"] += 1
            if state.finished and state.pending_stores == 0:
                self._sending.add(rid)
                self._reqs.pop(rid, None)

        self.store_link.submit(nbytes, done)

    def request_finished_all_groups(
        self, request: Request, block_ids: tuple[list[int], ...]
    ) -> tuple[bool, KVTransferParams | None]:
        rid = request.request_id
        self._last_local.pop(rid, None)
        self._unadmitted.pop(rid, None)
        state = self._state(request)
        # on_finish reads the block table; on_compute offers what the last step completed.
        entries = self._offer(state, request.num_computed_tokens, block_ids if self.store == "on_finish" else None)
        state.finished = True
        if entries:
            self._submit_store(state, entries)
        if state.pending_stores == 0:
            self._reqs.pop(rid, None)
            return False, None
        return True, None

    def get_finished(self) -> tuple[set[str], set[str]]:
        if self.store == "on_compute":
            for state in list(self._reqs.values()):
                if state.finished or state.loading:
                    continue
                entries = self._offer(state, state.request.num_computed_tokens, None)
                if entries:
                    self._submit_store(state, entries)
        recving, sending = self._recving, self._sending
        self._recving, self._sending = set(), set()
        return recving, sending

    def take_events(self) -> list:
        events, self.tier.events = self.tier.events, []
        return events

    # ------------------------------------------------------------------ metrics
    def _tier_blocks(self, g: int) -> int:
        """GPU-block equivalents group ``g`` holds in the tier."""
        return len(self.tier.lru[g]) * self.entry_blocks[g]

    def metrics(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self.counters)
        out["transfer_time"] = self.link.stats.busy_time
        if self.store_link is not self.link:
            out["transfer_time"] += self.store_link.stats.busy_time
        for g in range(self.ctx.num_groups):
            out[f"hit_tokens_g{g}"] = self.hit_tokens_per_group[g]
            out[f"tier_blocks_g{g}"] = self._tier_blocks(g)
            out[f"tier_evictions_g{g}"] = self.tier.evictions[g]
        out["tier_bytes"] = sum(self.tier.used)
        out["tier_capacity_bytes"] = self.capacity_bytes
        return out

    def step_columns(self) -> dict[str, float | int]:
        cols: dict[str, float | int] = {
            f"conn_tier_blocks_g{g}": self._tier_blocks(g) for g in range(self.ctx.num_groups)
        }
        cols["conn_tier_bytes"] = sum(self.tier.used)
        cols["conn_loads_in_flight"] = self._loads_in_flight
        cols["conn_stores_in_flight"] = self._stores_in_flight
        return cols
