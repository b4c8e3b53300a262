"""Stage 3 of a run: :func:`finalize` turns a :class:`~sim.engine.run.RunRecord` into a :class:`RunResult`.

It builds the five tables from the recorder and computes the summary
(:func:`sim.results.metrics.run_summary` plus the run's facts: name, seed,
clock, policy, connector, layout, steps, simulated time, status). It writes
nothing and draws nothing: :func:`sim.results.write.write_bundle` writes, and
plots are drawn on top by ``sim.run`` and the CLI.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sim.config.scenario import Scenario
from sim.engine.build import build_checkpoint_policy
from sim.engine.run import RunRecord
from sim.results.metrics import MambaPlacementLimits, add_ideal_hit_rate, run_summary
from sim.trace.bundle import LoadedResult
from sim.trace.recorder import Recorder
from sim.trace.schema import recorded_tables

#: Statuses whose tables are complete (every other status writes ``partial: true``).
COMPLETE_STATUSES: tuple[str, ...] = ("complete", "crashed")


@dataclass
class RunResult(LoadedResult):
    """A finished run: a :class:`~sim.trace.bundle.LoadedResult` (summary, DataFrames, path) plus
    how it ended, the scenario it ran, the crash detail and the plots drawn."""

    #: How the run ended: ``complete``, ``crashed``, ``stalled``, ``stopped``, ``invariant_violation`` or
    #: ``interrupted`` (also ``summary.json``'s ``status``).
    status: str = "complete"
    plots: list[Path] = field(default_factory=list)
    scenario: Scenario | None = None
    #: ``crash.json``'s content (the crash marker plus the crashing admission's hits), or ``None``.
    crash_detail: dict[str, Any] | None = None
    #: What writing the bundle noted (e.g. a foreign folder kept aside under ``--force``).
    notes: list[str] = field(default_factory=list)

    @property
    def crash(self) -> dict[str, Any] | None:
        crash: dict[str, Any] | None = self.summary.get("crash")
        return crash

    @property
    def is_partial(self) -> bool:
        """Whether the tables stop short of what the scenario asked (``summary.json``'s ``partial``)."""
        return self.summary.get("status", "complete") not in COMPLETE_STATUSES


def _crash_detail(recorder: Recorder, crash: dict[str, Any]) -> dict[str, Any]:
    """The crash marker with the crashing request's last admission (per-group hits, local, external, boundary)."""
    admissions = recorder.admissions
    detail = dict(crash)
    rid = crash["request_id"]
    # The run's admissions, spilled (sim.trace.spill) and held, read back one column at a time.
    ids = list(recorder.column_values("admissions", "request_id"))
    for i in range(len(ids) - 1, -1, -1):
        if ids[i] == rid:
            names = [f"hit_g{g}" for g in range(recorder.num_groups)]
            names += ["local_tokens", "external_tokens", "claimed_boundary"]
            if i >= admissions.spilled:
                row = {name: admissions.data[name][i - admissions.spilled] for name in names}
            else:
                row = {
                    name: next(itertools.islice(recorder.column_values("admissions", name), i, None)) for name in names
                }
            detail["hits"] = [row[f"hit_g{g}"] for g in range(recorder.num_groups)]
            detail["local_tokens"] = row["local_tokens"]
            detail["external_tokens"] = row["external_tokens"]
            detail["claimed_boundary"] = row["claimed_boundary"]
            #: Which attempt of the request crashed (``hybridsim explain --attempt``, 1-based).
            detail["attempt"] = ids[: i + 1].count(rid)
            break
    return detail


def finalize(record: RunRecord, *, with_sessions: bool = True) -> RunResult:
    """The tables and the summary of a finished run (no file is written). ``with_sessions`` False: no session
    tables (a cluster instance, whose turns' parents may have run on another instance: the cluster's result
    has them, :func:`sim.results.cluster.finalize_cluster`)."""
    scenario = record.scenario
    # Arrow tables of the declared schemas (kv_events kept packed until asked for or written a row group
    # at a time); the summary reads their columns, pandas sees them only on access (RunResult.tables).
    tables = recorded_tables(record.recorder)
    summary = run_summary(
        tables,
        group_kinds=record.group_kinds,
        slo_ttft_s=scenario.slo.ttft_s if scenario.slo else None,
        slo_tpot_s=scenario.slo.tpot_s if scenario.slo else None,
        crash=record.crash,
    )
    summary.update(
        {
            "name": scenario.name,
            "seed": scenario.seed,
            "clock": scenario.clock,
            "vllm_version": scenario.vllm_version,
            "policy": scenario.scheduler.prefix_policy,
            "lookup_path": record.lookup_path,
            "connector": scenario.connector.type,
            "num_blocks": record.kv_cache_config.num_blocks,
            "block_sizes": [g.spec.block_size for g in record.kv_cache_config.groups],
            "steps": record.steps,
            "simulated_s": record.simulated_s,
            "status": record.status,
            "message": record.message,
        }
    )
    if scenario.outputs.ideal_hit_rate:
        config = record.kv_cache_config
        limits = None
        if config.has_mamba_layers and config.enable_prefix_caching:
            limits = MambaPlacementLimits(build_checkpoint_policy(scenario, config), config.retention_interval)
        assert isinstance(record.requests, list)  # (a run with an ideal hit rate is not streamed)
        add_ideal_hit_rate(summary, tables, record.requests, config.scheduler_block_size, limits)
    if record.connector_metrics is not None:
        summary["connector_metrics"] = record.connector_metrics
    session_tables: dict[str, Any] = {}
    if scenario.workload.sessions is not None and with_sessions:
        from sim.results.sessions import session_tables_and_summary

        assert isinstance(record.requests, list)  # (a run with sessions is not streamed)
        session_tables, summary["sessions"] = session_tables_and_summary(
            scenario.workload.sessions.mode, record.requests, tables, record.think_used
        )
    return RunResult(
        summary=summary,
        tables=tables,
        path=None,
        group_kinds=list(record.group_kinds),
        status=record.status,
        scenario=scenario,
        crash_detail=_crash_detail(record.recorder, record.crash) if record.crash is not None else None,
        session_tables=session_tables,
    )
