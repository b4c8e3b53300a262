"""The workload options: time window, sampling, time scale, clock, limit.

Applied in this order to the drafts of any source (script, generator, trace):

1. ``time_window: [start, end]`` keeps arrivals with ``start <= t < end`` and
   shifts time so that ``start`` becomes 0.
2. ``sample: f`` keeps each request independently with probability ``f``
   (one uniform draw per request, in source order, from the run's generator).
   Sampling thins conversations turn by turn; a kept turn still quotes its
   parent's content.
3. ``time_scale: s`` multiplies every arrival time (``s = 2`` halves the rate).
4. With ``clock: steps`` arrival times are floored to whole step numbers.
5. Requests are sorted by ``(arrival time, source order)``; ``limit: n`` keeps
   the first ``n``.
"""

from __future__ import annotations

import heapq
import math
from operator import attrgetter
from typing import Iterable, Iterator

import numpy as np

from sim.workload.draft import RequestDraft
from sim.workload.spec import WorkloadSpec


def apply_options(
    drafts: Iterable[RequestDraft], spec: WorkloadSpec, rng: np.random.Generator, clock: str
) -> list[RequestDraft]:
    """The options applied to a stream of drafts; with ``limit`` only the ``limit`` earliest are ever held
    (a bounded heap), so a long trace costs memory in the limit, not in its length."""
    stream = retimed(drafts, spec, rng, clock)
    key = attrgetter("arrival", "order")  # the tuple (arrival, order), made in C
    if spec.limit is not None:
        return heapq.nsmallest(spec.limit, stream, key=key)
    return sorted(stream, key=key)


def retimed(
    drafts: Iterable[RequestDraft], spec: WorkloadSpec, rng: np.random.Generator, clock: str
) -> Iterator[RequestDraft]:
    """Options 1 to 4 applied to a stream of drafts, in source order: the kept drafts, re-timed (not sorted,
    not limited)."""
    stream: Iterator[RequestDraft] = iter(drafts)
    if spec.time_window is not None:
        stream = _window(stream, *spec.time_window)
    if spec.sample < 1.0:
        stream = (d for d in stream if rng.random() < spec.sample)  # one draw per request, in source order
    if spec.time_scale != 1.0 or clock == "steps":
        stream = _retime(stream, spec.time_scale, clock == "steps")
    return stream


def _window(stream: Iterator[RequestDraft], start: float, end: float) -> Iterator[RequestDraft]:
    for d in stream:
        if start <= d.arrival < end:
            d.arrival -= start
            yield d


def _retime(stream: Iterator[RequestDraft], scale: float, floor: bool) -> Iterator[RequestDraft]:
    for d in stream:
        d.arrival *= scale
        if floor:
            d.arrival = float(math.floor(d.arrival))
        yield d
