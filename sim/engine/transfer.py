"""Transfer links: how long a connector's load or store takes.

The only module where connector transfers meet SimPy. Connectors see the
``Link`` / ``TransferService`` protocols of :mod:`sim.connector.context`;
the engine builds one of the two services below and hands it over in the
``ConnectorContext``.

* :class:`SimPyTransferService` (``clock: time``) makes :class:`TransferLink`
  objects: every transfer first pays the link's base latency, then moves its
  bytes. The bandwidth is shared equally among the transfers in flight
  (processor sharing), or, with ``concurrency = k``, among at most ``k`` of
  them while later ones wait FIFO. One SimPy process per link re-plans at each
  arrival or completion; there is no per-byte or per-block event.
* :class:`StepTransferService` (``clock: steps``) makes :class:`StepLink`
  objects: a transfer submitted while the engine is at step ``k`` completes
  when the engine calls ``advance(k + n)`` with ``n = ceil(steps *
  slowdown)``, i.e. at the start of step ``k + n`` before
  ``connector.get_finished()``.

Callbacks of transfers that complete at the same instant fire in submission
order, so a run is deterministic.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Protocol

import simpy

from sim.connector.context import ClockKind, LinkSpec, LinkStats, TransferService

#: A transfer with less than this many seconds of work left is complete (float slack).
_TIME_EPS = 1e-12


@dataclass(slots=True)
class _Transfer:
    seq: int
    remaining: float
    on_done: Callable[[], None]


class TransferLink:
    """A SimPy link with a base latency and a shared bandwidth."""

    def __init__(
        self, env: simpy.Environment, spec: LinkSpec, name: str = "", on_complete: Callable[[], None] | None = None
    ) -> None:
        self.env = env
        self.spec = spec
        self.name = name
        #: Called after every completion (the engine's wake-up when it sleeps on a transfer).
        self.on_complete = on_complete
        self.stats = LinkStats()
        self._seq = 0
        self._active: list[_Transfer] = []
        self._queued: deque[_Transfer] = deque()
        self._wake: simpy.Event = env.event()
        self._last = env.now
        env.process(self._run())

    def submit(self, nbytes: int, on_done: Callable[[], None], slowdown: float = 1.0) -> None:
        """Start a transfer of ``nbytes``; ``on_done()`` runs at its completion time."""
        if nbytes < 0 or slowdown <= 0:
            raise ValueError(f"link {self.name}: nbytes must be >= 0 and slowdown > 0")
        self._seq += 1
        self.stats.submitted += 1
        start = self.env.now

        def done() -> None:
            self.stats.completed += 1
            self.stats.bytes_moved += nbytes
            self.stats.busy_time += self.env.now - start
            on_done()
            if self.on_complete is not None:
                self.on_complete()

        transfer = _Transfer(self._seq, float(nbytes) * slowdown, done)
        self.env.process(self._after_latency(transfer))

    def _after_latency(self, transfer: _Transfer):
        if self.spec.latency_s > 0:
            yield self.env.timeout(self.spec.latency_s)
        self._progress()
        self._queued.append(transfer)
        self._admit()
        if not self._wake.triggered:
            self._wake.succeed()

    def _admit(self) -> None:
        limit = self.spec.concurrency
        while self._queued and (limit is None or len(self._active) < limit):
            self._active.append(self._queued.popleft())

    def _progress(self) -> None:
        """Charge the bytes moved since the last re-plan to the active transfers."""
        elapsed = self.env.now - self._last
        self._last = self.env.now
        if elapsed > 0 and self._active:
            share = self.spec.bandwidth_bytes_per_s * elapsed / len(self._active)
            for t in self._active:
                t.remaining -= share

    def _run(self):
        while True:
            if not self._active:
                self._wake = self.env.event()
                yield self._wake
                continue
            self._wake = self.env.event()
            rate = self.spec.bandwidth_bytes_per_s / len(self._active)
            dt = max(0.0, min(t.remaining for t in self._active) / rate)
            yield self.env.timeout(dt) | self._wake
            self._progress()
            slack = rate * _TIME_EPS
            done = [t for t in self._active if t.remaining <= slack]
            if done:
                self._active = [t for t in self._active if t.remaining > slack]
                self._admit()
                for t in sorted(done, key=lambda t: t.seq):
                    t.on_done()


class SharedLinkPort:
    """One engine's way onto a :class:`TransferLink` shared by several engines on one SimPy clock.

    Transfers share the link's bandwidth with every other engine's; ``stats`` counts only this engine's.
    Invariant: ``on_done`` runs before ``on_complete`` (the engine's wake-up), as on an engine's own link.
    """

    def __init__(self, shared: TransferLink, on_complete: Callable[[], None]) -> None:
        self.shared = shared
        self.on_complete = on_complete
        self.stats = LinkStats()

    def submit(self, nbytes: int, on_done: Callable[[], None], slowdown: float = 1.0) -> None:
        self.stats.submitted += 1
        start = self.shared.env.now

        def done() -> None:
            self.stats.completed += 1
            self.stats.bytes_moved += nbytes
            self.stats.busy_time += self.shared.env.now - start
            on_done()
            self.on_complete()

        self.shared.submit(nbytes, done, slowdown)


class EngineTransferService(TransferService, Protocol):
    """A transfer service as the engine loop drives it (both clocks implement every member)."""

    #: Called after any transfer completes (the engine sets it to wake an idle loop).
    on_complete: Callable[[], None] | None

    def pending(self) -> bool:
        """Some transfer is in flight."""
        ...

    def next_due_step(self) -> int | None:
        """The step at which the earliest pending transfer completes (``None``: no due step is known)."""
        ...

    def advance(self, step: int) -> None:
        """Enter engine step ``step``."""
        ...


class SimPyTransferService:
    """Links on the time clock, driven by a SimPy environment."""

    clock: ClockKind = "time"

    def __init__(self, env: simpy.Environment) -> None:
        self.env = env
        self.links: dict[str, TransferLink | SharedLinkPort] = {}
        #: Called after any transfer completes (set by the engine to wake an idle engine loop).
        self.on_complete: Callable[[], None] | None = None

    def make_link(self, name: str, spec: LinkSpec) -> TransferLink:
        if name in self.links:
            raise ValueError(f"transfer link {name!r} already exists")
        link = TransferLink(self.env, spec, name, on_complete=self._completed)
        self.links[name] = link
        return link

    def attach(self, name: str, shared: TransferLink) -> "SharedLinkPort":
        """This engine's port onto ``shared``, a link other engines use too (a cluster's shared KV tier):
        its transfers count as this service's (``pending``) and wake this engine when they complete."""
        if name in self.links:
            raise ValueError(f"transfer link {name!r} already exists")
        port = SharedLinkPort(shared, self._completed)
        self.links[name] = port
        return port

    def _completed(self) -> None:
        if self.on_complete is not None:
            self.on_complete()

    def pending(self) -> bool:
        """Some transfer has been submitted and has not completed (latency phase included)."""
        return any(link.stats.submitted > link.stats.completed for link in self.links.values())

    def next_due_step(self) -> int | None:
        """Time-clock transfers have no due step: the engine waits for ``on_complete``."""
        return None

    def advance(self, step: int) -> None:
        """Nothing to do: time-clock transfers complete on SimPy's clock, not at step starts."""


@dataclass(order=True)
class _Due:
    step: int
    seq: int
    on_done: Callable[[], None] = field(compare=False)


class StepLink:
    """A link on the step clock: a transfer takes ``steps`` engine steps."""

    def __init__(self, service: "StepTransferService", spec: LinkSpec, name: str = "") -> None:
        self.service = service
        self.spec = spec
        self.name = name
        self.stats = LinkStats()

    def submit(self, nbytes: int, on_done: Callable[[], None], slowdown: float = 1.0) -> None:
        if nbytes < 0 or slowdown <= 0:
            raise ValueError(f"link {self.name}: nbytes must be >= 0 and slowdown > 0")
        steps = math.ceil(self.spec.steps * slowdown)
        self.stats.submitted += 1
        start = self.service.step

        def done() -> None:
            self.stats.completed += 1
            self.stats.bytes_moved += nbytes
            self.stats.busy_time += self.service.step - start
            on_done()

        self.service.schedule(self.service.step + steps, done)


class StepTransferService:
    """Links on the step clock; the engine calls :meth:`advance` at each step start."""

    clock: ClockKind = "steps"

    def __init__(self) -> None:
        self.step = 0
        self.links: dict[str, StepLink] = {}
        #: Unused on the step clock (due steps wake the engine through ``next_due_step``); the engine may set it.
        self.on_complete: Callable[[], None] | None = None
        self._due: list[_Due] = []
        self._seq = 0

    def make_link(self, name: str, spec: LinkSpec) -> StepLink:
        if name in self.links:
            raise ValueError(f"transfer link {name!r} already exists")
        link = StepLink(self, spec, name)
        self.links[name] = link
        return link

    def pending(self) -> bool:
        return bool(self._due)

    def next_due_step(self) -> int | None:
        """The step at which the earliest pending transfer completes."""
        return min(d.step for d in self._due) if self._due else None

    def schedule(self, step: int, on_done: Callable[[], None]) -> None:
        self._seq += 1
        self._due.append(_Due(step, self._seq, on_done))

    def advance(self, step: int) -> None:
        """Enter step ``step``: fire, in (due step, submission) order, every transfer due by then."""
        if step < self.step:
            raise ValueError(f"step clock cannot go back from {self.step} to {step}")
        self.step = step
        while self._due:
            ready = sorted(d for d in self._due if d.step <= step)
            if not ready:
                return
            self._due = [d for d in self._due if d.step > step]
            for d in ready:
                d.on_done()
