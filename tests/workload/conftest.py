"""Helpers shared by the workload tests."""

from pathlib import Path

import numpy as np
import pytest

from sim.workload import WorkloadSpec, build_requests


@pytest.fixture
def build(tmp_path):
    """Build a workload dict with seed 0 (paths relative to tmp_path)."""

    def _build(
        workload: dict, *, seed: int = 0, clock: str = "time", hash_block_size=None, base_dir: Path | None = None
    ):
        spec = WorkloadSpec.model_validate(workload)
        return build_requests(
            spec,
            base_dir=base_dir or tmp_path,
            rng=np.random.default_rng(seed),
            hash_block_size=hash_block_size,
            clock=clock,
        )

    return _build
