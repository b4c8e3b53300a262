"""The ``scripted`` connector (docs/design.md §4), modelled on vLLM's ``MockKVConnector``.

Two ways to script a request's external hit; a request may appear in only one:

* ``matched_tokens: {req: N}`` answers ``N`` external tokens beyond whatever
  local hit it is shown, verbatim, at *every* admission attempt of that request
  (re-admissions after preemption included). No cap at ``num_tokens - 1`` and
  no block alignment, exactly like ``MockKVConnector`` in vLLM's scheduler
  tests, so an answer that reaches the end of the prompt trips the scheduler's
  asserts as it would in vLLM.
* ``holds: {req: N}`` says the connector holds the request's first ``N`` tokens:
  it answers ``max(0, H - local)`` with ``H = min(N, num_tokens - 1)`` rounded
  down to the scheduler block size, the way a well-behaved connector does.

Unlisted requests get 0. ``load_async`` (a bool, or a per-request map) makes a
non-zero load asynchronous: it completes ``async_load_steps`` engine steps
after the step in which the transfer started (counted by :meth:`get_finished`,
which the engine calls once per step before ``schedule()``). The connector keeps
no KV of its own and never delays a free. vLLM 0.34's ``may_load_async`` is
answered from the script too: yes for a request it loads asynchronously
(``load_async`` for that request, whatever its matched tokens).
"""

from __future__ import annotations

from typing import Mapping

from sim.connector.base import KVConnector
from sim.core.kv.kv_cache_manager import KVCacheBlocks
from sim.core.request import Request
from sim.limits import MAX_INT, MAX_TOKENS


class ScriptedConnector(KVConnector):
    name = "scripted"

    def __init__(
        self,
        matched_tokens: Mapping[str, int] | None = None,
        holds: Mapping[str, int] | None = None,
        load_async: bool | Mapping[str, bool] = False,
        async_load_steps: int = 1,
        supports_divergent_local_hybrid_hits: bool = False,
        supports_hma: bool = True,
    ) -> None:
        self.matched_tokens = dict(matched_tokens or {})
        self.holds = dict(holds or {})
        for key, table in (("matched_tokens", self.matched_tokens), ("holds", self.holds)):
            for req_id, n in table.items():
                if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= MAX_TOKENS:
                    raise ValueError(
                        f"connector.{key}.{req_id}: expected a token count from 0 to {MAX_TOKENS}, got {str(n)[:24]}"
                    )
        both = sorted(set(self.matched_tokens) & set(self.holds))
        if both:
            raise ValueError(f"connector: requests {both} are in both matched_tokens and holds; use one")
        if not isinstance(load_async, (bool, Mapping)):
            raise ValueError(
                f"connector.load_async: expected a bool or a map of request id to bool, got {load_async!r}"
            )
        self.load_async = load_async if isinstance(load_async, bool) else dict(load_async)
        if not isinstance(async_load_steps, int) or not 1 <= async_load_steps <= MAX_INT:
            raise ValueError(
                f"connector.async_load_steps: expected an integer from 1 to {MAX_INT}, got {str(async_load_steps)[:24]}"
            )
        self.async_load_steps = async_load_steps
        self.supports_divergent_local_hybrid_hits = supports_divergent_local_hybrid_hits
        self.supports_hma = supports_hma
        #: request id -> engine steps left until its async load completes.
        self._loading: dict[str, int] = {}
        #: (request id, external tokens) of every load the scheduler started, in order.
        self.loads: list[tuple[str, int]] = []

    def _is_async(self, request_id: str) -> bool:
        if isinstance(self.load_async, bool):
            return self.load_async
        return bool(self.load_async.get(request_id, False))

    def may_load_async(self, request: Request) -> bool:
        return self._is_async(request.request_id)

    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> tuple[int | None, bool]:
        ext = self.peek_num_new_matched_tokens(request, num_computed_tokens)
        assert ext is not None
        return ext, ext > 0 and self._is_async(request.request_id)

    def peek_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> int | None:
        """The scripted answer (pure: the script and the request only)."""
        rid = request.request_id
        if rid in self.matched_tokens:
            ext = self.matched_tokens[rid]
        elif rid in self.holds:
            if not self.bound:
                raise RuntimeError("scripted connector: holds mode needs bind(ctx) (the scheduler block size) first")
            held = min(self.holds[rid], request.num_tokens - 1)
            held -= held % self.ctx.scheduler_block_size
            ext = max(0, held - num_computed_tokens)
        else:
            ext = 0
        return ext

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int) -> None:
        if num_external_tokens <= 0:
            return
        self.loads.append((request.request_id, num_external_tokens))
        if self._is_async(request.request_id):
            self._loading[request.request_id] = self.async_load_steps

    def has_step_counted_loads(self) -> bool:
        return bool(self._loading)

    def get_finished(self) -> tuple[set[str], set[str]]:
        """Counts one engine step for every load in flight; returns those that completed.

        The engine calls this once per step before ``schedule()``, so a load
        started in step k with ``async_load_steps = n`` is reported before
        step k+n, whose ``schedule()`` resumes the request.
        """
        done = set()
        for rid in list(self._loading):
            self._loading[rid] -= 1
            if self._loading[rid] == 0:
                del self._loading[rid]
                done.add(rid)
        return done, set()
