"""Sampling from the distribution specs of :mod:`sim.workload.spec`.

Two readings of one spec: :func:`sample_lengths` gives token counts (whole
numbers, at least ``minimum``; ``uniform`` is then integer-inclusive
between its rounded bounds) and
:func:`sample_values` gives real values (durations in seconds). Both draw
``n`` values in one vectorised call, so a workload's randomness depends only on
the seed and the spec, never on Python-level iteration order.
"""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path

import numpy as np

from sim.inputfile import InputFileError, read_text
from sim.workload.errors import WorkloadError
from sim.workload.spec import (
    EmpiricalDist,
    ExponentialDist,
    FixedDist,
    LognormalDist,
    UniformDist,
)

Dist = FixedDist | UniformDist | LognormalDist | ExponentialDist | EmpiricalDist


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def load_empirical_table(dist: EmpiricalDist, base_dir: Path) -> tuple[np.ndarray, np.ndarray]:
    """``(values, probabilities)`` of an empirical table, inline or from its CSV file."""
    if dist.values is not None:
        values = np.asarray(dist.values, dtype=float)
        weights = np.ones_like(values) if dist.weights is None else np.asarray(dist.weights, float)
        return values, weights / weights.sum()
    path = base_dir / str(dist.path)
    try:
        text = read_text(path, "empirical table", "csv_bytes")
    except InputFileError as exc:
        raise WorkloadError(str(exc)) from None
    try:
        return _parse_empirical(text, path)
    except csv.Error as exc:  # e.g. a field longer than the csv module's limit (128 KiB)
        raise WorkloadError(f"{path}: not a CSV table ({exc})") from None


def _parse_empirical(text: str, path: Path) -> tuple[np.ndarray, np.ndarray]:
    values_list: list[float] = []
    weights_list: list[float] = []
    reader = csv.reader(io.StringIO(text, newline=""))
    header = [h.strip() for h in next(reader, [])]
    if "value" not in header:
        raise WorkloadError(
            f"{path}:1: empirical table needs a 'value' column (and optionally 'weight'); "
            f"the header has {len(header)} column(s), none named 'value'"
        )
    iv, iw = header.index("value"), header.index("weight") if "weight" in header else None
    for line, row in enumerate(reader, start=2):
        if not row:
            continue
        if len(row) != len(header):
            raise WorkloadError(f"{path}:{line}: {len(row)} fields, the header has {len(header)}")
        try:
            value = float(row[iv])
            weight = float(row[iw]) if iw is not None else 1.0
        except ValueError:
            from sim.workload.traces.common import excerpt

            bad = row[iv] if not _is_number(row[iv]) else row[iw] if iw is not None else ""
            raise WorkloadError(f"{path}:{line}: 'value'/'weight' must be numbers, got {excerpt(bad)}") from None
        if value < 0 or weight < 0 or not math.isfinite(value) or not math.isfinite(weight):
            raise WorkloadError(f"{path}:{line}: 'value' and 'weight' must be finite and >= 0")
        values_list.append(value)
        weights_list.append(weight)
    if not values_list or sum(weights_list) <= 0:
        raise WorkloadError(f"{path}: empirical table has no rows with a positive weight")
    weights = np.asarray(weights_list)
    return np.asarray(values_list), weights / weights.sum()


def sample_values(dist: Dist, rng: np.random.Generator, n: int, base_dir: Path) -> np.ndarray:
    """``n`` real-valued draws (float64)."""
    if isinstance(dist, FixedDist):
        return np.full(n, float(dist.value))
    if isinstance(dist, UniformDist):
        return rng.uniform(dist.low, dist.high, n)
    if isinstance(dist, ExponentialDist):
        return rng.exponential(dist.mean, n)
    if isinstance(dist, LognormalDist):
        # E[X] = exp(mu + sigma^2 / 2), so mu = ln(mean) - sigma^2 / 2 gives the requested mean.
        mu = math.log(dist.mean) - dist.sigma**2 / 2
        out = rng.lognormal(mu, dist.sigma, n)
        if dist.min is not None or dist.max is not None:
            out = np.clip(out, dist.min, dist.max)
        return out
    values, probs = load_empirical_table(dist, base_dir)
    return values[rng.choice(len(values), size=n, p=probs)]


def sample_lengths(dist: Dist, rng: np.random.Generator, n: int, base_dir: Path, minimum: int = 1) -> np.ndarray:
    """``n`` whole-number draws (int64), each at least ``minimum``."""
    if isinstance(dist, UniformDist):
        out = rng.integers(round(dist.low), round(dist.high) + 1, n)
    else:
        out = np.rint(sample_values(dist, rng, n, base_dir)).astype(np.int64)
    return np.maximum(out, minimum)
