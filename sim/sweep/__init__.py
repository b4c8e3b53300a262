"""Parameter sweeps: run a scenario over a grid of overrides and seeds, collect one table, plot it.

The CLI (``hybridsim sweep``) is a thin layer over::

    spec = build_sweep(scenario, grids, grid_file, seeds)   # SweepError on bad input
    result = run_sweep(spec, out_dir, executor="local", jobs=None)
    result.failed, result.plots, result.plot_errors, result.table()

See ``docs/sweeps.md`` for the grid syntax, the grid-file format and the output layout.
"""

from sim.sweep.executors import EXECUTORS, Executor, LocalExecutor, RayExecutor, SerialExecutor, make_executor
from sim.sweep.grid import (
    Axis,
    PlotSpec,
    RunSpec,
    SeedSpec,
    SweepError,
    SweepSpec,
    build_sweep,
    load_grid_file,
    parse_grid_arg,
    parse_seeds,
    plan_runs,
)
from sim.sweep.runner import RunRecord, SweepResult, read_sweep, run_sweep


def __getattr__(name: str):
    """``plot_sweep`` is imported on first use, so importing the package does not import matplotlib."""
    if name == "plot_sweep":
        from sim.sweep.plots import plot_sweep

        return plot_sweep
    raise AttributeError(f"module 'sim.sweep' has no attribute {name!r}")


__all__ = [
    "EXECUTORS",
    "Axis",
    "Executor",
    "LocalExecutor",
    "PlotSpec",
    "RayExecutor",
    "RunRecord",
    "RunSpec",
    "SeedSpec",
    "SerialExecutor",
    "SweepError",
    "SweepResult",
    "SweepSpec",
    "build_sweep",
    "load_grid_file",
    "make_executor",
    "parse_grid_arg",
    "parse_seeds",
    "plan_runs",
    "plot_sweep",
    "read_sweep",
    "run_sweep",
]
