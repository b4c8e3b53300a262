"""The notebook and CLI entry points that chain a run's stages (``sim.run``, ``sim.run_scenario``).

:func:`run_scenario` is ``build_run -> execute -> finalize -> write_bundle``
and, when the bundle is written and plots are asked for, draws them: this is
the one place above the engine and the results layer that plots a run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sim.config.scenario import Scenario
from sim.engine.run import RunOptions, build_run

__all__ = ["RunOptions", "RunResult", "run", "run_scenario"]
from sim.results import RunResult, finalize, write_bundle


def run_scenario(
    scenario: Scenario | str | Path, out_dir: str | Path | None = None, *, options: RunOptions | None = None
) -> RunResult:
    """Run ``scenario`` (a Scenario or a YAML path); write the bundle (and plots) to ``out_dir`` if given."""
    options = options or RunOptions()
    run = build_run(scenario, options)
    result = finalize(run.execute())
    if out_dir is not None:
        out = write_bundle(result, out_dir)
        plots = run.scenario.outputs.plots if options.write_plots is None else options.write_plots
        if plots:
            from sim.analysis.plots import plot_all

            result.plots = plot_all(result, out / "plots", fmt=options.plot_format, group_kinds=result.group_kinds)
    return result


def run(scenario: Scenario | str | Path, out_dir: str | Path | None = None, **kwargs: Any) -> RunResult:
    """Notebook-friendly alias of :func:`run_scenario` (``sim.run``); ``kwargs`` are :class:`RunOptions` fields."""
    return run_scenario(scenario, out_dir, options=RunOptions(**kwargs) if kwargs else None)
