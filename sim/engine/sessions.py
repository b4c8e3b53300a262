"""Closed-loop sessions: completions release the next turns (``workload.sessions: {mode: closed}``).

The driver holds back every request that waits for others (its
``metadata['parents']``, see :mod:`sim.workload.sessions`) and, with
``concurrency: N``, every session beyond the first N. The engine loop calls
:meth:`SessionDriver.on_finished` once per step with the requests that
finished in it and the step's end time; the driver sets each newly free
request's ``arrival_time`` and hands it to the loop's ``release``, which
queues it like any other arrival. There is no SimPy process or event per
session: a release is computed when its last parent finishes, so it costs
nothing while it waits, and its admission point follows the loop's one
arrival rule ("arrival <= now, just before the step's schedule()") instead of
depending on SimPy's ordering of simultaneous events.

Release rule (pinned by tests on the step clock): a request whose last parent
finishes in step ``k`` (so at the end of step ``k``, time ``k + 1`` on the
step clock) is released at ``k + 1 + think`` and added just before step
``k + 1 + think``'s ``schedule()``; ``think = 0`` means the very next step.
With ``clock: time`` the same rule reads "finish time + think seconds".

``think`` is the request's ``think_s`` when the workload gives one, else (a
trace) ``max(min_think, gap_s - (finish - parent.arrival_time))``: the
recorded gap minus the simulated response time of the parent that finished
last.

With ``concurrency: N`` sessions start in workload order: N at time 0, then
one each time a session's last request finishes (at that time); a session's
first requests keep their offsets from its earliest one (fan-out spacing).

Limits: a request that never finishes (it failed with ``on_crash: record``,
or the run stopped) never releases its children, which end ``not_arrived``;
with ``concurrency`` its session then keeps its slot.
"""

from __future__ import annotations

from typing import Callable, Sequence

from sim.core.request import Request
from sim.workload.sessions import session_meta
from sim.workload.spec import SessionSpec


class SessionDriver:
    """Releases held requests when their parents finish; see the module docstring."""

    def __init__(self, requests: Sequence[Request], spec: SessionSpec) -> None:
        self.min_think = spec.min_think
        self.release: Callable[[Request], None] = lambda request: None
        #: The think time each released dependent request actually got (seconds or steps).
        self.think_used: dict[str, float] = {}
        self._children: dict[str, list[Request]] = {}
        self._waiting_on: dict[str, int] = {}
        self._outstanding: dict[str, int] = {}
        self._roots: dict[str, list[Request]] = {}
        for r in requests:
            meta = session_meta(r.metadata)
            session = meta["session"]
            self._outstanding[session] = self._outstanding.get(session, 0) + 1
            parents = meta["parents"]
            if parents:
                self._waiting_on[r.request_id] = len(parents)
                for p in parents:
                    self._children.setdefault(p, []).append(r)
            else:
                self._roots.setdefault(session, []).append(r)
        order = list(self._roots)
        self._queued: list[str] = []
        if spec.concurrency is not None:
            self._queued = order[spec.concurrency :][::-1]
            for session in order[: spec.concurrency]:
                self._start(session, 0.0)
        held = {r.request_id for roots in (self._roots[s] for s in self._queued) for r in roots}
        self.initial: list[Request] = [
            r for r in requests if r.request_id not in self._waiting_on and r.request_id not in held
        ]

    def _start(self, session: str, at: float) -> None:
        roots = self._roots[session]
        first = min(r.arrival_time for r in roots)
        for r in roots:
            r.arrival_time = at + (r.arrival_time - first)

    def on_finished(self, finished: list[Request], now: float) -> None:
        """The requests that finished at ``now``: release what they unblock."""
        for parent in finished:
            for child in self._children.get(parent.request_id, ()):
                self._waiting_on[child.request_id] -= 1
                if self._waiting_on[child.request_id] == 0:
                    child.arrival_time = self._release_time(child, parent, now)
                    self.think_used[child.request_id] = child.arrival_time - now
                    self.release(child)
            session = session_meta(parent.metadata)["session"]
            self._outstanding[session] -= 1
            if self._outstanding[session] == 0 and self._queued:
                nxt = self._queued.pop()
                self._start(nxt, now)
                for r in self._roots[nxt]:
                    self.release(r)

    def _release_time(self, child: Request, last_parent: Request, now: float) -> float:
        """``now + think``; for a trace written as ``max(now + min_think, parent arrival + gap)``, the same
        value without cancellation, so an unloaded closed replay releases at exactly the recorded time."""
        meta = session_meta(child.metadata)
        given = meta.get("think_s")
        if given is not None:
            return now + float(given)
        gap = meta["gap_s"]
        assert gap is not None  # annotate_sessions sets gap_s for every trace dependent without a think time
        return max(now + self.min_think, last_parent.arrival_time + float(gap))
