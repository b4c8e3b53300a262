"""Run one scenario end to end and write its result bundle.

``run_scenario(scenario, out_dir)`` builds the components, drives the SimPy
engine to the end of the workload (or to a crash, an invariant violation, a
stall or Ctrl-C), then always writes what it has: ``scenario.resolved.yaml``,
``summary.json`` (``partial: true`` unless the run completed or stopped the
way the scenario asked), the tables and the plots. A crash with
``on_crash: stop`` also writes ``crash.json`` and a replay bundle
(``replay/replay.yaml`` + ``replay/crash.json``) that ``hybridsim replay``
reproduces.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import simpy

from sim.config import load_scenario, resolved_yaml
from sim.config.scenario import Scenario
from sim.engine.actions import build_actions
from sim.engine.build import Components, build_components
from sim.engine.loop import EngineLoop, InvariantViolation, StopRun
from sim.request import Request, RequestStatus
from sim.trace.bundle import LoadedResult

EXIT_OK = 0
EXIT_CRASH = 3
EXIT_INVARIANT = 4
EXIT_STALLED = 5
EXIT_INTERRUPTED = 130


@dataclass
class RunOptions:
    """How to run (not what): progress display, invariant checks, plot format."""

    progress: bool = False
    check_invariants: bool = False
    plot_format: str = "png"
    write_plots: bool | None = None
    max_steps: int | None = None


@dataclass
class RunResult(LoadedResult):
    """A finished run: a :class:`~sim.trace.bundle.LoadedResult` (summary, DataFrames, path) plus
    the process exit code it implies and the plots it drew."""

    exit_code: int = EXIT_OK
    plots: list[Path] = field(default_factory=list)

    @property
    def crash(self) -> dict | None:
        return self.summary.get("crash")


def _step_duration_fn(components: Components):
    model = components.step_time_model
    if model is None:
        return lambda output, sched: 1.0

    def duration(output, sched) -> float:
        # A decode request brings n = 1 token on c context tokens: n*c = c, n*(n+1) = 2.
        decode = output.decode_tokens
        total_new = decode
        total_ctx = new_ctx = output.decode_context_tokens
        new_new1 = 2 * decode
        for n, c in output.prefill_chunks:
            total_new += n
            total_ctx += c
            new_ctx += n * c
            new_new1 += n * (n + 1)
        return model.step_time_totals(
            decode + len(output.prefill_chunks), total_new, total_ctx, new_ctx, new_new1
        )

    return duration


def _transfer_service(env: simpy.Environment, clock: str):
    from sim.engine.transfer import SimPyTransferService, StepTransferService

    return StepTransferService() if clock == "steps" else SimPyTransferService(env)


def _request_outcome(request: Request, worst: dict[str, str], crashed_id: str | None, stopped: bool) -> str:
    """A request's outcome: its worst admission outcome if it finished; else why it did not."""
    if request.request_id == crashed_id:
        return "crash"
    if request.status == RequestStatus.FINISHED_ERROR:
        return "failed"
    if request.is_finished():
        return worst.get(request.request_id, "ok")
    return "failed" if stopped else "unfinished"


_OUTCOME_RANK = {"ok": 0, "recompute": 1, "corrupt": 2, "crash": 3}


def _worst_outcomes(request_ids: Iterable[str], outcomes: Iterable[str]) -> dict[str, str]:
    """Each request's worst admission outcome (``ok`` < ``recompute`` < ``corrupt`` < ``crash``)."""
    worst: dict[str, str] = {}
    for rid, outcome in zip(request_ids, outcomes):
        if outcome in _OUTCOME_RANK and _OUTCOME_RANK[outcome] >= _OUTCOME_RANK.get(worst.get(rid, "ok"), 0):
            worst[rid] = outcome
    return worst


def _record_requests(components: Components, loop: EngineLoop, stopped: bool) -> None:
    rec = components.recorder
    admissions = rec.admissions.data
    worst = _worst_outcomes(admissions["request_id"], admissions["outcome"])
    crashed = loop.crash.request_id if loop.crash is not None else None
    for request in loop.requests:
        t = loop.times.get(request.request_id)
        arrived = t is not None
        rec.record_request(
            request_id=request.request_id,
            arrival_s=float(request.arrival_time),
            first_scheduled_s=t.first_scheduled if arrived else None,
            first_token_s=t.first_token if arrived else None,
            finished_s=t.finished if arrived else None,
            prompt_tokens=request.num_prompt_tokens,
            output_tokens=request.num_output_tokens,
            local_hit_tokens=max(0, request.num_cached_tokens - request.num_external_computed_tokens),
            external_hit_tokens=request.num_external_computed_tokens,
            preemptions=request.num_preemptions,
            outcome=_request_outcome(request, worst, crashed, stopped) if arrived else "not_arrived",
        )


def _replay_yaml(scenario: Scenario, crash_step: int) -> str:
    """The resolved scenario cut down to what reproduces the crash: arrivals and actions up to the crash step."""
    data = json.loads(scenario.model_dump_json())
    data["on_crash"] = "stop"
    data["name"] = f"{scenario.name}-replay"
    if scenario.clock == "steps":
        data["actions"] = [a for a in data.get("actions", []) if a["at"] <= crash_step]
        wl = data.get("workload", {})
        if wl.get("requests") is not None:
            wl["requests"] = [r for r in wl["requests"] if r.get("at", 0) <= crash_step]
    cut = Scenario.model_validate(data)
    return resolved_yaml(cut)


def run_scenario(scenario: Scenario | str | Path, out_dir: str | Path | None = None, *,
                 options: RunOptions | None = None) -> RunResult:
    """Run ``scenario`` (a Scenario or a YAML path); write the bundle to ``out_dir`` if given."""
    from sim.results.metrics import run_summary
    from sim.trace.bundle import write_result
    from sim.trace.tables import tables_from_recorder

    if not isinstance(scenario, Scenario):
        scenario = load_scenario(scenario)
    options = options or RunOptions()
    components = build_components(scenario)
    assert components is not None
    env = simpy.Environment()
    transfers = _transfer_service(env, scenario.clock)
    connector = components.connector
    if connector is not None:
        from sim.connector.context import context_from_kv_cache_config

        connector.bind(
            context_from_kv_cache_config(components.kv_cache_config, scenario.clock, components.connector_rng, transfers)
        )
    progress = _Progress(scenario, len(components.requests)) if options.progress else None
    check: Callable[[], None] | None = None
    if options.check_invariants or scenario.check_invariants:
        from functools import partial

        from sim.kv.manager import check_invariants

        check = partial(check_invariants, components.kv_manager)

    step_columns = getattr(connector, "step_columns", None) if connector is not None else None
    loop = EngineLoop(
        env=env,
        scheduler=components.scheduler,
        requests=components.requests,
        clock=scenario.clock,
        step_duration=_step_duration_fn(components),
        recorder=components.recorder,
        kv_manager=components.kv_manager,
        connector=connector,
        transfers=transfers,
        actions=build_actions(scenario, components),
        on_crash=scenario.on_crash,
        check_invariants=check,
        step_columns=step_columns,
        progress=progress.update if progress else None,
        max_steps=options.max_steps,
    )
    status, exit_code, message = "complete", EXIT_OK, ""
    try:
        if progress:
            progress.start()
        env.run(until=loop.process)
    except StopRun as stop:
        message = str(stop)
        if loop.crash is not None:
            status, exit_code = "crashed", EXIT_CRASH
        elif loop.stalled:
            status, exit_code = "stalled", EXIT_STALLED
        else:
            status = "stopped"
    except InvariantViolation as exc:
        status, exit_code, message = "invariant_violation", EXIT_INVARIANT, str(exc)
    except KeyboardInterrupt:
        status, exit_code, message = "interrupted", EXIT_INTERRUPTED, "interrupted (Ctrl-C)"
    finally:
        if progress:
            progress.stop()
    stopped = status != "complete"
    if stopped:
        loop.fail_in_flight()
    _record_requests(components, loop, stopped)
    tables = tables_from_recorder(components.recorder)
    crash = None
    if loop.crash is not None:
        c = loop.crash
        crash = {"step": c.step, "time_s": c.time_s, "request_id": c.request_id, "reason": c.reason}
    summary = run_summary(
        tables,
        group_kinds=components.group_kinds,
        slo_ttft_s=scenario.slo.ttft_s if scenario.slo else None,
        slo_tpot_s=scenario.slo.tpot_s if scenario.slo else None,
        crash=crash,
    )
    summary.update(
        {
            "name": scenario.name,
            "seed": scenario.seed,
            "clock": scenario.clock,
            "policy": scenario.scheduler.prefix_policy,
            "connector": scenario.connector.type,
            "num_blocks": components.kv_cache_config.num_blocks,
            "block_sizes": [g.spec.block_size for g in components.kv_cache_config.groups],
            "steps": loop.step,
            "simulated_s": float(env.now),
            "status": status,
            "message": message,
        }
    )
    if connector is not None and hasattr(connector, "metrics"):
        summary["connector_metrics"] = connector.metrics()
    partial = status not in ("complete", "crashed")
    result = RunResult(
        summary=summary, tables=tables, path=None, group_kinds=list(components.group_kinds), exit_code=exit_code
    )
    if out_dir is not None:
        out = Path(out_dir)
        write_result(
            out,
            scenario_yaml=resolved_yaml(scenario),
            summary=summary,
            tables=tables,
            tables_format=scenario.outputs.tables_format,
            partial=partial,
        )
        result.summary["partial"] = partial
        result.path = out
        if crash is not None:
            _write_crash(out, scenario, components, crash)
        plots = scenario.outputs.plots if options.write_plots is None else options.write_plots
        if plots:
            from sim.analysis.plots import plot_all

            result.plots = plot_all(result, out / "plots", fmt=options.plot_format, group_kinds=components.group_kinds)
    return result


def _write_crash(out: Path, scenario: Scenario, components: Components, crash: dict) -> None:
    """``crash.json`` (with the crashing admission's per-group hits) and the replay bundle."""
    admissions = components.recorder.admissions.data
    detail = dict(crash)
    for i in range(len(admissions["request_id"]) - 1, -1, -1):
        if admissions["request_id"][i] == crash["request_id"]:
            detail["hits"] = [admissions[f"hit_g{g}"][i] for g in range(components.recorder.num_groups)]
            detail["local_tokens"] = admissions["local_tokens"][i]
            detail["external_tokens"] = admissions["external_tokens"][i]
            detail["claimed_boundary"] = admissions["num_computed_tokens"][i]
            break
    text = json.dumps(detail, indent=2, sort_keys=True) + "\n"
    (out / "crash.json").write_text(text, encoding="utf-8")
    replay = out / "replay"
    replay.mkdir(exist_ok=True)
    (replay / "crash.json").write_text(text, encoding="utf-8")
    (replay / "replay.yaml").write_text(_replay_yaml(scenario, crash["step"]), encoding="utf-8")


class _Progress:
    """A rich progress bar over simulated steps/time and finished requests (terminal only)."""

    def __init__(self, scenario: Scenario, total_requests: int) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.total = total_requests
        self.unit = "step" if scenario.clock == "steps" else "s"
        self.bar = Progress(
            TextColumn(f"[bold]{scenario.name}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("requests  {task.fields[clock]}"),
            TimeElapsedColumn(),
            transient=True,
        )
        self.task = self.bar.add_task("run", total=total_requests, clock="")
        self._last = -1

    def start(self) -> None:
        self.bar.start()

    def stop(self) -> None:
        self.bar.stop()

    def update(self, step: int, now: float, finished: int) -> None:
        if step - self._last < 200 and finished < self.total:
            return
        self._last = step
        clock = f"step {step}" if self.unit == "step" else f"t={now:.1f}s step {step}"
        self.bar.update(self.task, completed=finished, clock=clock)


def run(scenario: Scenario | str | Path, out_dir: str | Path | None = None, **kwargs: Any) -> RunResult:
    """Notebook-friendly alias of :func:`run_scenario` (``sim.run``)."""
    return run_scenario(scenario, out_dir, options=RunOptions(**kwargs) if kwargs else None)
