"""An engine loop that takes a quiet stretch of steps as one SimPy event (single engine and cluster instances).

When every running request decodes, each engine step is one ``schedule()``, one ``update_from_output()``
and one SimPy event that change nothing but each request's two counters. :class:`StretchLoop` takes the
steps in which every running request takes a quiet decode (:mod:`sim.accel.stretch`) together: it works
out their durations (the step-time model of a decode-only batch, whose context grows by one token per
request per step), waits once for all of them, then applies them and records each step's rows as the plain
loop would (one ``steps`` row per step, with its own step number, start time and duration; the
``schedule`` rows when that table is on).

The bound: a stretch takes the next ``k`` steps when each of them is quiet (:func:`quiet_steps`) and each
starts strictly before the loop's own next request arrives. A step that starts at or after an arrival may
admit it and is not in the stretch. Nothing else can reach the engine in a stretch but a request
released to it (:meth:`StretchLoop.release`): the loop takes none while it has a connector (no tier, no P/D),
scripted actions still to apply, a transfer pending, requests handed over, an invariant check or step
columns; its builder takes a plain :class:`EngineLoop` when requests may be released at a time other than
their arrival's (closed-loop sessions, whose turns are released by finishes).

**Cut**: in a cluster the router releases each request to its instance at its arrival time, in an event
that runs before any engine step at that time (:class:`sim.cluster.run.ArrivalFeed`). A release into a
stretch keeps the stretch's steps that start strictly before the request's arrival and drops the rest: the
loop then wakes at the end of the last step kept (the plain loop's step in flight at the arrival, or the
one ending exactly then) and goes on as the plain loop does from that step's end, admitting the request
at the next ``schedule()``. An arrival routed to another instance does not end a stretch: what the router
reads of an instance inside one (queued requests, KV usage, its view of the KV events) does not change
during it (no request joins, finishes or allocates, and no KV event is published, so the view's delay does
not bound a stretch either), and an instance's steps depend on no other instance's.

Nothing is applied before the stretch's end: the requests' counters, the rows and the step number are
those of the stretch's start until then. If the run stops inside a stretch (a crash on another instance,
``max_steps`` of another instance, an interrupt), :meth:`StretchLoop.settle` applies the steps that had
ended by then and the ``schedule()`` of the one in flight, as the plain loop would have left them. When
the stop falls exactly on a step boundary inside the stretch, ``settle`` does not decide what the plain
loop had done at that instant (its step's end was an event at the stop time); it says so and the run is
redone without stretches (:meth:`sim.cluster.run.ClusterRun.execute`, :meth:`sim.engine.run.Run.execute`).
So is a cut whose end SimPy cannot land on exactly from the arrival time (it stops the run).
A stretch that ends at the stop time is not open then: SimPy processes the events already queued at a
time before an exception raised at that time stops the run. A loop's own ``max_steps`` caps its
stretches, so it stops on a boundary outside one.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Generator

import simpy

from sim.accel.decodes import QuietDecodeScheduler
from sim.accel.stretch import quiet_steps, take_quiet_steps
from sim.core.request import Request
from sim.engine.loop import EngineLoop, StopRun

if TYPE_CHECKING:
    from sim.engine.timing import StepTimeModel


@dataclass
class _Stretch:
    """A stretch in flight: the requests it decodes, its first step's number, and each step's start and
    duration (step ``first + i`` starts at ``starts[i]``)."""

    requests: list[Request]
    first: int
    starts: list[float]
    durations: list[float]
    #: ``num_computed_tokens`` of each request when the stretch began.
    computed: list[int]

    @property
    def end(self) -> float:
        return self.starts[-1] + self.durations[-1]


#: ``(requests, context, start, until, limit) ->`` the durations of the decode-only steps of a stretch
#: (:meth:`sim.engine.timing.StepTimeModel.decode_run`).
DecodeRun = Callable[[int, int, float, float, int], list[float]]


def decode_run_of(clock: str, model: StepTimeModel | None) -> DecodeRun:
    """The durations of a stretch's decode-only steps: what the engine loop's step duration
    (:func:`sim.engine.run._step_duration_fn`) gives each of them."""
    if clock == "steps" or model is None:
        return unit_steps
    return model.decode_run


def unit_steps(requests: int, context: int, start: float, until: float, limit: int) -> list[float]:
    """A :data:`DecodeRun` of steps of duration 1 (the step clock, or no step-time model)."""
    out: list[float] = []
    t = start
    while len(out) < limit and t < until:
        out.append(1.0)
        t += 1.0
    return out


@dataclass
class StretchLoop(EngineLoop):
    """:class:`~sim.engine.loop.EngineLoop` that takes quiet stretches as one event (module docstring)."""

    #: The durations of a run of decode-only steps (what the step duration gives each of them).
    decode_run: DecodeRun | None = None
    #: Steps taken in stretches so far, and stretches cut by a release (tests read them).
    num_stretch_steps: int = 0
    num_cuts: int = 0
    _stretch: _Stretch | None = field(default=None, repr=False)
    #: A cut that SimPy cannot land on exactly stopped the run (:meth:`settle` then says so).
    _inexact: bool = field(default=False, repr=False)

    def release(self, request: Request) -> None:
        """As :meth:`EngineLoop.release`; inside a stretch, cut it at the request's arrival (module docstring)."""
        super().release(request)
        plan = self._stretch
        if plan is None:
            return
        arrival = float(request.arrival_time)
        keep = bisect.bisect_left(plan.starts, arrival)
        assert keep >= 1, (plan.starts[0], arrival)  # (an arrival at the stretch's start is routed before it)
        if keep < len(plan.starts):
            del plan.starts[keep:], plan.durations[keep:]
            self.num_cuts += 1
            self.process.interrupt()

    def _one_step(self) -> Generator[simpy.Event, Any, None]:
        plan = self._plan()
        if plan is None:
            yield from super()._one_step()
            return
        env = self.env
        delay = _exact_delay(plan.starts[0], plan.end)
        assert delay is not None  # (_plan kept only stretches that have one)
        self._stretch = plan
        wait = env.timeout(delay)
        while True:
            try:
                yield wait
                break
            except simpy.Interrupt:  # (release cut the stretch: wait for its new end)
                delay = self._cut_delay(plan)
                if delay is None:
                    self._inexact = True
                    raise StopRun("a quiet stretch's cut cannot be timed exactly (the run is redone without)") from None
                wait = env.timeout(delay)
        end = plan.end
        assert env.now == end, (env.now, end)
        self._stretch = None
        count = len(plan.starts)
        self._apply(plan, count, count)
        self._idle = False
        self.step = plan.first + count
        if self.clock == "steps":
            self.step = max(self.step, int(env.now))

    def _cut_delay(self, plan: _Stretch) -> float | None:
        """The delay from now to the end of the cut ``plan`` that SimPy lands on exactly (None: there is none)."""
        return _exact_delay(float(self.env.now), plan.end)

    def _plan(self) -> _Stretch | None:
        """The stretch that starts now (two steps or more), or None (the next step is taken alone)."""
        if (
            self.decode_run is None
            or self.connector is not None
            or self.check_invariants is not None
            or self.step_columns is not None
            or self.handed_over
            or self._actions_by_step
            or self._timed_actions
            or (self.transfers is not None and self.transfers.pending())
        ):
            return None
        sched = self.scheduler
        limit = quiet_steps(sched)
        if self.max_steps is not None:
            limit = min(limit, self.max_steps - self.step)
        if limit < 2:
            return None
        horizon = math.inf
        arrival = self.next_arrival_time()
        if arrival is not None:
            horizon = arrival
        now = float(self.env.now)
        if not now < horizon:
            return None
        running = list(sched.running)
        computed = [r.num_computed_tokens for r in running]
        durations = self.decode_run(len(running), sum(computed), now, horizon, limit)
        starts: list[float] = []
        t = now
        for d in durations:
            starts.append(t)
            t += d
        while len(starts) >= 2 and _exact_delay(now, starts[-1] + durations[-1]) is None:
            starts.pop()  # (SimPy adds the delay to now: no delay lands on this end exactly)
            durations.pop()
        if len(starts) < 2:
            return None
        return _Stretch(running, self.step, starts, durations, computed)

    def _apply(self, plan: _Stretch, steps: int, scheduled: int) -> None:
        """Apply the stretch's first ``steps`` steps, and the ``schedule()`` of the next one if ``scheduled`` is
        one more; record their rows as the plain loop does."""
        sched = self.scheduler
        assert isinstance(sched, QuietDecodeScheduler)
        rec = self.recorder
        kv = self.kv_manager
        requests = plan.requests
        n = len(requests)
        if rec.schedule_enabled:
            rids = [r.request_id for r in requests]
            kinds = ["running"] * n
            ones = [1] * n
            for i in range(scheduled):
                rec.set_clock(plan.first + i, plan.starts[i])
                rec.record_schedule_rows(rids, kinds, ones, [c + i for c in plan.computed])
        if steps:
            rec.record_steps(
                plan.first,
                plan.starts[:steps],
                plan.durations[:steps],
                n,
                0,
                0,
                n,
                kv.num_free_blocks(),
                kv.num_blocks_per_group(),
                kv.num_cached_per_group(),
            )
        if self.progress is not None:
            for i in range(steps):
                self.progress(plan.first + i, plan.starts[i] + plan.durations[i], self.num_finished)
        rec.set_clock(plan.first + scheduled - 1, plan.starts[scheduled - 1])
        take_quiet_steps(sched, requests, steps, scheduled)
        sched.step = plan.first + steps
        self.num_stretch_steps += steps

    def settle(self) -> bool:
        """The run stopped now, inside this loop's stretch (if it is in one): apply what the plain loop had
        done by now. False when that is not known (now is a step boundary inside the stretch)."""
        plan = self._stretch
        if self._inexact:
            return False
        if plan is None:
            return True
        self._stretch = None
        now = float(self.env.now)
        ends = [s + d for s, d in zip(plan.starts, plan.durations)]
        if now in ends or now in plan.starts[1:]:
            return False
        done = sum(1 for e in ends if e < now)
        self._apply(plan, done, done + 1)
        self.step = plan.first + done
        return True


def _exact_delay(start: float, end: float) -> float | None:
    """A delay that SimPy adds to ``start`` to land exactly on ``end`` (None if there is none nearby)."""
    delay = end - start
    for candidate in (delay, math.nextafter(delay, math.inf), math.nextafter(delay, -math.inf)):
        if start + candidate == end and candidate >= 0:
            return candidate
    return None
