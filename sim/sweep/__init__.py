"""Parameter sweeps: run a scenario over a grid of overrides and seeds, collect one table, plot it.

The CLI (``hybridsim sweep``) is a thin layer over::

    spec = build_sweep(scenario, grids, grid_file, seeds)   # SweepError on bad input
    result = run_sweep(spec, out_dir, executor="local", jobs=None)
    result.failed, result.plots, result.plot_errors, result.table()

See ``docs/sweeps.md`` for the grid syntax, the grid-file format and the output layout.
"""

from importlib import import_module

#: Where each public name lives: imported on first use, so that ``from sim.sweep.grid import ...`` (the scenario
#: checks of ``hybridsim validate``) does not import the executors' process pools, and importing the package
#: does not import matplotlib (``plot_sweep``).
_HOMES = {
    **dict.fromkeys(
        ("EXECUTORS", "Executor", "LocalExecutor", "RayExecutor", "SerialExecutor", "make_executor"),
        "sim.sweep.executors",
    ),
    **dict.fromkeys(
        (
            "Axis",
            "PlotSpec",
            "RunSpec",
            "SeedSpec",
            "SweepError",
            "SweepSpec",
            "build_sweep",
            "load_grid_file",
            "parse_grid_arg",
            "parse_seeds",
            "plan_runs",
        ),
        "sim.sweep.grid",
    ),
    **dict.fromkeys(("RunRecord", "SweepResult", "read_sweep", "run_sweep"), "sim.sweep.runner"),
    "plot_sweep": "sim.sweep.plots",
}


def __getattr__(name: str):
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'sim.sweep' has no attribute {name!r}")
    return getattr(import_module(home), name)


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
