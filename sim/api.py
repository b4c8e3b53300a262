"""The notebook and CLI entry points that chain a run's stages (``sim.run``, ``sim.run_scenario``).

:func:`run_scenario` is ``build_run -> execute -> finalize -> write_bundle``
and, when the bundle is written and plots are asked for, draws them: this is
the one place above the engine and the results layer that plots a run.
:func:`explain_bundle` rebuilds (without running) what ``hybridsim explain``
needs from a bundle's scenario, so that :mod:`sim.analysis.explain` only reads
and renders.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from sim.config.scenario import Scenario
from sim.engine.collector import collector_paused
from sim.engine.run import RunOptions, build_run
from sim.interrupts import deferred, interruptible

__all__ = ["RunOptions", "RunResult", "explain_bundle", "explain_inputs", "run", "run_scenario"]
from sim.results import RunResult, finalize, write_bundle

if TYPE_CHECKING:
    from sim.analysis.explain import ExplainInputs, Explanation

#: What a SIGINT/SIGTERM prints when it arrives after the run finished, while its bundle is written.
WRITING_NOTICE = (
    "the run has finished; writing its bundle first, then stopping (send the signal again to stop at once "
    "and keep the previous bundle)"
)


def _simulate(scenario: Scenario | str | Path, options: RunOptions) -> tuple[RunResult, bool]:
    """Build, execute and finalize; the run's state is dropped on return (before the collector resumes,
    which then has only the result left to look at). A signal stops the build or the simulation at once
    (:func:`~sim.interrupts.interruptible`; the run then ends interrupted, partial)."""
    if not isinstance(scenario, Scenario):
        from sim.config import load_scenario

        with interruptible():
            scenario = load_scenario(scenario)
    if scenario.cluster is not None:
        from sim.cluster.run import build_cluster_run
        from sim.results.cluster import finalize_cluster

        with interruptible():
            cluster = build_cluster_run(scenario, options)
        return finalize_cluster(cluster.execute()), scenario.outputs.plots
    with interruptible():
        run = build_run(scenario, options)
    return finalize(run.execute()), run.scenario.outputs.plots


def run_scenario(
    scenario: Scenario | str | Path, out_dir: str | Path | None = None, *, options: RunOptions | None = None
) -> RunResult:
    """Run ``scenario`` (a Scenario or a YAML path); write the bundle (and plots) to ``out_dir`` if given.

    From the end of the simulation until the bundle is swapped in, a first SIGINT/SIGTERM is held
    (:func:`sim.interrupts.deferred`): the finished run's bundle is written whole, then the signal is
    delivered (the CLI exits 130). A second signal stops at once and the previous bundle stays."""
    options = options or RunOptions()
    with deferred(WRITING_NOTICE):
        return _run_and_write(scenario, out_dir, options)


def _run_and_write(scenario: Scenario | str | Path, out_dir: str | Path | None, options: RunOptions) -> RunResult:
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


def explain_inputs(scenario: Scenario, request_id: str) -> "ExplainInputs":
    """The cache layout, ``request_id``'s block hashes and the connector's capabilities of ``scenario``'s run,
    from its built components (the workload is rebuilt with the scenario's seed; nothing is stepped)."""
    from sim.analysis.explain import ExplainError, ExplainInputs
    from sim.core.kv.hashing import RequestBlockHasher
    from sim.engine.build import build_components

    components = build_components(scenario)
    assert components is not None  # only a dry run builds nothing
    request = next((r for r in components.requests if r.request_id == request_id), None)
    if request is None:
        raise ExplainError(f"request {request_id!r} is not in the scenario's workload")
    config = components.kv_cache_config
    request.set_block_hasher(RequestBlockHasher(config.hash_block_size))
    connector = components.connector
    if connector is None or connector.name == "none":
        return ExplainInputs(config, tuple(request.block_hashes))
    return ExplainInputs(
        config,
        tuple(request.block_hashes),
        connector=connector.name,
        supplies_mamba_state=bool(connector.supplies_mamba_state),
        pulls_unhashed_blocks=bool(connector.pulls_unhashed_blocks),
    )


def explain_bundle(bundle: str | Path, request_id: str, attempt: int | None = None) -> "Explanation":
    """``hybridsim explain``: the story of one admission attempt of a bundle (its tables and
    ``scenario.resolved.yaml``)."""
    from sim.analysis.explain import ExplainError, explain, find_attempt
    from sim.config import load_scenario
    from sim.trace.bundle import load_result

    directory = Path(bundle)
    result = load_result(directory)
    find_attempt(result.admissions, request_id, attempt)  # an unknown request or attempt: say so before building
    scenario_file = directory / "scenario.resolved.yaml"
    if not scenario_file.is_file():
        raise ExplainError(f"{directory}: scenario.resolved.yaml is missing (needed for the request's blocks)")
    from dataclasses import replace

    from sim.results.cluster import instance_of, select_instance

    instance = instance_of(result, request_id)
    scenario = load_scenario(scenario_file)
    workload_id = request_id
    if instance is not None:  # a cluster bundle: the request's own engine's tables, scenario and connector
        result = select_instance(result, instance)
        if scenario.cluster is not None:
            from sim.cluster.instances import instance_scenarios
            from sim.cluster.pd import PREFILL_LEG_SUFFIX

            if scenario.cluster.disaggregated:  # a prefill leg has its request's prompt, hence its blocks
                workload_id = request_id.removesuffix(PREFILL_LEG_SUFFIX)
            scenario = instance_scenarios(scenario)[instance]
    story = explain(result, explain_inputs(scenario, workload_id), request_id, attempt)
    if instance is not None:
        cluster = result.summary.get("cluster") or {}
        aware = " with group_aware" if cluster.get("group_aware") else ""
        story = replace(story, instance=instance, router=f"{cluster.get('router', '?')}{aware}")
    return story
