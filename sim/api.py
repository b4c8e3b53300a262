"""The notebook and CLI entry points that chain a run's stages (``sim.run``, ``sim.run_scenario``).

:func:`run_scenario` is ``build_run -> execute -> finalize -> write_bundle``
and, when the bundle is written and plots are asked for, draws them: this is
the one place above the engine and the results layer that plots a run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sim.config.scenario import Scenario
from sim.engine.collector import collector_paused
from sim.engine.run import RunOptions, build_run

__all__ = ["RunOptions", "RunResult", "run", "run_scenario"]
from sim.results import RunResult, finalize, write_bundle


def _simulate(scenario: Scenario | str | Path, options: RunOptions) -> tuple[RunResult, bool]:
    """Build, execute and finalize; the run's state is dropped on return (before the collector resumes,
    which then has only the result left to look at)."""
    run = build_run(scenario, options)
    return finalize(run.execute()), run.scenario.outputs.plots


def run_scenario(
    scenario: Scenario | str | Path, out_dir: str | Path | None = None, *, options: RunOptions | None = None
) -> RunResult:
    """Run ``scenario`` (a Scenario or a YAML path); write the bundle (and plots) to ``out_dir`` if given."""
    options = options or RunOptions()
    with collector_paused():
        result, plots_wanted = _simulate(scenario, options)
    if out_dir is not None:
        plots = plots_wanted if options.write_plots is None else options.write_plots
        fmt = options.plot_format

        def draw(res: RunResult, plots_dir: Path) -> list[Path]:
            from sim.analysis.plots import plot_all, plot_hit_rate_by_turn

            drawn = plot_all(res, plots_dir, fmt=fmt, group_kinds=res.group_kinds)
            if res.session_tables:
                drawn.append(
                    plot_hit_rate_by_turn(
                        res.session_tables["turns"],
                        plots_dir / f"hit_rate_by_turn.{fmt}",
                        group_kinds=res.group_kinds,
                    )
                )
            return drawn

        write_bundle(result, out_dir, force=options.force, draw=draw if plots else None)
    return result


def run(scenario: Scenario | str | Path, out_dir: str | Path | None = None, **kwargs: Any) -> RunResult:
    """Notebook-friendly alias of :func:`run_scenario` (``sim.run``); ``kwargs`` are :class:`RunOptions` fields.
    SIGTERM stops it like Ctrl-C (a partial bundle)."""
    from sim.interrupts import interrupts_raise

    with interrupts_raise():
        return run_scenario(scenario, out_dir, options=RunOptions(**kwargs) if kwargs else None)
