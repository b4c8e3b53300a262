"""Quiet decodes: the running loop's decodes that need neither a chunk computation nor ``allocate_slots``.

On a long replay most passes of vLLM's running loop are decodes (one new
token, all others computed) inside the request's quiet horizon
(:mod:`sim.accel.quiet`): their chunk is one token and their
``allocate_slots`` call changes nothing. :class:`QuietDecodeScheduler` checks
that with one bound per request (:attr:`QuietHorizon.max_decode_computed
<sim.accel.quiet.QuietHorizon.max_decode_computed>`) and schedules such a
request directly; every other request takes the core's pass
(:meth:`Scheduler._schedule_running_request`).

What it keeps: every step's ``SchedulerOutput`` and every ``Request`` are the
ones the core builds (the request is scheduled in the same place of
``scheduled_running_reqs`` and ``num_scheduled_tokens`` with the same one
token; ``_update_after_schedule`` is the core's without a lookup per running request and with
each run of quiet decodes updated in bulk, and ``update_from_output`` the core's with two calls per sampled token inlined or
skipped where their answer is known).
Only calls whose answer is known are skipped. Chosen once by the
engine's build, together with :class:`~sim.accel.quiet.QuietKVCacheManager`;
``tests/test_fastpath_differential.py`` is the contract.

Its waiting phase also reuses a head-of-line request's prefix lookup
(:mod:`sim.accel.lookups`) where the lookup reads only the prefix cache: no
connector, no what-if checkpoint placement, a built-in prefix policy (with no
connector each of them takes the reconciled ``get_computed_blocks``).
"""

from __future__ import annotations

from typing import Any

from sim.accel.lookups import HeadOfLineLookups, LookupResult
from sim.accel.quiet import QuietKVCacheManager
from sim.core.admission import AdmissionAttempt, AttemptEnd
from sim.core.interfaces import SchedulerKVManager
from sim.core.policy.prefix import (
    MaxPerGroupPolicy,
    PR48425Policy,
    PR48425RequeryPolicy,
    ReconciledPolicy,
    TrimToMinPolicy,
)
from sim.core.request import Request, RequestStatus
from sim.core.scheduler import Scheduler, SchedulerConfig, SchedulerOutput

#: Prefix policies whose lookup without a connector is the reconciled ``get_computed_blocks`` (exact classes).
_CACHE_ONLY_LOOKUPS = (ReconciledPolicy, PR48425Policy, PR48425RequeryPolicy, MaxPerGroupPolicy, TrimToMinPolicy)


class QuietDecodeScheduler(Scheduler):
    """:class:`Scheduler` whose running loop schedules quiet decodes without the per-request calls.

    A request at ``running[i]`` is a *quiet decode* when it has a quiet horizon,
    every token but the last computed (``num_computed_tokens == num_tokens - 1``;
    after a prefill that is a decode, else the prompt's last token) and
    ``num_computed_tokens <= max_decode_computed``. Then, in the core's pass,
    ``_running_tokens`` gives 1: the threshold cannot clip one token, the loop
    runs only while the budget is positive, ``computed + 1 < max_model_len``
    (a request stops once ``num_tokens`` reaches ``max_model_len``), and the
    Mamba split keeps a one-token chunk that ends at ``num_tokens`` (its stops
    must lie strictly inside the chunk, and it ends at or past the prefill end).
    The manager drops a horizon before anything that could change the request's
    tables (free, skip, cache, a full allocation), so a stored one is current and
    ``allocate_slots(request, 1)`` returns no block and changes nothing. The
    pass then only schedules the one token: that is all this loop does for it.
    """

    def __init__(self, config: SchedulerConfig, kv_manager: SchedulerKVManager, *args: Any, **options: Any) -> None:
        """As :class:`Scheduler`; ``kv_manager`` must be the speed layer's manager (its horizons are read here)."""
        if not isinstance(kv_manager, QuietKVCacheManager):
            raise TypeError(f"QuietDecodeScheduler needs a QuietKVCacheManager, got {type(kv_manager).__name__}")
        super().__init__(config, kv_manager, *args, **options)
        self.quiet = kv_manager.quiet
        self._quiet_kv = kv_manager
        #: Running-loop passes scheduled here without ``_running_tokens`` and ``allocate_slots`` (tests count them).
        self.num_quiet_decodes = 0
        #: The kept head-of-line lookups, or None where a lookup may read more than the prefix cache.
        self.head_lookups: HeadOfLineLookups | None = (
            kv_manager.head_lookups
            if self.connector is None
            and self.checkpoint_policy is None
            and type(self.prefix_policy) in _CACHE_ONLY_LOOKUPS
            else None
        )
        #: This step's runs of quiet decodes, as ``(start, stop)`` positions in ``scheduled_running_reqs``
        #: (set by ``_schedule_running``, read by ``_update_after_schedule``).
        self._quiet_runs: list[tuple[int, int]] = []
        #: The current attempt's lookup (set by every attempt's lookup phase while ``head_lookups`` is on).
        self._attempt_lookup: LookupResult | None = None

    def _schedule_running(self, out: SchedulerOutput, budget: int, threshold: int, preempted: list[Request]) -> int:
        """The core's running loop, with quiet decodes scheduled in place (class docstring)."""
        running = self.running
        horizon_of = self.quiet.horizons.get
        scheduled = out.scheduled_running_reqs
        num_scheduled = out.num_scheduled_tokens
        req_index = quiet = 0
        runs = self._quiet_runs
        runs.clear()
        while req_index < len(running) and budget > 0:
            # The quiet decodes from `req_index` on, one token of the budget each (none changes `running`).
            before = len(scheduled)
            for request in running[req_index : req_index + budget]:
                rid = request.request_id
                horizon = horizon_of(rid)
                if horizon is None:
                    break
                computed = request.num_computed_tokens
                if computed > horizon.max_decode_computed or computed + 1 != (
                    request.num_prompt_tokens + request.num_output_tokens
                ):
                    break
                scheduled.append(request)
                num_scheduled[rid] = 1
            taken = len(scheduled) - before
            if taken:
                runs.append((before, before + taken))
            req_index += taken
            budget -= taken
            quiet += taken
            if req_index >= len(running) or budget <= 0:
                break
            req_index, budget, go_on = self._schedule_running_request(
                running[req_index], req_index, budget, threshold, out, preempted
            )
            if not go_on:
                break
        self.num_quiet_decodes += quiet
        return budget

    def _update_after_schedule(self, out: SchedulerOutput, kinds: dict[str, str]) -> None:
        """The core's :meth:`~sim.core.scheduler.Scheduler._update_after_schedule`, without a lookup per
        running request and with this step's runs of quiet decodes taken in bulk.

        The requests scheduled from ``running`` lead ``num_scheduled_tokens`` in the order of
        ``scheduled_running_reqs`` (both loops append to both together), so only new and resumed requests
        are looked up. A quiet decode was scheduled for one token with ``num_computed_tokens ==
        num_tokens - 1``, and nothing moves its counters before this update (a preemption could, under
        priority, take back a request already scheduled: then no run is taken in bulk). So the core's pass
        gives each of them the same outcome: one more computed token, a sampled token, one decode over its
        ``before`` context. What is per request (``computed_before``, ``sampling_reqs``, the new count) is
        written in the same order as the core's loop; the totals are sums. Leaving ``_inflight_prefills``
        is the core's rule for every scheduled request (it leaves once all its known tokens are computed),
        applied to the few in-flight prefills after the pass."""
        num_scheduled = out.num_scheduled_tokens
        reqs = out.scheduled_running_reqs
        runs = self._quiet_runs if not out.preempted_req_ids else ()
        if len(reqs) < len(num_scheduled):  # new and resumed requests follow, in admission order
            requests = self.requests
            reqs = reqs + [requests[rid] for rid in list(num_scheduled)[len(reqs) :]]
        inflight_prefills = self._inflight_prefills
        prefill_chunks = out.prefill_chunks
        sampling = out.sampling_reqs
        befores = out.computed_before
        decode = decode_context = prefill = 0
        pos = 0
        for start, stop in (*runs, (len(reqs), len(reqs))):
            if pos < start:
                # Core passes, new and resumed requests (every request, when no run is taken in bulk).
                for request in reqs[pos:start]:
                    n = num_scheduled[request.request_id]
                    before = request.num_computed_tokens
                    befores.append(before)
                    request.num_computed_tokens = after = before + n
                    num_tokens = request.num_prompt_tokens + request.num_output_tokens
                    if after >= num_tokens:
                        sampling.append(request)
                        if inflight_prefills:
                            inflight_prefills.pop(request.request_id, None)
                        if n == 1 and after == num_tokens:
                            decode += 1
                            decode_context += before
                            continue
                    prefill += n
                    prefill_chunks.append((n, before))
            if start < stop:
                run = reqs[start:stop]
                run_befores = [request.num_computed_tokens for request in run]
                for request in run:
                    request.num_computed_tokens += 1
                befores.extend(run_befores)
                sampling.extend(run)
                decode += stop - start
                decode_context += sum(run_befores)
            pos = stop
        if runs and inflight_prefills:
            for rid, request in list(inflight_prefills.items()):
                if (
                    num_scheduled.get(rid) == 1
                    and request.num_computed_tokens == request.num_prompt_tokens + request.num_output_tokens
                ):
                    del inflight_prefills[rid]
        out.decode_tokens += decode
        out.decode_context_tokens += decode_context
        out.prefill_tokens += prefill
        self._record_schedule_rows(out, kinds)

    def _drain_events(self) -> None:
        """The core's, skipped when there is nothing to drain (no connector, no event pending): most steps."""
        if self.connector is None and not self._quiet_kv.num_pending_events:
            return
        super()._drain_events()

    def _prefix_lookup(self, request: Request) -> LookupResult:
        """The core's lookup, or the kept one while no event named the request's hashes (module docstring)."""
        lookups = self.head_lookups
        if lookups is None:
            return super()._prefix_lookup(request)
        self._quiet_kv.sync_events()
        result = lookups.reuse(request)
        if result is None:
            result = super()._prefix_lookup(request)
        self._attempt_lookup = result
        return result

    def _try_admit(self, request: Request, budget: int, threshold: int, loads_only: bool = False) -> AdmissionAttempt:
        """The core's attempt; one that did not admit ``request`` keeps its lookup for the next."""
        attempt = super()._try_admit(request, budget, threshold, loads_only)
        looked, self._attempt_lookup = self._attempt_lookup, None
        lookups = self.head_lookups
        if lookups is not None and looked is not None and attempt.end is not AttemptEnd.ADMITTED:
            lookups.keep(request, looked)
        return attempt

    def update_from_output(self, out: SchedulerOutput) -> list[Request]:
        """The core's :meth:`~sim.core.scheduler.Scheduler.update_from_output` with two calls saved per
        sampled token: ``Request.append_output_tokens(1)``'s block-hash check inlined (a new full block
        can only end at this token), and ``_stop_status`` skipped where it is None (fewer outputs than
        ``output_len``, which is at most ``max_tokens``, and shorter than ``max_model_len``)."""
        finished: list[Request] = []
        running_status = RequestStatus.RUNNING
        max_model_len = self.max_model_len
        for request in out.sampling_reqs:
            if request.status is not running_status:
                continue
            # Request.append_output_tokens(1), its block-hash check inlined: the hashes were complete
            # before this token, so a new full block can only end at it.
            request.num_output_tokens = num_output = request.num_output_tokens + 1
            num_tokens = request.num_prompt_tokens + num_output
            hbs = request.hash_block_size
            if hbs and not num_tokens % hbs:
                request.update_block_hashes()
            if num_output < request.output_len and num_tokens < max_model_len:
                continue  # `_stop_status` is None exactly here (Request keeps output_len <= max_tokens)
            status = self._stop_status(request)
            if status is not None:
                self._finish_stopped(request, status)
                finished.append(request)
        self._drain_events()
        self.step += 1
        return finished
