"""Arrival processes: the times at which a generator's arrivals happen.

Every process is a renewal-style sequence: arrival ``i`` (1-based) is at the
sum of the first ``i`` gaps, so the first arrival is one gap after 0. The
sequence stops after ``count`` arrivals or at the last arrival before
``duration``, whichever comes first. Gaps are drawn in vectorised batches; the
draws consumed depend only on the seed, the spec and the bounds.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from sim.workload.spec import (
    ArrivalSpec,
    ConstantArrivals,
    GammaArrivals,
    OnOffArrivals,
    PoissonArrivals,
    ScheduleArrivals,
)

GapSampler = Callable[[int], np.ndarray]


def _cumulative(gaps: GapSampler, count: int | None, horizon: float | None) -> np.ndarray:
    """Cumulative sums of gaps: ``count`` of them, or those up to ``horizon``.

    With only a horizon, gaps are drawn in batches until the running time passes
    it; ``horizon`` is in the gap sampler's own time units.
    """
    if count is not None:
        times = np.cumsum(gaps(count))
        return times[times < horizon] if horizon is not None else times
    assert horizon is not None
    chunks: list[np.ndarray] = []
    last = 0.0
    batch = 1024
    while last < horizon:
        chunk = last + np.cumsum(gaps(batch))
        chunks.append(chunk)
        last = float(chunk[-1])
    times = np.concatenate(chunks)
    return times[times < horizon]


def _onoff_times(
    spec: OnOffArrivals, rng: np.random.Generator, count: int | None, duration: float | None
) -> np.ndarray:
    """Poisson in 'on time', then mapped onto the wall clock by inserting the off periods."""
    period = spec.on_time + spec.off_time
    on_horizon = None
    if duration is not None:
        full, rest = divmod(duration, period)
        on_horizon = full * spec.on_time + min(rest, spec.on_time)
    on_times = _cumulative(lambda n: rng.exponential(1.0 / spec.rate, n), count, on_horizon)
    cycles, within = np.divmod(on_times, spec.on_time)
    return cycles * period + within


def _schedule_times(
    spec: ScheduleArrivals, rng: np.random.Generator, count: int | None, duration: float | None
) -> np.ndarray:
    """Time-warped unit-rate Poisson: ``t = Λ⁻¹(s)`` with Λ the cumulative rate.

    Λ is piecewise linear; a unit-rate event at ``s`` lands in the piece with
    ``Λ(start_j) < s <= Λ(start_{j+1})``, which never is a zero-rate piece.
    Events beyond a final zero-rate piece never happen.
    """
    starts = np.array([p.start for p in spec.pieces])
    rates = np.array([p.rate for p in spec.pieces])
    lam_at_start = np.concatenate([[0.0], np.cumsum(np.diff(starts) * rates[:-1])])

    def lam(t: float) -> float:
        j = int(np.searchsorted(starts, t, side="right")) - 1
        return float(lam_at_start[j] + (t - starts[j]) * rates[j])

    horizon = lam(duration) if duration is not None else None
    if rates[-1] == 0:
        cap = float(lam_at_start[-1])
        horizon = cap if horizon is None else min(horizon, cap)
    s = _cumulative(lambda n: rng.exponential(1.0, n), count, horizon)
    if rates[-1] == 0:
        s = s[s <= lam_at_start[-1]]
    piece = np.searchsorted(lam_at_start, s, side="left") - 1
    piece = np.clip(piece, 0, len(starts) - 1)
    return starts[piece] + (s - lam_at_start[piece]) / rates[piece]


def arrival_times(spec: ArrivalSpec, rng: np.random.Generator, count: int | None, duration: float | None) -> np.ndarray:
    """Arrival times in seconds, increasing, at most ``count``, all ``< duration``."""
    if isinstance(spec, PoissonArrivals):
        return _cumulative(lambda n: rng.exponential(1.0 / spec.rate, n), count, duration)
    if isinstance(spec, GammaArrivals):
        shape = 1.0 / spec.cv**2
        scale = 1.0 / (spec.rate * shape)
        return _cumulative(lambda n: rng.gamma(shape, scale, n), count, duration)
    if isinstance(spec, ConstantArrivals):
        # i / rate rather than a running sum, so step-clock floors are exact.
        if count is not None:
            n = count
        else:
            assert duration is not None, "arrivals need a count or a duration"
            n = int(np.ceil(duration * spec.rate)) + 1
        times = np.arange(1, n + 1) / spec.rate
        return times[times < duration] if duration is not None else times
    if isinstance(spec, OnOffArrivals):
        return _onoff_times(spec, rng, count, duration)
    return _schedule_times(spec, rng, count, duration)
