"""The SimPy engine: one process that steps the pure scheduler.

The engine owns the simulated clock. Each engine step is one
``Scheduler.schedule()`` / ``update_from_output()`` pair and one SimPy
timeout of the step's duration (1 with ``clock: steps``, the step-time model's
answer with ``clock: time``). There is one SimPy event per engine step, never
one per token or per block; connector transfers are their own SimPy
processes (``sim.engine.transfer``) and wake the engine when it is idle.

Ordering inside a step (docs/design.md §5): at the start of step ``k`` (time
``t``) the engine

1. applies the scripted actions due at step ``k`` (their KV events belong to
   step ``k``),
2. adds the requests that have arrived (``arrival <= t``; with
   ``clock: steps`` a request with ``at: k`` arrives just before step ``k``),
   unless the connector routes one elsewhere first (``route_arrival``: a P/D
   proxy sends it to the prefill instance),
3. advances the transfers due, adds the requests the connector handed over
   since the last step (in hand-over order) and hands the connector's finished
   transfers to the scheduler,
4. calls ``schedule()``, waits the step's duration, then calls
   ``update_from_output()`` (tokens sampled in a step exist at its end).

Arrivals are fed by the engine loop itself from the time-sorted workload
rather than by a separate SimPy process: SimPy orders simultaneous events by
scheduling order, and "arrived just before step k" must not depend on that.
The workload is an :class:`ArrivalSource`: a sorted list, or a streamed trace
(:class:`sim.workload.stream.StreamedTrace`) whose requests are made as they
arrive; with ``record_finished`` a finished request's ``requests`` row is
recorded at once and the loop lets go of it, so a long trace's requests are
held only while they run.
When nothing is runnable the engine sleeps until the next arrival, the next
due action or a connector wake-up, whichever is first (unless the connector
counts an in-flight load in engine steps: then it keeps stepping, as vLLM's
engine does until ``finished_recving`` arrives); with ``clock: steps``
the step counter then jumps to the step of that arrival.

Invariants: the step number strictly increases; simulated time never
decreases; every request given to the engine ends in exactly one
``requests`` row (finished, failed, or unfinished when the run stops).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any, Callable, Generator, Iterator, Protocol, Sequence, runtime_checkable

import simpy

from sim.connector.protocol import Connector
from sim.core.kv.kv_cache_manager import KVCacheManager
from sim.core.request import Request, RequestStatus
from sim.core.scheduler import EngineCrash, Scheduler, SchedulerOutput
from sim.engine.transfer import EngineTransferService
from sim.trace.recorder import Recorder


@runtime_checkable
class ArrivalSource(Protocol):
    """A workload in arrival order whose request ``i`` is made when the loop takes it
    (:class:`sim.workload.stream.StreamedTrace`, or an :class:`ArrivalList`)."""

    def __len__(self) -> int: ...

    def arrival_time(self, i: int) -> float: ...

    def take(self, i: int) -> Request: ...


class ArrivalList(list):
    """Requests sorted by arrival time, as an :class:`ArrivalSource` (each taken as it is)."""

    def arrival_time(self, i: int) -> float:
        return self[i].arrival_time

    def take(self, i: int) -> Request:
        return self[i]


@dataclass(slots=True)
class RequestTimes:
    """Timestamps of one request on the simulated clock (seconds or steps)."""

    first_scheduled: float | None = None
    first_token: float | None = None
    finished: float | None = None
    #: The step just before whose ``schedule()`` the request was added (on either clock).
    arrival_step: int = 0


@dataclass
class CrashInfo:
    """The crash that stopped (or, recorded, marked) a run."""

    step: int
    time_s: float
    request_id: str | None
    reason: str


@dataclass
class Action:
    """A scripted intervention applied just before step ``at`` (or at time ``at_s``)."""

    at: int | None
    at_s: float | None
    apply: Callable[[], object]
    description: str


class StopRun(Exception):
    """Raised inside the engine to end the run early (crash with ``on_crash: stop``)."""


@dataclass
class EngineLoop:
    """Steps a :class:`Scheduler` on a SimPy clock; see the module docstring."""

    env: simpy.Environment
    scheduler: Scheduler
    #: The workload: requests in any order (sorted by arrival here), or an :class:`ArrivalSource` as it is.
    requests: Sequence[Request] | ArrivalSource
    clock: str
    step_duration: Callable[[SchedulerOutput, Scheduler], float]
    recorder: Recorder
    kv_manager: KVCacheManager
    connector: Connector | None = None
    transfers: EngineTransferService | None = None
    actions: Sequence[Action] = ()
    on_crash: str = "stop"
    check_invariants: Callable[[], None] | None = None
    step_columns: Callable[[], dict[str, Any]] | None = None
    progress: Callable[[int, float, int], None] | None = None
    max_steps: int | None = None
    #: Called once per step with the requests that finished in it and the step's end time
    #: (closed-loop sessions, :mod:`sim.engine.sessions`); it may call :meth:`release`.
    on_finished: Callable[[list[Request], float], None] | None = None
    #: While this returns True the loop never ends or stalls for want of work: more requests may still be
    #: released to it (a cluster's router, :mod:`sim.cluster.run`); it sleeps until :meth:`wake`.
    held_open: Callable[[], bool] | None = None
    #: A stall ends this loop's process (``stalled`` set) instead of stopping the run: a cluster's instance,
    #: whose stall leaves the other instances running (the cluster reports it at the end).
    stall_ends_loop: bool = False
    #: Retire each request as it finishes (:meth:`Request.retire`): only when nothing reads a finished
    #: request's prompt or block hashes after its step (no connector, no sessions, no cluster, no ideal hit rate).
    retire_finished: bool = False
    #: Record each request's ``requests`` row as it finishes (:func:`sim.engine.request_rows.record_row`, with
    #: a provisional outcome: ``failed``, or ``ok`` until the run's admissions are known) and let go of the
    #: request and its times; the run records the rest and settles the outcomes after it ends. Only where
    #: nothing reads a finished request afterwards (as ``retire_finished``) and no request is released.
    record_finished: bool = False

    times: dict[str, RequestTimes] = field(default_factory=dict)
    #: Arrived requests the connector routed and has handed over since the last step (``route_arrival``).
    handed_over: list[Request] = field(default_factory=list)
    crash: CrashInfo | None = None
    step: int = 0
    #: Requests finished so far (for the progress display).
    num_finished: int = 0
    wake_event: simpy.Event | None = None
    stalled: bool = False
    _next_request: int = 0
    _idle: bool = False
    #: Set by :meth:`wake` (something reached the engine); not by :meth:`recheck`.
    _woken_for_work: bool = False

    def __post_init__(self) -> None:
        self._actions_by_step: dict[int, list[Action]] = {}
        self._timed_actions: list[Action] = sorted(
            (a for a in self.actions if a.at is None), key=lambda a: a.at_s or 0.0
        )
        for action in self.actions:
            if action.at is not None:
                self._actions_by_step.setdefault(action.at, []).append(action)
        if not isinstance(self.requests, ArrivalSource):
            self.requests = ArrivalList(sorted(self.requests, key=lambda r: r.arrival_time))
        self._source: ArrivalSource = self.requests
        #: The arrived requests the loop still holds (all of them unless ``record_finished``), by id.
        self._by_id: dict[str, Request] = {}
        #: Requests scheduled at least once whose first token has not come yet.
        self._awaiting_first_token: dict[str, RequestTimes] = {}
        if self.transfers is not None:
            self.transfers.on_complete = self.wake
        self.process = self.env.process(self._run())

    def release(self, request: Request) -> None:
        """Queue a request that was held back; its ``arrival_time`` must not be in the past."""
        assert request.arrival_time >= self.env.now, (request.request_id, request.arrival_time, self.env.now)
        requests = self.requests
        assert isinstance(requests, ArrivalList) and not self.record_finished
        bisect.insort(requests, request, lo=self._next_request, key=_arrival_time)
        self._by_id[request.request_id] = request

    def close(self) -> None:
        """After the run: the transfer service no longer calls back into the loop. That call-back is a
        reference cycle (loop -> transfers -> loop.wake) that would keep the whole run (scheduler, pool,
        recorder) alive after its last use, until the cyclic collector found it."""
        if self.transfers is not None:
            self.transfers.on_complete = None

    # ------------------------------------------------------------ wake-ups
    def wake(self) -> None:
        """Something reached the engine (a transfer completed, a request was released to it): an idle engine
        takes a step."""
        self._woken_for_work = True
        if self.wake_event is not None and not self.wake_event.triggered:
            self.wake_event.succeed()

    def recheck(self) -> None:
        """Nothing reached the engine, but what it waits for may have changed (a cluster will route no more
        requests): an idle engine looks again whether it must end (or stall) without taking a step, as one
        engine whose last request has arrived does (and as vLLM's harness does: an idle engine goes to its
        next arrival, and with none left it has stalled)."""
        if self.wake_event is not None and not self.wake_event.triggered:
            self.wake_event.succeed()

    def _next_wakeup(self) -> float | None:
        """The earliest simulated time at which something new can happen."""
        candidates: list[float] = []
        arrival = self.next_arrival_time()
        if arrival is not None:
            candidates.append(arrival)
        if self.clock == "steps" and self._actions_by_step:
            # Applied steps are popped, and the steps clock visits every step while busy.
            candidates.append(float(min(self._actions_by_step)))
        if self._timed_actions:
            candidates.append(float(self._timed_actions[0].at_s or 0.0))
        due = self.transfers.next_due_step() if self.transfers is not None else None
        if due is not None:
            candidates.append(float(due))
        return min(candidates) if candidates else None

    def next_arrival_time(self) -> float | None:
        """The arrival time of the next request not yet taken (``None``: every request was taken)."""
        if self._next_request < len(self.requests):
            return float(self._source.arrival_time(self._next_request))
        return None

    def held_requests(self) -> list[Request]:
        """The arrived requests the loop still holds, in arrival order (every arrived one unless
        ``record_finished``: then those whose row is not recorded yet)."""
        return list(self._by_id.values())

    def not_arrived(self) -> Iterator[Request]:
        """The requests never taken, made one at a time, in arrival order."""
        return map(self._source.take, range(self._next_request, len(self._source)))

    # ---------------------------------------------------------------- loop
    def _admit_arrivals(self) -> None:
        now = self.env.now
        connector = self.connector
        source = self._source
        while self._next_request < len(source) and source.arrival_time(self._next_request) <= now:
            request = source.take(self._next_request)
            self._next_request += 1
            self._by_id[request.request_id] = request
            self.times[request.request_id] = RequestTimes(arrival_step=self.step)
            if connector is None or not connector.route_arrival(request, self.handed_over.append):
                self.scheduler.add_request(request)

    def _add_handed_over(self) -> None:
        """The routed requests the connector handed over since the last step join the scheduler."""
        handed = list(self.handed_over)
        self.handed_over.clear()  # in place: the connector holds ``self.handed_over.append``
        for request in handed:
            self.scheduler.add_request(request)

    def _apply_actions(self) -> None:
        for action in self._actions_by_step.pop(self.step, ()):
            action.apply()
        while self._timed_actions and (self._timed_actions[0].at_s or 0.0) <= self.env.now:
            self._timed_actions.pop(0).apply()

    def _has_work(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def _run(self) -> Generator[simpy.Event, Any, None]:
        env = self.env
        while True:
            if (self._idle or not self._has_work()) and not self._due_now() and not self._counting_loads():
                nxt = self._next_wakeup()
                if nxt is None and not self._transfers_pending() and not self._is_held_open():
                    if self._has_work():
                        self.stalled = True
                        if self.stall_ends_loop:
                            return
                        raise StopRun("stalled: requests are waiting but none can be scheduled and nothing is pending")
                    return
                self.wake_event = env.event()
                self._woken_for_work = False
                if nxt is not None and nxt > env.now:
                    yield env.timeout(nxt - env.now) | self.wake_event
                elif nxt is None:
                    yield self.wake_event
                self.wake_event = None
                if not self._woken_for_work and (nxt is None or env.now < nxt) and not self._due_now():
                    continue  # only a recheck(): look again, without a step
                self._idle = False
                if self.clock == "steps":
                    self.step = max(self.step, int(env.now))
            if self.max_steps is not None and self.step >= self.max_steps:
                raise StopRun(f"max_steps {self.max_steps} reached")
            yield from self._one_step()

    def _is_held_open(self) -> bool:
        return self.held_open is not None and self.held_open()

    @property
    def num_pending_arrivals(self) -> int:
        """Requests given to the loop that it has not yet handed to the scheduler."""
        return len(self.requests) - self._next_request

    def _due_now(self) -> bool:
        if self.handed_over:
            return True
        arrival = self.next_arrival_time()
        if arrival is not None and arrival <= self.env.now:
            return True
        if self.step in self._actions_by_step:
            return True
        return bool(self._timed_actions and (self._timed_actions[0].at_s or 0.0) <= self.env.now)

    def _counting_loads(self) -> bool:
        """The connector counts an in-flight load in engine steps: keep stepping (no idle sleep)."""
        return self.connector is not None and self.connector.has_step_counted_loads()

    def _transfers_pending(self) -> bool:
        """A transfer is in flight: its completion can make a waiting request runnable."""
        return self.transfers is not None and self.transfers.pending()

    def _one_step(self) -> Generator[simpy.Event, Any, None]:
        env = self.env
        sched = self.scheduler
        rec = self.recorder
        kv = self.kv_manager
        rec.set_clock(self.step, float(env.now))
        sched.step = self.step
        if self._actions_by_step or self._timed_actions:
            self._apply_actions()
        if self._next_request < len(self.requests):
            self._admit_arrivals()
        self._record_kv_events()  # the actions' events belong to this step
        if self.transfers is not None:
            self.transfers.advance(self.step)
        if self.handed_over:
            self._add_handed_over()
        if self.connector is not None:
            recving, sending = self.connector.get_finished()
            if recving or sending:
                sched.update_from_kv_xfer_finished(sorted(recving), sorted(sending))
            errors = self.connector.get_block_ids_with_load_errors()
            if errors:
                self.kv_manager.evict_blocks(sorted(errors), cause="load_error")
        try:
            output = sched.schedule()
        except EngineCrash as crash:
            self._on_crash(crash)
            return
        self._note_recorded_crashes()
        duration = 1.0 if self.clock == "steps" else self.step_duration(output, sched)
        start = float(env.now)
        times = self.times
        awaiting = self._awaiting_first_token
        scheduled = output.num_scheduled_tokens
        # Only a new or resumed request can be scheduled for the first time;
        # a running one was scheduled when it was admitted.
        for reqs in (output.scheduled_new_reqs, output.scheduled_resumed_reqs):
            for request in reqs:
                rid = request.request_id
                t = times.get(rid)
                if t is not None and t.first_scheduled is None and rid in scheduled:
                    t.first_scheduled = start
                    awaiting[rid] = t
        yield env.timeout(duration)
        end = float(env.now)
        finished = sched.update_from_output(output)
        if awaiting:
            # A first token can only come in a step that scheduled the request.
            by_id = self._by_id
            if len(awaiting) <= len(scheduled):
                candidates = [rid for rid in awaiting if rid in scheduled]
            else:
                candidates = [rid for rid in scheduled if rid in awaiting]
            for rid in candidates:
                if by_id[rid].num_output_tokens > 0:
                    awaiting.pop(rid).first_token = end
        for request in finished:
            self.times[request.request_id].finished = end
        if finished and self.on_finished is not None:
            self.on_finished(finished, end)
        if self.retire_finished:
            for request in finished:
                request.retire()
        if self.record_finished and finished:
            self._record_finished(finished)
        # Nothing ran and nothing moved: sleep until something new can happen.
        self._idle = not (output.num_scheduled_tokens or output.preempted_req_ids)
        self.num_finished += len(finished)
        running, waiting = sched.get_request_counts()
        rec.record_step(
            duration,
            running,
            waiting,
            output.prefill_tokens,
            output.decode_tokens,
            kv.num_free_blocks(),
            kv.num_blocks_per_group(),
            kv.num_cached_per_group(),
            self.step_columns() if self.step_columns is not None else None,
        )
        if self.check_invariants is not None:
            try:
                self.check_invariants()
            except AssertionError as exc:
                raise InvariantViolation(self.step, str(exc)) from None
        if self.progress is not None:
            self.progress(self.step, end, self.num_finished)
        self.step += 1
        if self.clock == "steps":
            self.step = max(self.step, int(env.now))

    def _record_finished(self, finished: list[Request]) -> None:
        from sim.engine.request_rows import provisional_outcome, record_row

        for request in finished:
            rid = request.request_id
            record_row(self.recorder, request, self.times.pop(rid), provisional_outcome(request))
            del self._by_id[rid]
            self._awaiting_first_token.pop(rid, None)

    def _record_kv_events(self) -> None:
        kv = self.kv_manager
        if not kv.num_pending_events:  # (most steps: taking the empty log would change nothing)
            return
        log = kv.take_event_log()
        if len(log):
            self.recorder.record_kv_event_log(log)

    def _note_recorded_crashes(self) -> None:
        """With ``on_crash: record`` the first recorded crash is the run's crash marker."""
        if self.crash is None and self.scheduler.crashes:
            first = self.scheduler.crashes[0]
            self.crash = CrashInfo(self.step, float(self.env.now), first.request_id, first.reason)

    def _on_crash(self, crash: EngineCrash) -> None:
        """``on_crash: stop``: the engine dies; every in-flight request fails."""
        self.crash = CrashInfo(self.step, float(self.env.now), crash.request_id, crash.reason)
        self._record_kv_events()
        raise StopRun(crash.reason)

    def fail_in_flight(self) -> None:
        """Mark every unfinished request as failed (the engine stopped)."""
        for request in self.scheduler.requests.values():
            if not request.is_finished():
                request.status = RequestStatus.FINISHED_ERROR


def _arrival_time(request: Request) -> float:
    return request.arrival_time


class InvariantViolation(Exception):
    """``--check-invariants`` found a broken invariant after a step."""

    def __init__(self, step: int, message: str) -> None:
        super().__init__(f"step {step}: invariant violated: {message}")
        self.step = step
        self.message = message
