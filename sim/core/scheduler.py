"""A vLLM 0.33 ``Scheduler`` step for what hybridsim models (``v1/core/sched/scheduler.py``).

One engine step is one :meth:`Scheduler.schedule` followed by one
:meth:`Scheduler.update_from_output`. Pure and deterministic: no clock, no
SimPy, no randomness; the engine stamps time on the recorder.

What it decides, as vLLM 0.33 does:

* **Running first** (in ``running`` order), each request gets
  ``min(remaining, long_prefill_token_threshold, budget, max_model_len -
  computed - 1)`` tokens, clipped by the Mamba block-aligned split; a request
  left with 0 tokens is skipped (``continue``). When ``allocate_slots`` fails
  the scheduler preempts by recompute (FCFS: the last running request;
  priority: the max of ``(priority, arrival_time)``) until it fits or the
  request preempted itself; a failed request stops the running loop.
* **Waiting** only if nothing was preempted this step, while the token budget
  lasts and fewer than ``max_num_seqs`` run. Waiting requests that hold blocks
  (async loads) are drained before the others. A fresh admission
  (``num_computed_tokens == 0``) looks up the local hit through the prefix
  policy, asks the connector for external tokens (``None``: skip the request
  this step), re-runs ``get_computed_blocks`` when the lookup's
  ``hit_diverged`` is set and the connector adds nothing (without asking the
  connector again, as vLLM 0.33; only a policy with
  ``requery_after_fallback``, the what-if ``pr48425_requery``, asks again at
  the reconciled boundary), then allocates the
  whole prompt (``full_sequence_must_fit``). A failed allocation stops
  admission for this step (head-of-line). An async load parks the request in
  ``WAITING_FOR_REMOTE_KVS``; once the engine reports it in
  ``finished_recving`` its blocks are cached and it is admitted without a new
  lookup.
* **Finish**: ``request_finished_all_groups`` on the connector, then the
  blocks are freed unless the connector still sends them.

vLLM 0.34's knobs (``SchedulerConfig``; at their defaults the step is 0.33's):

* **Cache-aware admission** (``cache_aware_admission_window`` N > 0, FCFS and
  prefix caching only): before the waiting phase, once KV usage is at or above
  ``cache_aware_admission_threshold``, the plain ``WAITING`` requests with
  nothing computed among the first N of ``waiting`` are reordered by their
  locally cached tokens (``KVCacheManager.get_num_cached_tokens``, deepest
  first, ties by position); preempted and partly computed requests keep their
  slots, and the connector is not asked.
* **In-flight async loads** (``max_num_inflight_kv_loads`` N): a new request the
  connector ``may_load_async`` waits in its own queue, ``async_kv_waiting``,
  taken in arrival order with ``waiting``; an async load starts only while
  fewer than N requests hold blocks for one (in progress, finished but not yet
  running, or aborted and not yet reported done). A load refused by the cap
  stops the waiting phase when it came from ``waiting`` (head of line) and
  only the async queue otherwise. With no seat or token budget left the phase
  goes on in "loads only" mode: it starts loads from ``async_kv_waiting``
  (which take neither until their KV has arrived) until one cannot start.

vLLM's asserts on this path (``num_new_tokens > 0``, ``num_computed_tokens <=
num_tokens``, the ones inside ``truncate_computed_blocks`` and the kv core,
``ValueError`` from the block pool) surface as :class:`EngineCrash`. With
``on_crash="stop"`` the exception propagates, as the real engine dies; with
``on_crash="record"`` the offending request is finished with
``FINISHED_ERROR`` (blocks freed), the crash is kept in :attr:`Scheduler.crashes`
and the step goes on.

Not modelled (absent from hybridsim): speculative decoding and lookahead
slots, encoder inputs, LoRA limits, structured output, async scheduling and
pipeline parallelism (so no output placeholders and no deferred frees), pause
states, streaming sessions, prefill cadence, DP balancing, DSV41 replay
windows, fine-grained partial Mamba hits (``prefix_match_unit``), the
``scheduler_reserve_full_isl=False`` mode, and load-error recovery
(``_update_requests_with_invalid_blocks``).
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass
from typing import Callable, Final, Iterable, Literal, NoReturn, TypeVar

from sim.core.admission import AdmissionAttempt, AdmissionChecker, AttemptEnd
from sim.core.interfaces import AdmissionRecorder, SchedulerConnector, SchedulerKVManager
from sim.core.kv.hash_view import block_hashes_at
from sim.core.kv.hashing import RequestBlockHasher
from sim.core.kv.kv_cache_manager import KVCacheBlocks
from sim.core.kv.specs import KVCacheConfig, MambaSpec, prefill_checkpoint_position, prefill_checkpoint_valid
from sim.core.policy.checkpoint import BaseCheckpointPolicy, PrefixFacts, extra_state_positions
from sim.core.policy.prefix import PrefixLookup, PrefixPolicy, get_prefix_policy
from sim.core.request import BlockHasher, Request, RequestStatus

SchedulingPolicyName = Literal["fcfs", "priority"]
_T = TypeVar("_T")


class EngineCrash(Exception):
    """An assertion or error the real engine would die of, with the request that triggered it.

    ``reason`` names it as the real engine would print it, e.g.
    ``"AssertionError: num_new_tokens > 0"`` or ``"ValueError: Cannot get 1
    free blocks from the pool"``.
    """

    def __init__(self, reason: str, request_id: str | None, step: int = -1) -> None:
        super().__init__(f"{reason} (request {request_id}, step {step})")
        self.reason = reason
        self.request_id = request_id
        self.step = step


def _crash_reason(exc: BaseException) -> str:
    message = str(exc)
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


#: Batches in flight at once: vLLM's ``VllmConfig.max_concurrent_batches`` is the
#: pipeline-parallel size, or 2 with async scheduling; hybridsim models neither, so 1.
MAX_CONCURRENT_BATCHES: Final = 1


@dataclass(frozen=True)
class SchedulerConfig:
    """Scheduler knobs with vLLM 0.33's ``SchedulerConfig`` class defaults.

    ``max_num_batched_tokens`` (2048) and ``max_num_seqs`` (128) are the class
    defaults; vLLM's engine raises them by GPU and usage context, which is the
    config layer's business. ``max_model_len`` ``None`` takes the KV-cache
    config's. ``watermark`` is the fraction of blocks kept free at admission
    (passed to the kv manager, which applies it).
    """

    max_num_seqs: int = 128
    max_num_batched_tokens: int = 2048
    max_model_len: int | None = None
    long_prefill_token_threshold: int = 0
    policy: SchedulingPolicyName = "fcfs"
    watermark: float = 0.0
    #: vLLM 0.34: reorder the first N waiting requests by cached prefix (0: arrival order).
    cache_aware_admission_window: int = 0
    #: vLLM 0.34: KV usage at or above which the window applies.
    cache_aware_admission_threshold: float = 0.5
    #: vLLM 0.34: cap on requests holding blocks for an async load (``None``: no cap, no early loads).
    max_num_inflight_kv_loads: int | None = None
    #: What-if, not vLLM 0.33/0.34: vLLM 0.22.1 and older (before PR #42554) ran the Mamba block-aligned split
    #: on every admission, async loads included, and asserted that no external tokens came with it
    #: ("External KV connector is not verified yet", vLLM #45407). True reproduces that engine crash.
    assert_no_external_kv_in_mamba_split: bool = False

    def __post_init__(self) -> None:
        for key in ("max_num_seqs", "max_num_batched_tokens"):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"scheduler.{key}: expected an integer >= 1, got {value!r}")
        if self.max_model_len is not None and (not isinstance(self.max_model_len, int) or self.max_model_len < 1):
            raise ValueError(f"scheduler.max_model_len: expected an integer >= 1 or null, got {self.max_model_len!r}")
        thr = self.long_prefill_token_threshold
        if not isinstance(thr, int) or isinstance(thr, bool) or thr < 0:
            raise ValueError(f"scheduler.long_prefill_token_threshold: expected an integer >= 0, got {thr!r}")
        if self.policy not in ("fcfs", "priority"):
            raise ValueError(f"scheduler.policy: expected 'fcfs' or 'priority', got {self.policy!r}")
        if not (isinstance(self.watermark, (int, float)) and 0.0 <= self.watermark < 1.0):
            raise ValueError(f"scheduler.watermark: expected a fraction in [0, 1), got {self.watermark!r}")
        window = self.cache_aware_admission_window
        if not isinstance(window, int) or isinstance(window, bool) or window < 0:
            raise ValueError(f"scheduler.cache_aware_admission_window: expected an integer >= 0, got {window!r}")
        threshold = self.cache_aware_admission_threshold
        if not (isinstance(threshold, (int, float)) and 0.0 <= threshold <= 1.0):
            raise ValueError(
                f"scheduler.cache_aware_admission_threshold: expected a fraction in [0, 1], got {threshold!r}"
            )
        cap = self.max_num_inflight_kv_loads
        if cap is not None and (not isinstance(cap, int) or isinstance(cap, bool) or cap < 1):
            raise ValueError(f"scheduler.max_num_inflight_kv_loads: expected an integer >= 1 or null, got {cap!r}")
        if not isinstance(self.assert_no_external_kv_in_mamba_split, bool):
            raise ValueError(
                "scheduler.assert_no_external_kv_in_mamba_split: expected true or false, "
                f"got {self.assert_no_external_kv_in_mamba_split!r}"
            )

    @property
    def max_in_flight_tokens(self) -> int:
        """Tokens scheduled but not yet settled (vLLM ``VllmConfig.max_in_flight_tokens``):
        concurrent batches x ``max_num_batched_tokens``. The kv manager sizes the
        sliding-window admission cap with it."""
        return MAX_CONCURRENT_BATCHES * self.max_num_batched_tokens


class SchedulerOutput:
    """What one ``schedule()`` decided (the model input of the step).

    A plain class: one is built per step.
    """

    def __init__(self, step: int, finished_req_ids: set[str] | None = None) -> None:
        self.step = step
        self.scheduled_new_reqs: list[Request] = []
        self.scheduled_resumed_reqs: list[Request] = []
        self.scheduled_running_reqs: list[Request] = []
        #: request id -> tokens scheduled this step, in scheduling order.
        self.num_scheduled_tokens: dict[str, int] = {}
        self.preempted_req_ids: list[str] = []
        #: Requests finished between the previous step and this one.
        self.finished_req_ids: set[str] = set() if finished_req_ids is None else finished_req_ids
        self.prefill_tokens = 0
        #: Decode requests (one new token each, all known tokens computed after it).
        self.decode_tokens = 0
        #: Sum over the decode requests of ``num_computed_tokens`` before this step.
        self.decode_context_tokens = 0
        #: ``(num_new_tokens, num_computed_tokens before)`` of every other scheduled
        #: request, in scheduling order. With the two decode totals it describes
        #: the batch without a per-request pass (the step-time model's input).
        self.prefill_chunks: list[tuple[int, int]] = []
        #: The scheduled requests whose known tokens are all computed after this
        #: step, in scheduling order: each samples one token in ``update_from_output``.
        self.sampling_reqs: list[Request] = []
        #: ``num_computed_tokens`` before this step, parallel to ``num_scheduled_tokens``.
        self.computed_before: list[int] = []

    def __repr__(self) -> str:
        return (
            f"SchedulerOutput(step={self.step}, num_scheduled_tokens={self.num_scheduled_tokens}, "
            f"preempted_req_ids={self.preempted_req_ids})"
        )

    @property
    def total_num_scheduled_tokens(self) -> int:
        return sum(self.num_scheduled_tokens.values())

    @property
    def num_computed_tokens_before(self) -> dict[str, int]:
        """request id -> ``num_computed_tokens`` before this step (built on demand)."""
        return dict(zip(self.num_scheduled_tokens, self.computed_before))


class _WaitQueue:
    """vLLM's FCFS deque or priority heap (key: priority, arrival time, request id)."""

    def __init__(self, priority: bool) -> None:
        self.priority = priority
        self._fifo: deque[Request] = deque()
        self._heap: list[tuple[int, float, str, Request]] = []

    def add(self, request: Request) -> None:
        if self.priority:
            heapq.heappush(self._heap, (request.priority, request.arrival_time, request.request_id, request))
        else:
            self._fifo.append(request)

    def prepend(self, request: Request) -> None:
        """Front of the queue (FCFS); a priority queue just re-inserts (vLLM)."""
        if self.priority:
            self.add(request)
        else:
            self._fifo.appendleft(request)

    def prepend_in_order(self, requests: list[Request]) -> None:
        """Put ``requests`` at the front, keeping their order."""
        for request in reversed(requests):
            self.prepend(request)

    def peek(self) -> Request:
        return self._heap[0][3] if self.priority else self._fifo[0]

    def pop(self) -> Request:
        return heapq.heappop(self._heap)[3] if self.priority else self._fifo.popleft()

    def remove(self, requests: set[Request]) -> None:
        if self.priority:
            self._heap = [e for e in self._heap if e[3] not in requests]
            heapq.heapify(self._heap)
        else:
            self._fifo = deque(r for r in self._fifo if r not in requests)

    def head(self, n: int) -> list[Request]:
        """The first ``n`` requests of a FCFS queue, in order."""
        assert not self.priority, "only a FCFS queue has positions"
        return [r for r, _ in zip(self._fifo, range(n))]

    def replace_head(self, requests: list[Request]) -> None:
        """Replace the first ``len(requests)`` requests of a FCFS queue by ``requests`` (the same ones, reordered)."""
        assert not self.priority, "only a FCFS queue has positions"
        for _ in requests:
            self._fifo.popleft()
        self._fifo.extendleft(reversed(requests))

    def __len__(self) -> int:
        return len(self._heap) if self.priority else len(self._fifo)


class _Skipped:
    """Requests a waiting phase put aside, by where they go back at its end."""

    __slots__ = ("holding", "started_loads", "waiting", "async_loads")

    def __init__(self) -> None:
        #: Block holders (async loads not yet done) skipped from kv_holding_waiting: back to its front.
        self.holding: list[Request] = []
        #: Requests whose async load started this step: to the end of kv_holding_waiting.
        self.started_loads: list[Request] = []
        #: Skipped from waiting / async_kv_waiting (connector not ready, no chunk): back to its front.
        self.waiting: list[Request] = []
        self.async_loads: list[Request] = []


class Scheduler:
    """vLLM's scheduler over one :class:`~sim.core.kv.kv_cache_manager.KVCacheManager`."""

    def __init__(
        self,
        config: SchedulerConfig,
        kv_manager: SchedulerKVManager,
        connector: SchedulerConnector | None = None,
        prefix_policy: PrefixPolicy | str = "reconciled",
        recorder: AdmissionRecorder | None = None,
        admission_checker: AdmissionChecker | None = None,
        on_crash: Literal["stop", "record"] = "stop",
        checkpoint_policy: BaseCheckpointPolicy | None = None,
        block_hasher: BlockHasher | None = None,
    ) -> None:
        if on_crash not in ("stop", "record"):
            raise ValueError(f"on_crash: expected 'stop' or 'record', got {on_crash!r}")
        self.config = config
        self.kv = kv_manager
        kv_cfg: KVCacheConfig = kv_manager.kv_cache_config
        self.kv_cache_config = kv_cfg
        self.max_model_len = config.max_model_len or kv_cfg.max_model_len
        self.block_size = kv_cfg.scheduler_block_size
        self.hash_block_size = kv_cfg.hash_block_size
        # The hasher bound to each added request (vLLM's engine binds ``get_request_block_hasher``'s);
        # the build may pass the speed layer's, which gives the same hashes.
        self._block_hasher = block_hasher or RequestBlockHasher(self.hash_block_size)
        self.num_groups = len(kv_cfg.groups)
        # A `none` connector is no connector at all (vLLM: kv_transfer_config is None).
        if connector is not None and connector.name == "none":
            connector = None
        if connector is not None and not connector.supports_hma and self.num_groups > 1:
            raise ValueError(
                f"connector {connector.name!r} does not support the hybrid memory allocator (supports_hma: false); "
                f"a model with {self.num_groups} KV-cache groups cannot use it (vLLM refuses to start)"
            )
        self.connector = connector
        self.prefix_policy = get_prefix_policy(prefix_policy) if isinstance(prefix_policy, str) else prefix_policy
        self.recorder = recorder
        self.admission_checker = admission_checker
        self.on_crash = on_crash
        self.priority = config.policy == "priority"

        # Mamba block-aligned split (vLLM `need_mamba_block_aligned_split`).
        mamba_specs = [g.spec for g in kv_cfg.groups if isinstance(g.spec, MambaSpec)]
        self.need_mamba_split = kv_cfg.needs_mamba_block_aligned_split
        self.mamba_block_size = mamba_specs[0].block_size if mamba_specs else 0
        self.mamba_has_prefill_checkpoints = kv_cfg.mamba_prefill_checkpoints
        #: A what-if Mamba checkpoint placement (sim.core.policy.checkpoint); None is vLLM's.
        self.checkpoint_policy = checkpoint_policy if self.need_mamba_split else None

        self.requests: dict[str, Request] = {}
        self.running: list[Request] = []
        self.waiting = _WaitQueue(self.priority)
        self.kv_holding_waiting = _WaitQueue(self.priority)
        #: vLLM 0.34: new requests the connector may load asynchronously, with a load cap set.
        self.async_kv_waiting = _WaitQueue(self.priority)
        #: vLLM 0.34: cache-aware admission needs a prefix cache and positions (FCFS); 0 is off.
        self.cache_aware_window = (
            config.cache_aware_admission_window if not self.priority and kv_cfg.enable_prefix_caching else 0
        )
        #: Requests whose async load counts toward ``max_num_inflight_kv_loads`` (vLLM's in-progress and
        #: completed-waiting fetch stages), and aborted loads not yet reported done.
        self._kv_loads_held: set[str] = set()
        self._aborted_kv_loads: set[str] = set()
        self.finished_req_ids: set[str] = set()
        self.finished_recving_kv_req_ids: set[str] = set()
        self._inflight_prefills: dict[str, Request] = {}
        #: Crashes kept with ``on_crash="record"`` (in order).
        self.crashes: list[EngineCrash] = []
        self.step = 0
        # Counters.
        self.num_preemptions = 0
        self.num_admissions = 0
        self.num_fallbacks = 0
        self.num_finished = 0

    def _mamba_block_aligned_split(
        self,
        request: Request,
        num_new_tokens: int,
        num_new_local_computed_tokens: int = 0,
        num_external_computed_tokens: int = 0,
    ) -> int:
        """vLLM ``_mamba_block_aligned_split`` without EAGLE and fine-grained hits.

        Non-final prefill chunks end on Mamba block boundaries; a chunk also
        stops at the last cacheable boundary ``floor((num_tokens - 1) / B) * B``
        (unless the layers write it into a prefill checkpoint block from inside
        the final chunk), at the block-floored shared-prefix junction, and at
        the next boundary when it starts mid-block.
        """
        start = request.num_computed_tokens + num_new_local_computed_tokens + num_external_computed_tokens
        num_tokens = request.num_prompt_tokens + request.num_output_tokens
        prefill_end = num_tokens - 1 if num_tokens - 1 > request.num_prompt_tokens else request.num_prompt_tokens
        if start >= prefill_end:
            return num_new_tokens
        bs = self.mamba_block_size
        # vLLM aligns the checkpoint to the scheduler block size (the hash block only with
        # fine-grained partial hits, which we do not model).
        block_size = self.block_size
        end = start + num_new_tokens
        use_internal_checkpoint = (
            self.mamba_has_prefill_checkpoints
            and end >= prefill_end
            and prefill_checkpoint_valid(
                start, end, prefill_checkpoint_position(prefill_end, block_size), self.hash_block_size, bs
            )
        )
        if end < prefill_end:
            config = self.config
            max_prefill = config.max_num_batched_tokens
            if 0 < config.long_prefill_token_threshold < max_prefill:
                max_prefill = config.long_prefill_token_threshold
            aligned_end = end // bs * bs
            if aligned_end > start or bs <= max_prefill:
                end = aligned_end
        # The chunk ends at the nearest of these stops strictly inside (start, end).
        junction = request.shared_prefix_boundary
        junction_inside = start < junction < end
        if not use_internal_checkpoint:
            if start % bs:
                next_boundary = (start // bs + 1) * bs  # > start
                if next_boundary < end:
                    end = next_boundary
            last_cache_position = prefill_checkpoint_position(num_tokens, block_size)
            if start < last_cache_position < end:
                end = last_cache_position
        if junction_inside:
            junction_stop = start + (junction - start) // bs * bs
            if start < junction_stop < end:
                end = junction_stop
        if request.extra_state_positions:  # a what-if placement: also stop at the next extra state
            for position in request.extra_state_positions:
                if position > start:
                    stop = start + (position - start) // bs * bs
                    if start < stop < end:
                        end = stop
                    break
        return end - start if end > start else 0

    def _prefix_lookup(self, request: Request) -> tuple[tuple[int, ...], PrefixLookup]:
        """The per-group hits (the admissions table's ``hit_gN``) and the policy's lookup for a waiting request."""
        hits = tuple(self.kv.find_per_group_hits(request))
        lookup = self.prefix_policy.lookup(self.kv, request, self.connector)
        return hits, lookup

    def schedule(self) -> SchedulerOutput:
        """Decide one engine step. Raises :class:`EngineCrash` (``on_crash="stop"``)."""
        out = SchedulerOutput(step=self.step, finished_req_ids=self.finished_req_ids)
        self.finished_req_ids = set()
        budget = self.config.max_num_batched_tokens
        preempted: list[Request] = []
        kinds: dict[str, str] = {}
        self.kv.new_step_starts()

        num_running, num_waiting = self.get_request_counts()
        # vLLM: the threshold only applies when someone else could be starved.
        threshold = self.config.long_prefill_token_threshold if num_running + num_waiting > 1 else 0

        budget = self._schedule_running(out, budget, threshold, preempted)
        if not preempted:
            self._schedule_waiting(out, budget, threshold, kinds)

        out.preempted_req_ids = [r.request_id for r in preempted]
        self._update_after_schedule(out, kinds)
        return out

    def _schedule_running(self, out: SchedulerOutput, budget: int, threshold: int, preempted: list[Request]) -> int:
        """vLLM's running loop: the requests of ``running`` in order, while the token budget lasts."""
        req_index = 0
        running = self.running
        while req_index < len(running) and budget > 0:
            req_index, budget, go_on = self._schedule_running_request(
                running[req_index], req_index, budget, threshold, out, preempted
            )
            if not go_on:
                break
        return budget

    def _schedule_running_request(
        self,
        request: Request,
        req_index: int,
        budget: int,
        threshold: int,
        out: SchedulerOutput,
        preempted: list[Request],
    ) -> tuple[int, int, bool]:
        """One pass of the running loop for ``request`` (at ``running[req_index]``).

        Returns ``(req_index, budget, go_on)``: where the loop goes next, the
        budget left, and False when the loop stops (the request does not fit
        and did not preempt itself).
        """
        n = self._running_tokens(request, budget, threshold)
        if n <= 0:
            # vLLM `continue`s here (not FCFS-strict): later requests may still run.
            return req_index + 1, budget, True
        try:
            new_blocks = self.kv.allocate_slots(request, n)
        except (AssertionError, ValueError) as exc:
            new_blocks = self._allocation_crash(request, exc)
        if new_blocks is None:  # (a crash also lands here: it returns no blocks)
            new_blocks, req_index, budget = self._preempt_for(request, n, req_index, budget, out, preempted)
            if request.status is RequestStatus.FINISHED_ERROR:
                return req_index, budget, True  # on_crash="record": it left `running`, the next one is at req_index
            if new_blocks is None:
                # Under priority it may have preempted itself; the higher-priority ones after it may still fit.
                return req_index, budget, self.priority and request.status is RequestStatus.PREEMPTED
        out.scheduled_running_reqs.append(request)
        out.num_scheduled_tokens[request.request_id] = n
        return req_index + 1, budget - n, True

    def _running_tokens(self, request: Request, budget: int, threshold: int) -> int:
        """The running loop's chunk for ``request``: what it still needs, clipped by the
        long-prefill threshold, the budget, ``max_model_len`` and the Mamba split."""
        n = request.num_tokens - request.num_computed_tokens
        if 0 < threshold < n:
            n = threshold
        n = min(n, budget, self.max_model_len - request.num_computed_tokens - 1)
        if self.need_mamba_split:
            n = self._mamba_block_aligned_split(request, n)
        return n

    def _allocation_crash(self, request: Request, exc: BaseException) -> KVCacheBlocks | None:
        """``allocate_slots`` raised: an engine crash; with ``on_crash="record"`` the request fails (no blocks)."""
        try:
            self._crash(_crash_reason(exc), request=request)
        except EngineCrash:
            if self.on_crash == "stop":
                raise
            self._fail_request(request)
        return None

    def _preempt_for(
        self,
        request: Request,
        n: int,
        req_index: int,
        budget: int,
        out: SchedulerOutput,
        preempted: list[Request],
    ) -> tuple[KVCacheBlocks | None, int, int]:
        """``allocate_slots`` gave ``request`` no blocks: preempt until it fits or it preempted itself.

        Returns ``(new_blocks, req_index, budget)``; ``new_blocks`` is None when
        it still does not fit or failed (a crash with ``on_crash="record"``:
        then nothing is preempted). A priority victim scheduled earlier in this
        loop gives its tokens back to the budget.
        """
        new_blocks = None
        while new_blocks is None:
            if request.status is RequestStatus.FINISHED_ERROR:
                break
            if self.connector is not None and self.connector.has_pending_block_frees():
                break
            if self.priority:
                victim = max(self.running, key=lambda r: (r.priority, r.arrival_time))
                victim_index = self.running.index(victim)
                del self.running[victim_index]
                if victim_index < req_index:
                    req_index -= 1
                if victim.request_id in out.num_scheduled_tokens:
                    out.scheduled_running_reqs.remove(victim)
                    budget += out.num_scheduled_tokens.pop(victim.request_id)
            else:
                victim = self.running.pop()
            self._preempt_request(victim)
            preempted.append(victim)
            if victim is request:
                break
            try:
                new_blocks = self.kv.allocate_slots(request, n)
            except (AssertionError, ValueError) as exc:
                new_blocks = self._allocation_crash(request, exc)
        return new_blocks, req_index, budget

    def _schedule_waiting(self, out: SchedulerOutput, budget: int, threshold: int, kinds: dict[str, str]) -> None:
        """The waiting phase: admission attempts, head of queue first, while budget and seats last
        (then, with a load cap, async loads only: see the module docstring)."""
        if self.cache_aware_window:
            self._reorder_waiting_by_cached_prefix()
        skipped = _Skipped()
        take_async = True  # cleared once async_kv_waiting's head cannot start a load
        max_num_seqs = self.config.max_num_seqs
        while True:
            loads_only = len(self.running) >= max_num_seqs or budget <= 0
            if not loads_only:
                queue = (
                    self.kv_holding_waiting if len(self.kv_holding_waiting) else self._next_waiting_queue(take_async)
                )
            elif take_async:
                queue = self.async_kv_waiting
            else:
                break
            if not len(queue):
                break
            request = queue.peek()
            if request.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
                if request.request_id not in self.finished_recving_kv_req_ids:
                    self._skip(queue, skipped)
                    continue
                self._update_waiting_for_remote_kv(request)
                request.status = RequestStatus.PREEMPTED if request.num_preemptions else RequestStatus.WAITING
            try:
                attempt = self._try_admit(request, budget, threshold, loads_only)
            except EngineCrash:
                if self.on_crash == "stop":
                    raise
                self._fail_request(request)
                continue
            if attempt.end is AttemptEnd.SKIPPED:
                self._skip(queue, skipped)
            elif attempt.end is AttemptEnd.REFUSED:
                if queue is not self.async_kv_waiting:
                    break
                take_async = False
            elif attempt.end is AttemptEnd.STOPPED:
                break
            else:
                queue.pop()
                budget -= self._start_running(attempt, out, kinds)
        # Skipped requests go back to the front of their queues; loads started this step join the end of
        # kv_holding_waiting (vLLM 0.34: newer than any block holder; 0.33 put them in front, which is the
        # same order whenever kv_holding_waiting was drained before the plain queue was scanned).
        self.kv_holding_waiting.prepend_in_order(skipped.holding)
        for request in skipped.started_loads:
            self.kv_holding_waiting.add(request)
        self.waiting.prepend_in_order(skipped.waiting)
        self.async_kv_waiting.prepend_in_order(skipped.async_loads)

    def _skip(self, queue: _WaitQueue, skipped: _Skipped) -> None:
        request = queue.pop()
        holds = self._holds_kv_blocks(request)
        if holds and queue is not self.kv_holding_waiting:
            skipped.started_loads.append(request)
        elif holds:
            skipped.holding.append(request)
        elif queue is self.async_kv_waiting:
            skipped.async_loads.append(request)
        else:
            skipped.waiting.append(request)

    def _try_admit(self, request: Request, budget: int, threshold: int, loads_only: bool = False) -> AdmissionAttempt:
        """One admission attempt for ``request`` (head of its queue), through its phases, recorded once.

        Returns the attempt with ``end`` set. Raises :class:`EngineCrash` (the
        attempt is recorded first, with outcome ``crash``).
        """
        attempt = self._begin_attempt(request)
        try:
            self._run_attempt(attempt, budget, threshold, loads_only)
        except EngineCrash as crash:
            attempt.outcome, attempt.crash_reason = "crash", crash.reason
            self._record_admission(attempt)
            raise
        self._record_admission(attempt)
        return attempt

    def _begin_attempt(self, request: Request) -> AdmissionAttempt:
        """Phase 1: the attempt's kind and where its lookup stands in ``kv_events`` (for ``explain``)."""
        if request.num_computed_tokens == 0:
            kind = "after_preemption" if request.num_preemptions else "first"
        else:
            kind = "after_async_load"  # blocks already held: no new lookup (vLLM)
        lookup_seq = len(self.recorder.kv_events) + self.kv.num_pending_events if self.recorder is not None else 0
        return AdmissionAttempt(
            request=request,
            kind=kind,
            hits=(0,) * self.num_groups,
            blocks=self.kv.empty_kv_cache_blocks,
            lookup_seq=lookup_seq,
            computed=request.num_computed_tokens,
        )

    def _run_attempt(self, attempt: AdmissionAttempt, budget: int, threshold: int, loads_only: bool = False) -> None:
        """Phases 2-5 (lookup, connector, size, allocate + verdict); each may end the attempt. Before sizing,
        vLLM 0.34's gate: an async load past the cap, or a request needing a seat in loads-only mode, is
        ``REFUSED``."""
        if attempt.kind != "after_async_load":
            self._lookup_phase(attempt)
            if self.connector is not None and not self._connector_phase(attempt):
                return
            attempt.computed = attempt.local + attempt.ext
            self._check(
                attempt.computed <= attempt.request.num_tokens,
                "num_computed_tokens <= request.num_tokens",
                attempt.request,
            )
            if self.checkpoint_policy is not None:
                self._place_checkpoints(attempt, self.checkpoint_policy)
        if attempt.load_async and not self._admits_inflight_kv_load():
            attempt.stop(AttemptEnd.REFUSED, "kv_load_cap")
            return
        if loads_only and not attempt.load_async:
            attempt.stop(AttemptEnd.REFUSED, "no_running_slot")
            return
        if not self._size_phase(attempt, budget, threshold):
            return
        self._allocate_phase(attempt)

    def _lookup_phase(self, attempt: AdmissionAttempt) -> None:
        """Phase 2: the per-group hits and the policy's local hit."""
        request = attempt.request
        attempt.hits, lookup = self._prefix_lookup(request)
        attempt.lookup, attempt.blocks, attempt.local = lookup, lookup.blocks, lookup.local_tokens
        request.shared_prefix_boundary = lookup.shared_prefix_boundary

    def _connector_phase(self, attempt: AdmissionAttempt) -> bool:
        """Phase 3: external tokens, and vLLM 0.33's fallback for a diverged hit the connector does not back.

        The fallback re-runs ``get_computed_blocks`` without asking the
        connector again (vLLM 0.33); only a policy with
        ``requery_after_fallback`` (the what-if ``pr48425_requery``) asks again
        at the reconciled boundary. False: the connector is not ready (the
        attempt ended ``SKIPPED``).
        """
        if not self._ask_connector(attempt):
            return False
        if attempt.hit_diverged and attempt.ext == 0:
            request = attempt.request
            attempt.blocks, attempt.local, request.shared_prefix_boundary = self.kv.get_computed_blocks(request)
            attempt.fallback = True
            if self.prefix_policy.requery_after_fallback:
                return self._ask_connector(attempt)
        return True

    def _ask_connector(self, attempt: AdmissionAttempt) -> bool:
        """vLLM's connector query at the attempt's local hit: sets ``ext`` and ``load_async``.

        The connector is shown the block-aligned local hit; a partial tail is
        kept only when the answer does not cover it (else the blocks are
        truncated to the aligned hit). A ``None`` answer ends the attempt
        (``connector_not_ready``, skipped this step) and returns False.
        """
        request = attempt.request
        partial_tail = attempt.local % self.block_size
        aligned_local = attempt.local - partial_tail
        # A connector's own scheduler-side asserts (e.g. NIXL's) kill the engine too.
        conn = self.connector
        assert conn is not None  # only called when the scheduler has a connector
        attempt.asked_at, attempt.answer = aligned_local, -1
        ext_answer, load_async = self._guarded(lambda: conn.get_num_new_matched_tokens(request, aligned_local), request)
        if ext_answer is not None:
            attempt.answer = ext_answer
        if request.skip_reading_external_kv:
            ext_answer, load_async = 0, False
        if ext_answer is None:
            attempt.stop(AttemptEnd.SKIPPED, "connector_not_ready")
            return False
        if partial_tail and ext_answer > partial_tail:
            attempt.ext = ext_answer
            blocks = attempt.blocks
            attempt.blocks = self._guarded(lambda: self.kv.truncate_computed_blocks(blocks, aligned_local), request)
            attempt.local, attempt.load_async = aligned_local, load_async
        elif partial_tail:
            attempt.ext, attempt.load_async = 0, False
        else:
            attempt.ext, attempt.load_async = ext_answer, load_async
        return True

    def _size_phase(self, attempt: AdmissionAttempt, budget: int, threshold: int) -> bool:
        """Phase 4: the tokens to schedule (0 for an async load). False: no aligned chunk (``STOPPED``).

        With the what-if ``assert_no_external_kv_in_mamba_split`` (vLLM <= 0.22.1) the split's assertion
        comes first, for an async load too: that release split every admission, external tokens or not.
        """
        request = attempt.request
        if self.need_mamba_split and self.config.assert_no_external_kv_in_mamba_split:
            self._check(attempt.ext == 0, "External KV connector is not verified yet", request)
        if attempt.load_async:
            self._check(attempt.ext > 0, "num_external_computed_tokens > 0", request)
            attempt.num_new_tokens = 0
            return True
        n = request.num_tokens - attempt.computed
        if 0 < threshold < n:
            n = threshold
        n = min(n, budget)
        self._check(n > 0, "num_new_tokens > 0", request)
        if self.need_mamba_split:
            n = self._mamba_block_aligned_split(request, n, attempt.local, attempt.ext)
            if n == 0:
                attempt.stop(AttemptEnd.STOPPED, "no_aligned_chunk")
                return False
        attempt.num_new_tokens = n
        return True

    def _allocate_phase(self, attempt: AdmissionAttempt) -> None:
        """Phase 5: ``allocate_slots`` for the whole prompt, the connector's ``update_state_after_alloc``,
        and the truth checker's verdict; an async load parks the request (``SKIPPED``)."""
        request = attempt.request
        load_async = attempt.load_async
        reserved = self._inflight_prefill_reserved_blocks() if load_async else 0
        new_blocks = self._guarded(
            lambda: self.kv.allocate_slots(
                request,
                attempt.num_new_tokens,
                num_new_computed_tokens=attempt.local,
                new_computed_blocks=attempt.blocks,
                num_external_computed_tokens=attempt.ext,
                delay_cache_blocks=load_async,
                full_sequence_must_fit=True,
                reserved_blocks=reserved,
                has_scheduled_reqs=bool(self.running),
            ),
            request,
        )
        if new_blocks is None:
            attempt.stop(AttemptEnd.STOPPED, "no_blocks")
            return
        conn = self.connector
        if conn is not None:
            ext = attempt.ext
            self._guarded(
                lambda: conn.update_state_after_alloc(request, self.kv.get_blocks(request.request_id), ext), request
            )
        self.num_admissions += 1
        if attempt.fallback:
            self.num_fallbacks += 1
        if request.num_cached_tokens < 0:
            request.num_cached_tokens = attempt.computed
            request.num_external_computed_tokens = attempt.ext
        attempt.outcome = "ok"
        if self.admission_checker is not None:
            attempt.outcome, attempt.tokens_lost, attempt.taint_origin = self.admission_checker(attempt)
        if load_async:
            request.status = RequestStatus.WAITING_FOR_REMOTE_KVS
            request.num_computed_tokens = attempt.computed
            self._inflight_prefills[request.request_id] = request
            if self.config.max_num_inflight_kv_loads is not None:
                self._kv_loads_held.add(request.request_id)
            attempt.end = AttemptEnd.SKIPPED
        else:
            attempt.end = AttemptEnd.ADMITTED

    def _start_running(self, attempt: AdmissionAttempt, out: SchedulerOutput, kinds: dict[str, str]) -> int:
        """An admitted request joins ``running`` with its tokens scheduled; returns them."""
        request, n = attempt.request, attempt.num_new_tokens
        rid = request.request_id
        self.running.append(request)
        if request.status == RequestStatus.WAITING:
            out.scheduled_new_reqs.append(request)
            kinds[rid] = "new"
        else:
            out.scheduled_resumed_reqs.append(request)
            kinds[rid] = "resumed"
        out.num_scheduled_tokens[rid] = n
        request.status = RequestStatus.RUNNING
        request.num_computed_tokens = attempt.computed
        self._kv_loads_held.discard(rid)
        if attempt.computed + n < request.num_tokens:
            self._inflight_prefills[rid] = request
        return n

    def _prompt_block_hashes(self, request: Request) -> list[int]:
        """The prompt's hashes at the scheduler block size up to its own state (``PrefixFacts.block_hashes``)."""
        bs = self.block_size
        view = block_hashes_at(request.block_hashes, self.hash_block_size, bs)
        return [view[i] for i in range(prefill_checkpoint_position(request.num_prompt_tokens, bs) // bs)]

    def _place_checkpoints(self, attempt: AdmissionAttempt, policy: BaseCheckpointPolicy) -> None:
        """Where this prefill saves extra Mamba states (``request.extra_state_positions``), told to the pool."""
        request = attempt.request
        fa = self.kv.coordinator.full_attention_group_id
        facts = PrefixFacts(
            self.block_size,
            self._prompt_block_hashes(request),
            attempt.hits[fa] if fa is not None else attempt.computed,
            attempt.computed,
            prefill_checkpoint_position(request.num_prompt_tokens, self.block_size),
            request.shared_prefix_boundary,
        )
        request.extra_state_positions = extra_state_positions(policy, request, facts)
        self.kv.set_extra_state_positions(request)

    def _check(self, ok: bool, assertion: str, request: Request) -> None:
        """vLLM ``assert <assertion>``: a failed one is an engine crash."""
        if not ok:
            self._crash(f"AssertionError: {assertion}", request)

    def _guarded(self, call: Callable[[], _T], request: Request) -> _T:
        """Run a kv-core or connector call for ``request``; its AssertionError / ValueError is an engine crash."""
        try:
            return call()
        except (AssertionError, ValueError) as exc:
            self._crash(_crash_reason(exc), request)

    def _crash(self, reason: str, request: Request) -> NoReturn:
        crash = EngineCrash(reason, request.request_id, self.step)
        if self.on_crash == "record":
            self.crashes.append(crash)
        raise crash

    def _record_admission(self, attempt: AdmissionAttempt) -> None:
        """The attempt's one ``admissions`` row. ``num_computed_tokens`` is where an allocated request
        resumes, else where the request stands."""
        if self.recorder is None:
            return
        request = attempt.request
        allocated = attempt.outcome not in ("not_admitted", "crash")
        self.recorder.record_admission(
            request_id=request.request_id,
            prompt_tokens=request.num_prompt_tokens,
            hits=attempt.hits,
            local_tokens=attempt.local,
            external_tokens=attempt.ext,
            hit_diverged=attempt.hit_diverged,
            fallback=attempt.fallback,
            policy=self.prefix_policy.name,
            outcome=attempt.outcome,
            crash_reason=attempt.crash_reason,
            kind=attempt.kind,
            reason=attempt.reason,
            num_computed_tokens=attempt.computed if allocated else request.num_computed_tokens,
            tokens_lost=attempt.tokens_lost,
            taint_origin=attempt.taint_origin,
            lookup_seq=attempt.lookup_seq,
            connector_asked_at=attempt.asked_at,
            connector_answer=attempt.answer,
        )

    def _preempt_request(self, request: Request) -> None:
        """Recompute preemption: free every block, back to the front of ``waiting``.

        Its ``schedule`` row (0 tokens, ``preempted=True``) carries the
        computed tokens it lost.
        """
        if self.recorder is not None:
            self.recorder.record_schedule(request.request_id, "running", 0, request.num_computed_tokens, True)
        self.kv.free(request)
        self._inflight_prefills.pop(request.request_id, None)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.prepend(request)

    def _update_after_schedule(self, out: SchedulerOutput, kinds: dict[str, str]) -> None:
        """Advance ``num_computed_tokens`` of every scheduled request (vLLM ``_update_after_schedule``).

        ``kinds`` holds the schedule-row kind of new and resumed requests; the
        others were scheduled from ``running``. Also sums the batch for the
        step-time model (decodes, prefill chunks) and lists the requests that
        sample a token in ``update_from_output``.

        ``Request.num_in_flight_tokens`` is not advanced: without async
        scheduling a step's tokens are computed before the next ``schedule()``
        and nothing reads the count inside the step, so vLLM's increment here
        and decrement in ``update_from_output`` always meet at 0 where it is read.
        """
        for req_id, n in out.num_scheduled_tokens.items():
            request = self.requests[req_id]
            before = request.num_computed_tokens
            request.num_computed_tokens += n
            out.computed_before.append(before)
            num_tokens = request.num_tokens
            if request.num_computed_tokens < num_tokens:  # vLLM's `is_prefill_chunk`
                out.prefill_tokens += n
                out.prefill_chunks.append((n, before))
                continue
            self._inflight_prefills.pop(req_id, None)
            out.sampling_reqs.append(request)
            if n == 1 and request.num_computed_tokens == num_tokens:
                out.decode_tokens += 1
                out.decode_context_tokens += before
            else:
                out.prefill_tokens += n
                out.prefill_chunks.append((n, before))
        self._record_schedule_rows(out, kinds)

    def _record_schedule_rows(self, out: SchedulerOutput, kinds: dict[str, str]) -> None:
        """The step's ``schedule`` rows, one per scheduled request (``kinds``: new / resumed, else running)."""
        rec = self.recorder
        if rec is not None and rec.schedule_enabled:
            rids = list(out.num_scheduled_tokens)
            row_kinds = [kinds.get(rid, "running") for rid in rids]
            rec.record_schedule_rows(rids, row_kinds, list(out.num_scheduled_tokens.values()), out.computed_before)

    def update_from_output(self, out: SchedulerOutput) -> list[Request]:
        """Apply the step's model output; returns the requests that finished.

        Each scheduled request whose known tokens are now all computed samples
        one token (as vLLM's scheduler tests fabricate model output) and stops
        on ``output_len`` (the workload's EOS), ``max_tokens`` or ``max_model_len``.
        """
        finished: list[Request] = []
        # Prefill chunks that leave tokens to compute sample nothing; `sampling_reqs` skips them.
        for request in out.sampling_reqs:
            if request.status is not RequestStatus.RUNNING:
                continue  # finished, preempted or failed meanwhile
            request.append_output_tokens(1)
            status = self._stop_status(request)
            if status is not None:
                self._finish_stopped(request, status)
                finished.append(request)
        self._drain_events()
        self.step += 1
        return finished

    def _finish_stopped(self, request: Request, status: RequestStatus) -> None:
        """A running request that sampled its last token: ``status`` set, out of ``running``, freed."""
        request.status = status
        self.running.remove(request)
        self._free_request(request)

    def _stop_status(self, request: Request) -> RequestStatus | None:
        """vLLM ``check_stop`` order: EOS (here: the workload's ``output_len``), then length caps."""
        if request.num_output_tokens >= request.output_len and request.output_len < request.max_tokens:
            return RequestStatus.FINISHED_STOPPED
        if request.num_tokens >= self.max_model_len or request.num_output_tokens >= request.max_tokens:
            return RequestStatus.FINISHED_LENGTH_CAPPED
        return None

    def _drain_events(self) -> None:
        log = self.kv.take_event_log()
        if self.connector is not None:
            log.extend(self.connector.take_events())
        if self.recorder is not None and len(log):
            self.recorder.record_kv_event_log(log)

    def _reorder_waiting_by_cached_prefix(self) -> None:
        """vLLM 0.34 cache-aware admission: within the window, plain waiting requests with the deepest cached
        prefix go first.

        Only requests that are ``WAITING`` with nothing computed move, among the slots they hold (ties keep
        their order); a preempted or partly computed request keeps its exact position, and nothing beyond
        the window moves. Off below the usage threshold. Reads the cache only (``get_num_cached_tokens``).
        """
        waiting = self.waiting
        if len(waiting) < 2 or self.kv.usage < self.config.cache_aware_admission_threshold:
            return
        head = waiting.head(self.cache_aware_window)
        slots = [i for i, r in enumerate(head) if r.status == RequestStatus.WAITING and not r.num_computed_tokens]
        if len(slots) < 2:
            return
        cached = {i: self.kv.get_num_cached_tokens(head[i]) for i in slots}
        order = sorted(slots, key=lambda i: (-cached[i], i))
        if order == slots:
            return
        reordered = list(head)
        for slot, source in zip(slots, order):
            reordered[slot] = head[source]
        waiting.replace_head(reordered)

    def _next_waiting_queue(self, take_async: bool) -> _WaitQueue:
        """vLLM 0.34: ``waiting`` or ``async_kv_waiting``, whichever head goes first (arrival order; priority
        order under the priority policy; a tie goes to ``waiting``)."""
        async_kv = self.async_kv_waiting
        if not take_async or not len(async_kv):
            return self.waiting
        if not len(self.waiting):
            return async_kv
        first, head = async_kv.peek(), self.waiting.peek()
        if self.priority:
            ahead = (first.priority, first.arrival_time, first.request_id) < (
                head.priority,
                head.arrival_time,
                head.request_id,
            )
        else:
            ahead = first.arrival_time < head.arrival_time
        return async_kv if ahead else self.waiting

    def _admits_inflight_kv_load(self) -> bool:
        """vLLM 0.34: whether one more async load stays within ``max_num_inflight_kv_loads``."""
        cap = self.config.max_num_inflight_kv_loads
        return cap is None or len(self._kv_loads_held) + len(self._aborted_kv_loads) < cap

    @staticmethod
    def _holds_kv_blocks(request: Request) -> bool:
        return request.num_computed_tokens > 0 or request.status == RequestStatus.WAITING_FOR_REMOTE_KVS

    def _enqueue_waiting_request(self, request: Request) -> None:
        """vLLM 0.34: block holders, async loads (with a load cap) and the rest wait in their own queues."""
        if self._holds_kv_blocks(request):
            self.kv_holding_waiting.add(request)
        elif (
            self.connector is not None
            and self.config.max_num_inflight_kv_loads
            and self.connector.may_load_async(request)
        ):
            self.async_kv_waiting.add(request)
        else:
            self.waiting.add(request)

    def get_request_counts(self) -> tuple[int, int]:
        """``(running, waiting)``; waiting includes requests parked on an async load and the async queue."""
        return len(self.running), len(self.waiting) + len(self.kv_holding_waiting) + len(self.async_kv_waiting)

    def has_unfinished_requests(self) -> bool:
        return bool(self.running or len(self.waiting) or len(self.kv_holding_waiting) or len(self.async_kv_waiting))

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting) + len(self.kv_holding_waiting) + len(self.async_kv_waiting)

    def add_request(self, request: Request) -> None:
        """Queue a new request (vLLM ``add_request``); injects its block hasher."""
        if request.request_id in self.requests:
            raise ValueError(f"request {request.request_id!r}: duplicate request id")
        if request.num_prompt_tokens > self.max_model_len:
            raise ValueError(
                f"request {request.request_id!r}: prompt of {request.num_prompt_tokens} tokens is longer than "
                f"max_model_len {self.max_model_len}"
            )
        request.set_block_hasher(self._block_hasher)
        if self.checkpoint_policy is not None:
            self.checkpoint_policy.on_arrival(request, self._prompt_block_hashes(request))
        self.requests[request.request_id] = request
        if self.connector is not None:
            self.connector.on_new_request(request)  # vLLM 0.34: before enqueueing (may_load_async may read it)
        self._enqueue_waiting_request(request)

    def finish_requests(self, request_ids: str | Iterable[str], status: RequestStatus) -> list[Request]:
        """Finish requests from outside (abort); returns those that were not finished yet."""
        if not status.is_finished:
            raise ValueError(f"finish_requests: {status.name} is not a finished status")
        ids = (request_ids,) if isinstance(request_ids, str) else tuple(request_ids)
        done: list[Request] = []
        for rid in ids:
            request = self.requests.get(rid)
            if request is None or request.is_finished():
                continue
            self._remove_from_queues(request)
            delay_free = (
                request.status == RequestStatus.WAITING_FOR_REMOTE_KVS and rid not in self.finished_recving_kv_req_ids
            )
            self.finished_recving_kv_req_ids.discard(rid)
            request.status = status
            self._free_request(request, delay_free_blocks=delay_free)
            if delay_free and self.config.max_num_inflight_kv_loads is not None:
                self._aborted_kv_loads.add(rid)  # vLLM 0.34: it holds its blocks until the load reports done
            done.append(request)
        return done

    def _remove_from_queues(self, request: Request) -> None:
        if request.status == RequestStatus.RUNNING:
            self.running.remove(request)
        else:
            self.waiting.remove({request})
            self.kv_holding_waiting.remove({request})
            self.async_kv_waiting.remove({request})

    def _fail_request(self, request: Request) -> None:
        """``on_crash="record"``: the crashing request fails, the engine goes on."""
        self._remove_from_queues(request)
        request.status = RequestStatus.FINISHED_ERROR
        self._free_request(request)

    def _free_request(self, request: Request, delay_free_blocks: bool = False) -> None:
        """vLLM ``_free_request``: tell the connector, then free unless it still sends."""
        self._inflight_prefills.pop(request.request_id, None)
        self._kv_loads_held.discard(request.request_id)
        if self.connector is not None:
            delay_free_blocks |= self._connector_finished(request)
        self.finished_req_ids.add(request.request_id)
        self.num_finished += 1
        if not delay_free_blocks:
            self._free_blocks(request)

    def _free_blocks(self, request: Request) -> None:
        self.kv.free(request)
        self.requests.pop(request.request_id, None)

    def _connector_finished(self, request: Request) -> bool:
        processed = max(0, request.num_computed_tokens - request.num_in_flight_tokens)
        self.kv.remove_skipped_blocks(request.request_id, processed)
        block_ids = self.kv.get_block_ids_for_computed_tokens(request.request_id, request.num_computed_tokens)
        connector = self.connector
        assert connector is not None, "_connector_finished needs a connector"
        if connector.supports_hma:
            delay, _ = connector.request_finished_all_groups(request, block_ids)
        else:
            delay, _ = connector.request_finished(request, block_ids[0])
        return bool(delay)

    def _request_remaining_blocks(self, request: Request) -> int:
        """vLLM ``_request_remaining_blocks``: blocks to hold the full sequence (admission cap applied)."""
        full = min(request.num_tokens, self.max_model_len)
        return self.kv.coordinator.get_num_blocks_to_allocate(
            request_id=request.request_id,
            num_tokens=full,
            new_computed_blocks=self.kv.empty_kv_cache_blocks.blocks,
            total_computed_tokens=request.num_computed_tokens,
            num_local_computed_tokens=request.num_computed_tokens,
            num_tokens_main_model=full,
            apply_admission_cap=True,
            prefill_end=max(request.num_prompt_tokens, request.num_tokens - 1),
        )

    def _inflight_prefill_reserved_blocks(self) -> int:
        """Blocks the in-flight prefills still need (vLLM gates async loads on it)."""
        return sum(self._request_remaining_blocks(r) for r in self._inflight_prefills.values())

    def _update_waiting_for_remote_kv(self, request: Request) -> None:
        """The load finished: cache the loaded blocks; a whole-prompt load recomputes the last token."""
        self.kv.cache_blocks(request, request.num_computed_tokens)
        if request.num_computed_tokens == request.num_tokens:
            request.num_computed_tokens = request.num_tokens - 1
        self.finished_recving_kv_req_ids.discard(request.request_id)

    def update_from_kv_xfer_finished(
        self, finished_recving: Iterable[str] = (), finished_sending: Iterable[str] = ()
    ) -> None:
        """The connector's finished transfers (vLLM ``_update_from_kv_xfer_finished``)."""
        for rid in finished_recving:
            request = self.requests.get(rid)
            if request is None:
                continue
            if request.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
                self.finished_recving_kv_req_ids.add(rid)
            elif request.is_finished():
                self._aborted_kv_loads.discard(rid)
                self._free_blocks(request)
        for rid in finished_sending:
            request = self.requests.get(rid)
            if request is not None:
                self._free_blocks(request)
