"""Arrival processes: rates, burstiness and bounds over a fixed seed."""

import numpy as np
import pytest
from pydantic import TypeAdapter

from sim.workload.arrivals import arrival_times
from sim.workload.spec import ArrivalSpec

SPEC = TypeAdapter(ArrivalSpec)


def times(spec, count=None, duration=None, seed=0):
    return arrival_times(SPEC.validate_python(spec), np.random.default_rng(seed), count, duration)


def cv(x):
    return x.std() / x.mean()


def test_poisson_rate_and_cv():
    t = times({"process": "poisson", "rate": 5.0}, count=20000)
    gaps = np.diff(np.concatenate([[0.0], t]))
    assert len(t) == 20000 and np.all(gaps > 0)
    assert gaps.mean() == pytest.approx(0.2, rel=0.03)
    assert cv(gaps) == pytest.approx(1.0, rel=0.03)


@pytest.mark.parametrize("target_cv", [0.5, 2.0])
def test_gamma_rate_and_cv(target_cv):
    t = times({"process": "gamma", "rate": 4.0, "cv": target_cv}, count=20000)
    gaps = np.diff(np.concatenate([[0.0], t]))
    assert gaps.mean() == pytest.approx(0.25, rel=0.04)
    assert cv(gaps) == pytest.approx(target_cv, rel=0.08)


def test_constant_is_exact_and_duration_is_exclusive():
    t = times({"process": "constant", "rate": 4.0}, duration=2.0)
    assert t.tolist() == [0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75]
    assert times({"process": "constant", "rate": 0.5}, count=3).tolist() == [2.0, 4.0, 6.0]


def test_count_and_duration_whichever_ends_first():
    t = times({"process": "poisson", "rate": 10.0}, duration=100.0)
    assert np.all(t < 100.0) and np.all(np.diff(t) > 0)
    assert len(t) == pytest.approx(1000, rel=0.1)
    assert len(times({"process": "poisson", "rate": 10.0}, count=50, duration=100.0)) == 50
    short = times({"process": "poisson", "rate": 10.0}, count=5000, duration=10.0)
    assert len(short) < 200 and short.max() < 10.0


def test_onoff_is_silent_when_off_and_poisson_when_on():
    t = times({"process": "onoff", "rate": 20.0, "on_time": 2.0, "off_time": 3.0}, duration=500.0)
    phase = np.mod(t, 5.0)
    assert np.all(phase < 2.0)
    # 100 cycles x 2 s on x 20/s
    assert len(t) == pytest.approx(4000, rel=0.06)


def test_schedule_rates_per_piece_and_final_silence():
    spec = {
        "process": "schedule",
        "pieces": [
            {"start": 0, "rate": 10},
            {"start": 100, "rate": 0},
            {"start": 150, "rate": 40},
            {"start": 200, "rate": 0},
        ],
    }
    t = times(spec, count=100000)  # the final zero-rate piece ends the process before the count
    assert t.max() < 200
    counts = [np.sum((t >= a) & (t < b)) for a, b in [(0, 100), (100, 150), (150, 200)]]
    assert counts[1] == 0
    assert counts[0] == pytest.approx(1000, rel=0.1)
    assert counts[2] == pytest.approx(2000, rel=0.1)


def test_same_seed_same_arrivals():
    spec = {"process": "gamma", "rate": 3.0, "cv": 1.5}
    assert np.array_equal(times(spec, count=100, seed=4), times(spec, count=100, seed=4))
    assert not np.array_equal(times(spec, count=100, seed=4), times(spec, count=100, seed=5))
