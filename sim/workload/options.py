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

import math

import numpy as np

from sim.workload.draft import RequestDraft
from sim.workload.spec import WorkloadSpec


def apply_options(
    drafts: list[RequestDraft], spec: WorkloadSpec, rng: np.random.Generator, clock: str
) -> list[RequestDraft]:
    if spec.time_window is not None:
        start, end = spec.time_window
        drafts = [d for d in drafts if start <= d.arrival < end]
        for d in drafts:
            d.arrival -= start
    if spec.sample < 1.0:
        keep = rng.random(len(drafts)) < spec.sample
        drafts = [d for d, k in zip(drafts, keep) if k]
    if spec.time_scale != 1.0:
        for d in drafts:
            d.arrival *= spec.time_scale
    if clock == "steps":
        for d in drafts:
            d.arrival = float(math.floor(d.arrival))
    drafts = sorted(drafts, key=lambda d: (d.arrival, d.order))
    if spec.limit is not None:
        drafts = drafts[: spec.limit]
    return drafts
