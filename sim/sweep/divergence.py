"""``hybridsim divergence-table``: run the divergence table's cells through the batch driver.

Every cell of :mod:`sim.analysis.divergence_table` is one batch run of its
base scenario (in ``repro_dir``, default ``scenarios/repro`` under the
current directory) with the cell's overrides; the rendered page is
``docs/divergence.md``.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from sim.analysis.divergence_table import (
    DIRECTIONS,
    Cell,
    cell_from_admissions,
    cell_keys,
    overrides,
)
from sim.sweep.batch import BatchRun, run_batch
from sim.sweep.executors import Executor
from sim.trace.bundle import load_result

DEFAULT_REPRO_DIR = Path("scenarios") / "repro"


def divergence_matrix(
    repro_dir: Path = DEFAULT_REPRO_DIR, *, executor: str | Executor = "serial", jobs: int | None = None
) -> list[Cell]:
    """Every cell, in (direction, policy, connector) order."""
    keys = cell_keys()
    runs = [
        BatchRun(
            f"{d}-{p}-{c.replace(' ', '-')}",
            Path(repro_dir) / DIRECTIONS[d],
            (*overrides(p, c), "outputs.plots=false"),
        )
        for d, p, c in keys
    ]
    with tempfile.TemporaryDirectory(prefix="divergence-table-") as tmp:
        bundles = run_batch(runs, Path(tmp), executor=executor, jobs=jobs)
        return [
            cell_from_admissions(d, p, c, load_result(bundles[run.run_id]).admissions)
            for (d, p, c), run in zip(keys, runs)
        ]
