"""A fixed list of runs through the sweep executors: the batch driver of golden traces and the divergence table.

A sweep plans its runs from a grid (:mod:`sim.sweep.runner`); a batch is a
given list of ``(run id, scenario file, overrides)``. Both execute through the
same :class:`~sim.sweep.executors.RunTask` / :func:`~sim.sweep.executors.execute_run`
machinery, so a batch run writes an ordinary result bundle into
``work_dir/<run id>/`` and its consumer reads it back with
:func:`sim.trace.bundle.load_result`. Nothing here knows what the batch is for.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from sim.sweep.executors import Executor, RunOutcome, RunTask, make_executor
from sim.sweep.grid import SweepError


@dataclass(frozen=True)
class BatchRun:
    """One run of a batch: its id (its directory's name), scenario file and ``--set`` overrides."""

    run_id: str
    scenario: Path
    overrides: tuple[str, ...] = ()


class BatchError(SweepError):
    """Some runs of a batch failed (each named with its one-line error)."""


def run_batch(
    runs: Sequence[BatchRun],
    work_dir: Path,
    *,
    executor: str | Executor = "serial",
    jobs: int | None = None,
) -> dict[str, Path]:
    """Run every run into ``work_dir/<run id>/``; return ``run id -> bundle directory`` in the given order.

    Raises :class:`BatchError` naming every failed run (after all have run);
    a duplicate run id is a :class:`~sim.sweep.grid.SweepError` before anything runs.
    """
    ids = [r.run_id for r in runs]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise SweepError(f"duplicate batch run ids: {', '.join(duplicates)}")
    runner = make_executor(executor, jobs) if isinstance(executor, str) else executor
    work_dir = Path(work_dir)
    tasks = [
        RunTask(r.run_id, str(Path(r.scenario).resolve()), tuple(r.overrides), str(work_dir / r.run_id)) for r in runs
    ]
    outcomes: dict[str, RunOutcome] = {o.run_id: o for o in runner.run(tasks)}
    failed = [f"{rid}: {outcomes[rid].error}" for rid in ids if outcomes[rid].status != "ok"]
    if failed:
        raise BatchError("batch runs failed:\n  " + "\n  ".join(failed))
    return {rid: work_dir / rid for rid in ids}
