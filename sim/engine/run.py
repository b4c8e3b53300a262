"""Stages 1 and 2 of a run: :func:`build_run` wires it, :meth:`Run.execute` simulates it.

The run flows one way (docs/architecture.md)::

    build_run(scenario) -> Run            this module: all the wiring, once
    Run.execute()       -> RunRecord      this module: drive the SimPy engine
    finalize(record)    -> RunResult      sim.results: tables and summary
    write_bundle(result, dir)             sim.results: the result bundle

:func:`build_run` does every piece of wiring a run needs (the components of
:mod:`sim.engine.build`, the transfer service, the connector's binding, the
invariant check, the engine loop), so no caller builds an
:class:`~sim.engine.loop.EngineLoop` by hand. :meth:`Run.execute` runs the
engine to the end of the workload, or to a crash, an invariant violation, a
stall, ``max_steps`` or Ctrl-C, maps how it ended to a status and an exit
code, and records one ``requests`` row per request. It neither summarises
nor writes: that is :mod:`sim.results`' job.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
import simpy

from sim.accel import QuietDecodeScheduler
from sim.config import load_scenario
from sim.config.scenario import Scenario
from sim.core.kv.specs import KVCacheConfig
from sim.core.request import Request
from sim.core.scheduler import Scheduler, SchedulerOutput
from sim.engine.actions import build_actions
from sim.engine.build import Components, build_components
from sim.engine.loop import EngineLoop, InvariantViolation, StopRun
from sim.engine.request_rows import record_requests
from sim.engine.stretch import StretchLoop, decode_run_of
from sim.engine.transfer import EngineTransferService
from sim.interrupts import interruptible, pause_hook
from sim.trace.recorder import Recorder
from sim.workload.stream import StreamedTrace

if TYPE_CHECKING:
    from sim.engine.sessions import SessionDriver

#: ``(output, scheduler) -> seconds`` of one engine step.
StepDuration = Callable[[SchedulerOutput, Scheduler], float]


@dataclass
class RunOptions:
    """How to run (not what): progress display, invariant checks, step cap, plot format.

    ``plot_format`` and ``write_plots`` are read by the callers that draw plots
    (``sim.run``, the CLI), never by the engine.
    """

    progress: bool = False
    check_invariants: bool = False
    plot_format: str = "png"
    write_plots: bool | None = None
    max_steps: int | None = None
    force: bool = False  # replace an output folder holding files hybridsim did not write (kept aside)
    #: The simulator's speed layer (sim.accel: quiet horizons); ``None``: on unless the
    #: environment sets ``HYBRIDSIM_PLAIN=1``. Off runs the plain vLLM-mirroring path
    #: (identical tables, slower), for differential tests and debugging.
    fast_paths: bool | None = None
    #: Let a finished request's prompt content and block hashes go (:meth:`~sim.core.request.Request.retire`)
    #: where nothing reads them after the run (no connector, sessions or ideal hit rate); off for a caller that
    #: reads the run's requests afterwards (``hybridsim replay --shrink``'s probe).
    retire_finished: bool = True

    def use_fast_paths(self) -> bool:
        if self.fast_paths is not None:
            return self.fast_paths
        return os.environ.get("HYBRIDSIM_PLAIN", "") in ("", "0")


@dataclass
class RunRecord:
    """What :meth:`Run.execute` leaves: the recorded data and how the run ended.

    ``status`` is one of ``complete``, ``crashed``, ``stalled``, ``stopped``,
    ``invariant_violation``, ``interrupted`` (the CLI maps it to an exit
    code: ``sim.cli.exit_codes.RUN_STATUS_EXIT``); ``crash`` the crash marker (``step``, ``time_s``,
    ``request_id``, ``reason``) or ``None``. The recorder holds every table's
    columns, including one ``requests`` row per request. ``requests`` are the
    runnable requests (rejected ones excluded), ``lookup_path`` the lookup the
    prefix policy took with this connector, ``think_used`` the think times the
    closed-loop session driver applied (empty without one).
    """

    scenario: Scenario
    recorder: Recorder
    kv_cache_config: KVCacheConfig
    group_kinds: list[str]
    status: str
    message: str
    crash: dict[str, Any] | None
    steps: int
    simulated_s: float
    connector_metrics: dict[str, Any] | None
    requests: list[Request] | StreamedTrace
    lookup_path: str
    think_used: dict[str, float]


def _step_duration_fn(components: Components) -> StepDuration:
    model = components.step_time_model
    if model is None:
        return lambda output, sched: 1.0

    def duration(output, sched) -> float:
        return model.step_time_of_batch(output.decode_tokens, output.decode_context_tokens, output.prefill_chunks)

    return duration


def _session_driver(scenario: Scenario, requests: list[Request]) -> SessionDriver | None:
    """The closed-loop session driver, or ``None`` (no sessions, or open-loop replay)."""
    spec = scenario.workload.sessions
    if spec is None or spec.mode != "closed":
        return None
    from sim.engine.sessions import SessionDriver  # imported only for the runs that have closed-loop sessions

    return SessionDriver(requests, spec)


def _transfer_service(env: simpy.Environment, clock: str):
    from sim.engine.transfer import SimPyTransferService, StepTransferService

    return StepTransferService() if clock == "steps" else SimPyTransferService(env)


def bind_connector(components: Components, rng: np.random.Generator, transfers: EngineTransferService) -> None:
    """Bind the run's connector (if any) to its layout, clock, random stream and transfer service."""
    connector = components.connector
    if connector is not None:
        from sim.connector.context import context_from_kv_cache_config

        connector.bind(
            context_from_kv_cache_config(components.kv_cache_config, components.scenario.clock, rng, transfers)
        )


def invariant_check(components: Components, options: RunOptions) -> Callable[[], None] | None:
    """The per-step cache invariant check, when the options or the scenario ask for it."""
    if not (options.check_invariants or components.scenario.check_invariants):
        return None
    from functools import partial

    from sim.core.kv.kv_cache_manager import check_invariants

    return partial(check_invariants, components.kv_manager)


class Run:
    """A wired run (what :func:`build_run` returns); :meth:`execute` it once."""

    def __init__(
        self,
        components: Components,
        env: simpy.Environment,
        loop: EngineLoop,
        progress: _Progress | None,
        sessions: SessionDriver | None = None,
        rebuild: Callable[[], Run] | None = None,
    ) -> None:
        self.components = components
        self.env = env
        self.loop = loop
        self.progress = progress
        #: The closed-loop session driver that releases later turns (``None`` without one).
        self.sessions = sessions
        #: The same run without quiet stretches (:mod:`sim.engine.stretch`), for a stop that a stretch
        #: cannot settle exactly.
        self.rebuild = rebuild
        self._executed = False

    @property
    def scenario(self) -> Scenario:
        return self.components.scenario

    def execute(self) -> RunRecord:
        """Simulate to the end (or to whatever stops the run) and return the record."""
        if self._executed:
            raise RuntimeError("Run.execute() was already called; build a new run with build_run()")
        self._executed = True
        loop, progress = self.loop, self.progress
        status, message = "complete", ""
        try:
            with interruptible():  # inside sim.run_scenario's deferred section: a signal stops the loop
                if progress:
                    progress.start()
                self.env.run(until=loop.process)
        except StopRun as stop:
            message = str(stop)
            if loop.crash is not None:
                status = "crashed"
            elif loop.stalled:
                status = "stalled"
            else:
                status = "stopped"
        except InvariantViolation as exc:
            status, message = "invariant_violation", str(exc)
        except KeyboardInterrupt as exc:
            status, message = "interrupted", str(exc) or "interrupted (Ctrl-C)"
        finally:
            if progress:
                progress.stop()
            loop.close()
        if isinstance(loop, StretchLoop) and not loop.settle() and status != "interrupted" and self.rebuild:
            return self.rebuild().execute()
        think_used = dict(self.sessions.think_used) if self.sessions is not None else {}
        return loop_record(self.components, loop, status, message, float(self.env.now), think_used)


def loop_record(
    components: Components,
    loop: EngineLoop,
    status: str,
    message: str,
    simulated_s: float,
    think_used: dict[str, float],
) -> RunRecord:
    """What an engine loop that ended with ``status`` leaves: its requests' rows recorded (``components``'
    requests and rejected ones; those in flight failed when the run stopped early), its crash, the rest of
    the run's facts. One engine's run and each of a cluster's instances end through it."""
    stopped = status != "complete"
    if stopped:
        loop.fail_in_flight()
    record_requests(components.recorder, components.requests, components.rejected, loop, stopped)
    crash = None
    if loop.crash is not None:
        c = loop.crash
        crash = {"step": c.step, "time_s": c.time_s, "request_id": c.request_id, "reason": c.reason}
    connector = components.connector
    return RunRecord(
        scenario=components.scenario,
        recorder=components.recorder,
        kv_cache_config=components.kv_cache_config,
        group_kinds=list(components.group_kinds),
        status=status,
        message=message,
        crash=crash,
        steps=loop.step,
        simulated_s=simulated_s,
        connector_metrics=connector.metrics() if connector is not None else None,
        requests=components.requests,
        lookup_path=components.scheduler.prefix_policy.lookup_path(connector),
        think_used=think_used,
    )


def build_run(
    scenario: Scenario | str | Path,
    options: RunOptions | None = None,
    *,
    step_duration: StepDuration | None = None,
    stretches: bool = True,
) -> Run:
    """Wire one run of ``scenario`` (a Scenario or a YAML path): components, clock, connector, engine loop.

    ``step_duration`` replaces the step-time model (tests use a constant); by
    default ``clock: steps`` takes 1 per step and ``clock: time`` the
    scenario's step-time model. With the fast paths on, the engine takes quiet
    stretches of steps as one event (:mod:`sim.engine.stretch`) unless
    ``stretches`` is False, a step duration is given, or the run has a
    connector or closed-loop sessions.
    """
    if not isinstance(scenario, Scenario):
        scenario = load_scenario(scenario)
    options = options or RunOptions()
    # A trace that streams is read as its requests arrive, and a finished one's row recorded and let go,
    # where nothing reads a finished request (as for retiring one, below) and nothing else names one (actions).
    streamed = (
        options.retire_finished
        and scenario.connector.type == "none"
        and scenario.workload.sessions is None
        and not scenario.outputs.ideal_hit_rate
        and not scenario.actions
    )
    components = build_components(scenario, fast_paths=options.use_fast_paths(), streamed=streamed)
    assert components is not None
    env = simpy.Environment()
    transfers = _transfer_service(env, scenario.clock)
    connector = components.connector
    bind_connector(components, components.connector_rng, transfers)
    progress = _Progress(scenario, len(components.requests)) if options.progress else None
    check = invariant_check(components, options)
    sessions = (
        _session_driver(scenario, components.requests) if not isinstance(components.requests, StreamedTrace) else None
    )
    hook = pause_hook("run")
    retire = options.retire_finished and connector is None and sessions is None and not scenario.outputs.ideal_hit_rate
    loop_cls: type[EngineLoop] = EngineLoop
    extra: dict[str, Any] = {}
    if (
        stretches
        and options.use_fast_paths()
        and step_duration is None
        and connector is None
        and sessions is None
        and hook is None
        and isinstance(components.scheduler, QuietDecodeScheduler)
    ):
        # Quiet stretches (sim.engine.stretch): a run of steps in which every running request takes a quiet
        # decode is one SimPy event, bounded by the loop's own next arrival (nothing else reaches this engine).
        loop_cls = StretchLoop
        extra = {"decode_run": decode_run_of(scenario.clock, components.step_time_model)}
    loop = loop_cls(
        env=env,
        scheduler=components.scheduler,
        requests=sessions.initial if sessions is not None else components.requests,
        clock=scenario.clock,
        step_duration=step_duration or _step_duration_fn(components),
        recorder=components.recorder,
        kv_manager=components.kv_manager,
        connector=connector,
        transfers=transfers,
        actions=build_actions(scenario, components),
        on_crash=scenario.on_crash,
        check_invariants=check,
        step_columns=connector.step_columns if connector is not None else None,
        progress=progress.update if progress else hook,
        max_steps=options.max_steps,
        on_finished=sessions.on_finished if sessions is not None else None,
        retire_finished=retire,
        record_finished=retire and isinstance(components.requests, StreamedTrace),
        **extra,
    )
    if sessions is not None:
        sessions.release = loop.release
    rebuild = None
    if loop_cls is StretchLoop:
        rebuild = lambda: build_run(scenario, options, stretches=False)  # noqa: E731
    return Run(components, env, loop, progress, sessions, rebuild)


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
