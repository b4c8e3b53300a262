"""Where sweep runs execute: in this process, in a local process pool, or as Ray tasks.

Every executor runs picklable :class:`RunTask` values through the same module-level
:func:`execute_run` and yields one :class:`RunOutcome` per task, in completion order
(the runner restores the planned order). A task carries the scenario *path* and
override *strings*, never a scenario object: each worker loads its own scenario.

A run that raises is an outcome with ``status="failed"`` and the error text; it
never stops the other runs. A simulated engine crash is not a failure: the run
completed, and its ``summary.json`` says ``crash``.
"""

from __future__ import annotations

import json
import os
import traceback
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Any, Callable, Iterator, Protocol, Sequence

from sim.sweep.grid import SweepError

SUMMARY_FILE = "summary.json"
ERROR_FILE = "error.txt"
EXECUTORS = ("local", "serial", "ray")


class LoadedScenario(Protocol):
    """What a sweep reads of a loaded scenario: its ``seed`` (the base of a seed range)."""

    @property
    def seed(self) -> int | None: ...


LoadFn = Callable[[Any, list[str]], LoadedScenario]
"""``(scenario_path, overrides) -> Scenario``, like :func:`sim.config.load_scenario`."""
RunFn = Callable[[Any, Path], Any]
"""``(scenario, out_dir) -> RunResult``, like :func:`sim.api.run_scenario`; writes ``summary.json``."""


@dataclass(frozen=True)
class RunTask:
    """One run to execute. ``load_fn`` / ``run_fn`` must be module-level functions (they are pickled by name);
    ``None`` means the real :func:`sim.config.load_scenario` / :func:`sim.api.run_scenario`."""

    run_id: str
    scenario: str
    overrides: tuple[str, ...]
    out_dir: str
    load_fn: LoadFn | None = None
    run_fn: RunFn | None = None


@dataclass(frozen=True)
class RunOutcome:
    """``status`` is ``"ok"`` (then ``summary`` is the bundle's ``summary.json``) or ``"failed"`` (then ``error``)."""

    run_id: str
    status: str
    error: str | None
    summary: dict[str, Any] | None


def complete_summary(run_dir: Path) -> dict[str, Any] | None:
    """The bundle's summary if the run completed and the bundle is whole: it matches its manifest
    (:func:`sim.trace.atomic.check_bundle`: every table present with its row count and hash), is not
    partial, and ``summary.json`` is a non-empty mapping."""
    from sim.trace.atomic import check_bundle

    try:
        check = check_bundle(run_dir)
        if not check.ok or check.partial:
            return None
        summary = json.loads((Path(run_dir) / SUMMARY_FILE).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(summary, dict) or not summary or summary.get("partial") is True:
        return None
    return summary


def describe_error(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def default_load(path: Any, overrides: list[str]) -> Any:
    from sim.config import load_scenario

    return load_scenario(path, overrides)


def default_run(scenario: Any, out_dir: Path) -> Any:
    from sim.api import run_scenario

    return run_scenario(scenario, out_dir)


def execute_run(task: RunTask) -> RunOutcome:
    """Load the scenario with the task's overrides, run it into ``task.out_dir``, report the outcome.

    On failure the traceback goes to ``<out_dir>/error.txt``; the outcome carries the one-line error.
    """
    out = Path(task.out_dir)
    try:
        scenario = (task.load_fn or default_load)(task.scenario, list(task.overrides))
        (task.run_fn or default_run)(scenario, out)
        summary = complete_summary(out)
        if summary is None:
            raise RuntimeError(f"the run returned without writing a complete {SUMMARY_FILE}")
    except Exception as exc:
        from sim.trace.output import OutputPathError, write_file

        try:
            write_file(out / ERROR_FILE, traceback.format_exc())
        except (OSError, OutputPathError):
            pass
        return RunOutcome(task.run_id, "failed", describe_error(exc), None)
    return RunOutcome(task.run_id, "ok", None, summary)


def _lost(task: RunTask, exc: BaseException) -> RunOutcome:
    """Outcome of a task whose worker died or could not start it (killed process, lost Ray node, unimportable
    function). Ray's errors carry a whole remote traceback; the last line names the cause."""
    lines = [line.strip() for line in describe_error(exc).splitlines() if line.strip()]
    return RunOutcome(task.run_id, "failed", f"worker lost: {lines[-1]}", None)


class Executor(Protocol):
    name: str

    def run(self, tasks: Sequence[RunTask]) -> Iterator[RunOutcome]: ...


class SerialExecutor:
    """Runs tasks one after the other in this process (debugging; the reference for determinism tests)."""

    name = "serial"

    def run(self, tasks: Sequence[RunTask]) -> Iterator[RunOutcome]:
        for task in tasks:
            yield execute_run(task)


class LocalExecutor:
    """A ``ProcessPoolExecutor`` of ``jobs`` worker processes (spawned, so no state leaks from the parent)."""

    name = "local"

    def __init__(self, jobs: int | None = None):
        self.jobs = default_jobs() if jobs is None else jobs
        if self.jobs < 1:
            raise SweepError(f"-j/--jobs must be >= 1, got {self.jobs}")

    def run(self, tasks: Sequence[RunTask]) -> Iterator[RunOutcome]:
        if not tasks:
            return
        pool = ProcessPoolExecutor(max_workers=min(self.jobs, len(tasks)), mp_context=get_context("spawn"))
        try:
            pending: dict[Future[RunOutcome], RunTask] = {pool.submit(execute_run, t): t for t in tasks}
            while pending:
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                for future in sorted(done, key=lambda f: pending[f].run_id):
                    task = pending.pop(future)
                    exc = future.exception()
                    yield _lost(task, exc) if exc is not None else future.result()
        finally:
            pool.shutdown(wait=True, cancel_futures=True)


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise SweepError("the 'ray' executor needs Ray, an optional extra: pip install 'hybridsim[ray]'") from None
    return ray


class RayExecutor:
    """The same tasks as Ray tasks. Uses an already initialised Ray; otherwise ``ray.init()``, which connects to
    the cluster at ``RAY_ADDRESS`` when that is set and starts a local one when not (and shuts it down after).

    ``max_in_flight`` (``-j``) bounds the tasks submitted at once; ``None`` submits all and lets Ray schedule.
    On a multi-node cluster the sweep directory must be on a filesystem every node sees.
    """

    name = "ray"

    def __init__(self, max_in_flight: int | None = None):
        if max_in_flight is not None and max_in_flight < 1:
            raise SweepError(f"-j/--jobs must be >= 1, got {max_in_flight}")
        self.max_in_flight = max_in_flight

    def run(self, tasks: Sequence[RunTask]) -> Iterator[RunOutcome]:
        if not tasks:
            return
        ray = import_ray()
        started = not ray.is_initialized()
        if started:
            ray.init()
        try:
            remote = ray.remote(execute_run)
            queue = iter(tasks)
            pending: dict[Any, RunTask] = {}
            limit = self.max_in_flight or len(tasks)

            def refill() -> None:
                while len(pending) < limit:
                    task = next(queue, None)
                    if task is None:
                        return
                    pending[remote.remote(task)] = task

            refill()
            while pending:
                (ref,), _ = ray.wait(list(pending), num_returns=1)
                task = pending.pop(ref)
                try:
                    outcome = ray.get(ref)
                except Exception as exc:
                    outcome = _lost(task, exc)
                refill()
                yield outcome
        finally:
            if started:
                ray.shutdown()


def default_jobs() -> int:
    """CPUs this process may use (affinity-aware where the OS says)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


def make_executor(name: str, jobs: int | None = None) -> Executor:
    """``local`` (default: ``jobs`` processes, default all CPUs), ``serial`` (in-process) or ``ray``."""
    if name == "local":
        return LocalExecutor(jobs)
    if name == "serial":
        return SerialExecutor()
    if name == "ray":
        return RayExecutor(jobs)
    raise SweepError(f"unknown executor {name!r} (valid: {', '.join(EXECUTORS)})")
