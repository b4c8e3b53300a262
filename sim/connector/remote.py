"""The ``remote`` connector: P/D disaggregation seen from the decode instance (vLLM's NIXL pull connector).

Every remote-prefilled request (all requests by default, or those listed in
``requests``) is first computed by a *prefill instance*; the decode instance
(the one we simulate) then pulls the KV and, for a hybrid, the last Mamba
state over a network link, asynchronously, and recomputes the rest.

The prefill instance is a latency model, not a second scheduler: it is a
processor-sharing server with throughput ``prefill_tokens_per_s`` plus a fixed
``prefill_overhead_ms`` per request (on the step clock: ``prefill_steps``
steps). The decode-side decisions this simulator studies (the prefix boundary,
what the connector may claim, the asserts it trips) depend only on *when* the
remote KV is ready and *how much* of it there is; the prefill instance's own
cache and batching would double the cost of a run and need a workload of its
own without changing those decisions. A full second instance can be composed
from two runs instead.

Arrival (the P/D proxy): a remote-prefilled request goes to the prefill instance
first and reaches the decode instance's scheduler only when its prefill is done
(:meth:`RemoteConnector.route_arrival` holds it and hands it over then), as
vLLM's proxy submits it to the decode engine with ``do_remote_prefill`` only
after the prefill instance answered. So the scheduler never asks about a
request whose prefill is still running, and FCFS order at the decode instance
is the order in which prefills finish. The request keeps its client arrival
time: TTFT includes the remote prefill.

Scheduler-side semantics follow ``NixlPullConnectorScheduler`` (vLLM 0.33):

* ``get_num_new_matched_tokens`` answers ``count = R - local`` with ``R`` the prefill's token count:
  the prompt minus the backoff the decoder recomputes
  (``_prefill_backoff``: 1 token when the model has Mamba layers, so the
  decoder derives h(N) from the shipped h(N-1)), asynchronously, when
  ``count > 0``, else 0. No block alignment and no cap, as in NIXL;
* ``update_state_after_alloc`` consumes the remote blocks (one transfer per
  request: a re-admission after preemption answers 0 and recomputes), and
  ``assert num_external_tokens == 0`` when the request has no remote blocks.

NIXL's block-pairing checks run on its worker when the transfer is posted; we
run them here, when the transfer is planned (the next step in vLLM):
``get_exchange_clipped_blocks`` ("Number of KV cache groups must match") and
``_apply_prefix_caching`` (non-Mamba: ``num_decode_blocks <=
len(prefill_group)``; Mamba hybrids: the SSM pairing "unpairable SSM state
slots" and the FA ``|decode - prefill| > max_padding`` check). A failing check
raises ``AssertionError`` with vLLM's message; the scheduler records it as the
engine crash. ``supports_divergent_local_hybrid_hits`` is True, as NIXL
declares it (it always ships the last Mamba state).

**What the pull writes (vLLM issue #46453).** NIXL does not load the token
range ``[local, local + external)`` the scheduler accounts for: it pulls
*every* unhashed, non-null block of the decode request
(``get_unhashed_block_ids_all_groups``) and the worker pairs them with the
prefill's blocks from the tail (``_apply_prefix_caching``). The decode's
unhashed full-attention blocks are positions ``[h, cdiv(R, B))`` behind its
``h`` hashed hit blocks, and the prefill's tail of the same length holds the
same positions, so the pull writes tokens ``[h * B, R)`` whatever the
scheduler's scalar ``local`` says. When a lookup over-claims the local hit
(``max_per_group``, vLLM after #44243, with the Mamba state outliving the FA
tail) the FA positions between the resident prefix and ``local`` are fresh
blocks that the pull refills: no NIXL check fires (their block counts pair
exactly, ``d <= p`` and one SSM slot each side) and the KV ends up right.
``counters["refilled_local_tokens"]`` sums those positions
(``local - h * B`` where positive, ``local = R - external``). Only when the
over-claimed hit already reaches ``R`` does NIXL answer 0, pull nothing, and
leave the gap dirty (no crash either: the scheduler then has one token to
compute). The crashes reported in #46453 came from a MockKVConnector
(``assert num_new_tokens > 0``) and an offloading connector, not from NIXL:
see docs/connectors.md, "#46453 with the remote connector".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence

from sim.connector.base import KVConnector
from sim.connector.context import ConnectorContext, LinkSpec, block_table
from sim.core.interfaces import KVTransferParams
from sim.core.kv.kv_cache_manager import KVCacheBlocks
from sim.core.request import Request

#: One 200 Gb/s RDMA NIC (InfiniBand HDR / NDR200, RoCE) at ~25 GB/s effective.
DEFAULT_NETWORK_GBPS = 25.0
#: RDMA read latency plus NIXL notification round trip.
DEFAULT_NETWORK_LATENCY_US = 20.0
#: Prefill throughput of one prefill instance: an 8B model on one H100 (~20k tokens/s).
DEFAULT_PREFILL_TOKENS_PER_S = 20_000.0
#: Router hop plus the prefill instance's scheduling and first-step overhead.
DEFAULT_PREFILL_OVERHEAD_MS = 5.0
GB = 1e9


class PrefillSide(Protocol):
    """Where a remote-prefilled request's prefill runs, when it is not the latency model (a cluster's
    prefill instances, :mod:`sim.cluster.pd`)."""

    def submit(self, request: Request, remote_tokens: int, done: Callable[[], None]) -> None:
        """Prefill ``request`` remotely; ``done()`` once, when its KV can be pulled (maybe at once)."""
        ...

    def pulled(self, request: Request) -> None:
        """The decode side pulled ``request``'s KV, or will pull none: the prefill side may free it."""
        ...


class Producer(Protocol):
    """NIXL's prefill (producer) side on a cluster's prefill instance (:mod:`sim.cluster.pd`)."""

    def hold(self, request: Request) -> bool:
        """``request`` finished here: True keeps its blocks until a decode instance pulled them."""
        ...

    def released(self) -> set[str]:
        """Held requests whose blocks may be freed now (``finished_sending``)."""
        ...


@dataclass
class _Remote:
    prefill_done: bool = False
    remote_tokens: int = 0
    consumed: bool = False


class RemoteConnector(KVConnector):
    """NIXL-like remote prefill; works with no options (defaults above)."""

    name = "remote"
    supports_hma = True
    supports_divergent_local_hybrid_hits = True
    #: NIXL pulls every block of the request without a cache entry (the truth checker relies on it).
    pulls_unhashed_blocks = True
    #: NIXL ships the last Mamba state with every load.
    supplies_mamba_state = True

    def __init__(
        self,
        bandwidth_gbps: float = DEFAULT_NETWORK_GBPS,
        latency_us: float = DEFAULT_NETWORK_LATENCY_US,
        concurrency: int | None = None,
        transfer_steps: int = 1,
        prefill_tokens_per_s: float = DEFAULT_PREFILL_TOKENS_PER_S,
        prefill_overhead_ms: float = DEFAULT_PREFILL_OVERHEAD_MS,
        prefill_steps: int = 1,
        requests: Sequence[str] | None = None,
    ) -> None:
        if requests is not None and (isinstance(requests, str) or not all(isinstance(r, str) for r in requests)):
            raise ValueError(f"connector.requests: expected a list of request ids, got {requests!r}")
        self.network_spec = LinkSpec(bandwidth_gbps * GB, latency_us * 1e-6, concurrency, transfer_steps)
        self.prefill_spec = LinkSpec(prefill_tokens_per_s, prefill_overhead_ms * 1e-3, None, prefill_steps)
        self.remote_requests = None if requests is None else set(requests)
        self._remote: dict[str, _Remote] = {}
        self._recving: set[str] = set()
        #: A cluster's prefill instances instead of the latency model (decode instances), or ``None``.
        self.prefill_side: PrefillSide | None = None
        #: A cluster's P/D proxy on a prefill instance (NIXL's producer side), or ``None``.
        self.producer: Producer | None = None
        self.counters: dict[str, int] = {
            "queries": 0,
            "hit_tokens": 0,
            "loads": 0,
            "bytes_loaded": 0,
            "prefills": 0,
            "refilled_local_tokens": 0,
        }

    def bind(self, ctx: ConnectorContext) -> None:
        super().bind(ctx)
        self.backoff = 1 if ctx.has_mamba else 0
        self.prefill = ctx.transfers.make_link(f"{self.name}.prefill", self.prefill_spec)
        self.network = ctx.transfers.make_link(f"{self.name}.network", self.network_spec)
        #: NIXL ``blocks_per_sw``: window blocks + 1 for sliding-window groups, 0 otherwise.
        self.blocks_per_sw = [
            -(-g.window // g.block_size) + 1 if g.kind == "sliding_window" and g.window else 0 for g in ctx.groups
        ]
        self._loads_in_flight = 0
        #: Blocks pulled per group (after clipping), over all transfers.
        self.blocks_pulled = [0] * len(ctx.groups)

    def is_remote(self, request: Request) -> bool:
        return self.remote_requests is None or request.request_id in self.remote_requests

    def may_load_async(self, request: Request) -> bool:
        """vLLM 0.34's base answer: the request's ``do_remote_prefill`` flag, which a remote request carries."""
        return self.is_remote(request)

    def remote_token_count(self, request: Request) -> int:
        """NIXL ``_get_remote_prefill_token_count``: the prompt less the decoder's backoff."""
        p = request.num_prompt_tokens
        return p - self.backoff if self.backoff and p > self.backoff else p

    def route_arrival(self, request: Request, hand_over: Callable[[Request], None]) -> bool:
        """The proxy: a remote-prefilled request is prefilled first and handed to the scheduler when done."""
        if not self.is_remote(request) or request.request_id in self._remote:
            return False
        remote = _Remote(remote_tokens=self.remote_token_count(request))
        self._remote[request.request_id] = remote
        self.counters["prefills"] += 1

        def done() -> None:
            remote.prefill_done = True
            hand_over(request)

        if self.prefill_side is not None:
            self.prefill_side.submit(request, remote.remote_tokens, done)
        else:
            self.prefill.submit(remote.remote_tokens, done)
        return True

    def _answer(self, request: Request) -> _Remote | None:
        """The remote prefill still to pull for ``request`` (``None``: a local request, or pulled already)."""
        remote = self._remote.get(request.request_id)
        if remote is None or remote.consumed or not remote.prefill_done:
            return None
        return remote

    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> tuple[int | None, bool]:
        self.counters["queries"] += 1
        remote = self._answer(request)
        if remote is None:
            return 0, False
        count = remote.remote_tokens - num_computed_tokens
        if count > 0:
            self.counters["hit_tokens"] += count
            return count, True
        return 0, False

    def peek_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> int | None:
        """NIXL's answer without counting a query."""
        remote = self._answer(request)
        return 0 if remote is None else max(0, remote.remote_tokens - num_computed_tokens)

    def _clip(self, ids: list[list[int]]) -> list[list[int]]:
        """NIXL ``get_exchange_clipped_blocks``: window tails, the state-bearing Mamba slot."""
        if not len(ids) == len(self.blocks_per_sw):
            raise AssertionError("Number of KV cache groups must match")
        out = []
        for g, blocks in zip(self.ctx.groups, ids):
            if self.blocks_per_sw[g.index]:
                blocks = blocks[-self.blocks_per_sw[g.index] :]
            elif g.kind == "mamba" and blocks:
                blocks = blocks[-1:]
            out.append(blocks)
        return out

    def prefill_block_counts(self, remote_tokens: int) -> list[int]:
        """Blocks per group the prefill instance offers for its ``remote_tokens`` computed tokens."""
        counts = []
        for g in self.ctx.groups:
            n = -(-remote_tokens // g.block_size)
            if g.kind == "mamba":
                n = min(n, 1)
            elif self.blocks_per_sw[g.index]:
                n = min(n, self.blocks_per_sw[g.index])
            counts.append(n)
        return counts

    def _check_pairing(self, decode: list[list[int]], prefill: list[int]) -> None:
        """NIXL worker ``_apply_prefix_caching`` checks (logical block size equal on both sides)."""
        for i, (g, d) in enumerate(zip(self.ctx.groups, decode)):
            nd, npf = len(d), prefill[i]
            if not self.ctx.has_mamba:
                if not nd <= npf:
                    raise AssertionError("num_decode_blocks <= len(prefill_group)")
            elif g.kind == "mamba":
                if nd != npf and not nd - npf <= 1:
                    raise AssertionError(f"Group {i}: unpairable SSM state slots, decode={nd} prefill={npf}")
            elif not nd < npf:
                max_padding = 2
                if not abs(nd - npf) <= max_padding:
                    raise AssertionError(f"Group {i}: |{nd} - {npf}| > {max_padding}")

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int) -> None:
        rid = request.request_id
        remote = self._answer(request)
        if remote is None:  # a local request, or its one transfer is done (NIXL: do_remote_prefill is False)
            return
        remote.consumed = True  # NIXL: params["do_remote_prefill"] = False, one transfer per request
        if num_external_tokens <= 0:
            if self.prefill_side is not None:
                self.prefill_side.pulled(request)
            return
        table = block_table(blocks)
        unhashed: list[list[int]] = []
        #: First token position the pull writes in a full-attention group.
        pull_start = remote.remote_tokens
        for g, group in zip(self.ctx.groups, table):
            ids = []
            for pos, b in enumerate(group):
                if b.is_null or b.block_hash is not None:
                    continue
                ids.append(b.block_id)
                if g.kind == "full_attention" and pos * g.block_size < pull_start:
                    pull_start = pos * g.block_size
            unhashed.append(ids)
        decode = self._clip(unhashed)
        self._check_pairing(decode, self.prefill_block_counts(remote.remote_tokens))
        local = remote.remote_tokens - num_external_tokens  # NIXL answered count = R - local
        self.counters["refilled_local_tokens"] += max(0, local - pull_start)
        for i, d in enumerate(decode):
            self.blocks_pulled[i] += len(d)
        nbytes = sum(len(d) * g.bytes_per_block for d, g in zip(decode, self.ctx.groups))
        self.counters["loads"] += 1
        self._loads_in_flight += 1

        def done() -> None:
            self._loads_in_flight -= 1
            self.counters["bytes_loaded"] += nbytes
            self._recving.add(rid)
            if self.prefill_side is not None:
                self.prefill_side.pulled(request)

        self.network.submit(nbytes, done)

    def request_finished_all_groups(
        self, request: Request, block_ids: tuple[list[int], ...]
    ) -> tuple[bool, KVTransferParams | None]:
        """Decode side, no bidirectional transfer: free at once (NIXL ``request_finished``). A cluster's
        prefill instance (``producer``) keeps the blocks until the decode instance pulled them."""
        self._remote.pop(request.request_id, None)
        if self.producer is not None and self.producer.hold(request):
            return True, None
        return False, None

    def get_finished(self) -> tuple[set[str], set[str]]:
        recving, self._recving = self._recving, set()
        return recving, self.producer.released() if self.producer is not None else set()

    def metrics(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self.counters)
        out["blocks_pulled"] = list(self.blocks_pulled)
        out["transfer_time"] = self.network.stats.busy_time
        out["prefill_time"] = self.prefill.stats.busy_time
        return out

    def step_columns(self) -> dict[str, float | int]:
        pending = sum(1 for r in self._remote.values() if not r.prefill_done)
        return {"conn_prefills_in_flight": pending, "conn_loads_in_flight": self._loads_in_flight}
