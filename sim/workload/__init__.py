"""Workloads: explicit request scripts, synthetic generators, trace readers.

``build_requests(spec, base_dir=..., rng=...)`` is the single entry point;
``workload_stats(requests, block_size)`` summarises a built workload.
docs/workloads.md describes every source and knob.
"""

from sim.workload.build import build_requests
from sim.workload.errors import WorkloadError
from sim.workload.spec import WorkloadSpec
from sim.workload.stats import workload_stats

__all__ = ["WorkloadSpec", "WorkloadError", "build_requests", "workload_stats"]
