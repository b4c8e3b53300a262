"""Fixtures of the timing tests: a synthetic Vidur-format profile (see ``synthetic_profile.py``)."""

from pathlib import Path

import pytest
from synthetic_profile import write_synthetic_profile


@pytest.fixture
def synthetic_profile(tmp_path: Path) -> Path:
    return write_synthetic_profile(tmp_path / "synthetic")
