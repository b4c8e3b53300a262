"""Length and duration distributions."""

from pathlib import Path

import numpy as np
import pytest
from pydantic import TypeAdapter

from sim.workload.distributions import sample_lengths, sample_values
from sim.workload.errors import WorkloadError
from sim.workload.spec import Distribution

DIST = TypeAdapter(Distribution)


def lengths(spec, n=20000, base_dir=Path("."), seed=0):
    return sample_lengths(DIST.validate_python(spec), np.random.default_rng(seed), n, base_dir)


def test_fixed_and_number_shorthand():
    assert lengths(128, n=3).tolist() == [128, 128, 128]
    assert lengths({"dist": "fixed", "value": 0}, n=2).tolist() == [1, 1]  # lengths are >= 1


def test_uniform_lengths_are_integer_inclusive():
    x = lengths({"dist": "uniform", "low": 3, "high": 6})
    assert set(np.unique(x).tolist()) == {3, 4, 5, 6}
    assert x.mean() == pytest.approx(4.5, rel=0.02)


def test_lognormal_mean_and_clipping():
    x = lengths({"dist": "lognormal", "mean": 500, "sigma": 0.8})
    assert x.mean() == pytest.approx(500, rel=0.03)
    y = lengths({"dist": "lognormal", "mean": 500, "sigma": 0.8, "min": 100, "max": 900})
    assert y.min() == 100 and y.max() == 900


def test_exponential_values():
    x = sample_values(
        DIST.validate_python({"dist": "exponential", "mean": 2.5}), np.random.default_rng(1), 20000, Path(".")
    )
    assert x.mean() == pytest.approx(2.5, rel=0.03)


def test_empirical_inline_weights():
    x = lengths({"dist": "empirical", "values": [10, 20, 30], "weights": [1, 0, 3]})
    assert set(np.unique(x).tolist()) == {10, 30}
    assert np.mean(x == 30) == pytest.approx(0.75, abs=0.015)


def test_empirical_table_file(tmp_path):
    (tmp_path / "lens.csv").write_text("value,weight\n100,1\n200,1\n")
    x = lengths({"dist": "empirical", "path": "lens.csv"}, base_dir=tmp_path)
    assert set(np.unique(x).tolist()) == {100, 200}
    (tmp_path / "bad.csv").write_text("value\n100\nabc\n")
    with pytest.raises(WorkloadError, match=r"bad.csv:3: "):
        lengths({"dist": "empirical", "path": "bad.csv"}, base_dir=tmp_path)
    with pytest.raises(WorkloadError, match="not found"):
        lengths({"dist": "empirical", "path": "missing.csv"}, base_dir=tmp_path)
