"""Run a sweep into a directory, resumably.

Layout of ``DIR``::

    DIR/<run-id>/            a normal result bundle (scenario.resolved.yaml, summary.json, tables, plots)
    DIR/<run-id>/sweep-run.json   the run's identity: base scenario hash + override strings
    DIR/<run-id>/error.txt   traceback, for a failed run
    DIR/sweep.json           manifest: definition + every run's values, overrides, status, error
    DIR/sweep.parquet        one row per run (see :mod:`sim.sweep.table`)
    DIR/plots/<name>.png     the sweep's ``plots:`` figures

Every file is written by :func:`sim.trace.output.write_file` inside ``DIR``: ``DIR`` itself must be a real
folder (``-o LINK`` is refused at once), no folder below it is followed if it is a link, and ``sweep.json``
(stamped) and ``sweep.parquet`` (its hash recorded in ``sweep.json``) are replaced only when this tool
provably wrote them; a user's ``sweep.json`` there is refused before anything runs unless ``force`` (then it
is kept aside as ``sweep.json.old``).

Resume rule: a run whose bundle is whole and complete (it matches its manifest, see
:func:`~sim.sweep.executors.complete_summary`) and whose ``sweep-run.json`` matches
is reused, not rerun; every other run is run again (so a failed run is retried) and
its new bundle replaces the old one whole. A run folder holding anything hybridsim
did not write is an error before anything runs: a sweep never deletes it. A run directory that belongs to a *different* definition
(other base scenario content or overrides) is an error, raised before anything
runs or is deleted. ``sweep.json`` and ``sweep.parquet`` are pure functions of the
definition and the runs' outcomes: no timestamps, no executor, planned order.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

from sim.sweep.executors import (
    Executor,
    LoadFn,
    RunFn,
    RunOutcome,
    RunTask,
    complete_summary,
    default_load,
    make_executor,
)
from sim.sweep.grid import RunSpec, SweepError, SweepSpec, build_sweep, plan_runs, yaml_text
from sim.sweep.table import build_table, write_table

MANIFEST_FILE = "sweep.json"
TABLE_FILE = "sweep.parquet"
IDENTITY_FILE = "sweep-run.json"
PLOTS_DIR = "plots"
MANIFEST_FORMAT = 1


@dataclass(frozen=True)
class RunRecord:
    """A planned run and what became of it (``status`` ok | failed)."""

    run_id: str
    values: dict[str, Any]
    seed: int
    overrides: tuple[str, ...]
    status: str
    error: str | None
    summary: dict[str, Any] | None


@dataclass
class SweepResult:
    """What :func:`run_sweep` did. ``runs`` are in planned order; ``executed`` / ``reused`` partition their ids."""

    out_dir: Path
    runs: list[RunRecord]
    executed: list[str]
    reused: list[str]
    plots: list[Path] = field(default_factory=list)
    plot_errors: list[str] = field(default_factory=list)
    #: Files that were not hybridsim's and were kept aside (``force``).
    notes: list[str] = field(default_factory=list)

    @property
    def failed(self) -> list[RunRecord]:
        return [r for r in self.runs if r.status == "failed"]

    @property
    def table_path(self) -> Path:
        return self.out_dir / TABLE_FILE

    def table(self) -> Any:
        """``sweep.parquet`` as a pandas DataFrame."""
        return read_sweep(self.out_dir)

    def describe(self, max_failures: int = 5) -> str:
        """A few lines for a terminal: counts, where the table is, failures (first few), figures."""
        failed = self.failed
        lines = [
            f"{len(self.runs)} runs: {len(self.executed)} ran, {len(self.reused)} reused, {len(failed)} failed",
            f"table: {self.table_path}",
        ]
        for record in failed[:max_failures]:
            lines.append(f"  failed {record.run_id}: {record.error}")
        if len(failed) > max_failures:
            lines.append(f"  ... {len(failed) - max_failures} more failed runs in {self.out_dir / MANIFEST_FILE}")
        lines += [f"plot: {path}" for path in self.plots]
        lines += [f"plot not drawn: {problem}" for problem in self.plot_errors]
        return "\n".join(lines)


def read_sweep(out_dir: Path | str) -> Any:
    """Load ``DIR/sweep.parquet`` as a pandas DataFrame."""
    import pandas as pd

    return pd.read_parquet(Path(out_dir) / TABLE_FILE)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _identity(scenario_sha: str, run: RunSpec) -> dict[str, Any]:
    return {"scenario_sha256": scenario_sha, "overrides": list(run.overrides)}


def _read_identity(run_dir: Path) -> dict[str, Any] | None:
    """The run's identity (``sweep-run.json`` without its ownership stamp), or None."""
    from sim.trace.output import STAMP_KEY

    try:
        data = json.loads((run_dir / IDENTITY_FILE).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    data.pop(STAMP_KEY, None)
    return data


def _recorded_table_sha(out_dir: Path) -> str | None:
    """The ``sweep.parquet`` hash that this tool's own ``sweep.json`` (stamped, unedited) recorded."""
    from sim.trace.output import unstamped

    path = out_dir / MANIFEST_FILE
    try:
        if path.is_symlink() or not path.is_file() or path.stat().st_size > 64 << 20:
            return None
        body = unstamped(".json", path.read_bytes())
        data = json.loads(body) if body is not None else None
    except (OSError, ValueError):
        return None
    sha = data.get("table_sha256") if isinstance(data, dict) else None
    return sha if isinstance(sha, str) else None


def _check_ours(run_dir: Path) -> None:
    """Refuse (before anything runs or is removed) a run folder holding anything the sweep did not write."""
    from sim.trace.atomic import OutputFolderError, check_output_folder

    try:
        check_output_folder(run_dir)
    except OutputFolderError as exc:
        raise SweepError(f"{exc}; a sweep never deletes a folder it did not write") from None


def _clear_for_rerun(run_dir: Path) -> None:
    """Make ``run_dir`` ready for a rerun without deleting anything foreign: drop a failed run's
    ``error.txt`` (ours: :func:`_check_ours` proved it); the old bundle (if any) is replaced whole when the new
    one is written."""
    from sim.sweep.executors import ERROR_FILE

    _check_ours(run_dir)
    (run_dir / ERROR_FILE).unlink(missing_ok=True)


def _base_seed(spec: SweepSpec, load: LoadFn) -> int:
    """Load the base scenario with the fixed overrides once (fail fast on a bad file); return its ``seed``."""
    try:
        scenario = load(str(spec.scenario.resolve()), [f"{k}={yaml_text(v)}" for k, v in spec.fixed])
    except Exception as exc:
        raise SweepError(f"cannot load base scenario {spec.scenario}: {exc}") from exc
    seed = scenario.seed
    if spec.seeds.values is None and (not isinstance(seed, int) or isinstance(seed, bool)):
        raise SweepError(
            f"base scenario {spec.scenario} has no integer 'seed' to count seeds from; give explicit seeds"
        )
    return seed if isinstance(seed, int) else 0


def _progress_wanted(progress: bool | None) -> bool:
    if progress is not None:
        return progress
    return sys.stderr.isatty() and not os.environ.get("CI")


def _with_progress(outcomes: Iterator[RunOutcome], total: int, reused: int, show: bool) -> Iterator[RunOutcome]:
    if not show or total == 0:
        yield from outcomes
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    )
    label = f"sweep ({reused} reused)" if reused else "sweep"
    failed = 0
    with Progress(*columns, console=Console(stderr=True)) as bar:
        task = bar.add_task(label, total=total)
        for outcome in outcomes:
            failed += outcome.status == "failed"
            bar.update(task, advance=1, description=f"{label}, {failed} failed" if failed else label)
            yield outcome


def _manifest(spec: SweepSpec, scenario_sha: str, seeds: Sequence[int], records: Sequence[RunRecord]) -> dict[str, Any]:
    return {
        "format": MANIFEST_FORMAT,
        "scenario": spec.scenario.as_posix(),
        "scenario_sha256": scenario_sha,
        "set": dict(spec.fixed),
        "axes": [{"keys": list(a.keys), "points": [list(p) for p in a.points]} for a in spec.axes],
        "seeds": list(seeds),
        "plots": [
            {"name": p.name, "x": p.x, "metrics": list(p.metrics), "hue": p.hue, "missing": p.missing, "title": p.title}
            for p in spec.plots
        ],
        "runs": [
            {
                "run_id": r.run_id,
                "values": r.values,
                "seed": r.seed,
                "overrides": list(r.overrides),
                "status": r.status,
                "error": r.error,
            }
            for r in records
        ],
    }


def _draw_plots(spec: SweepSpec, out_dir: Path, result: SweepResult, force: bool = False) -> None:
    from sim.sweep.plots import plot_sweep

    frame = result.table()
    ok = frame[frame["status"] == "ok"]
    if (out_dir / PLOTS_DIR).is_symlink():
        result.plot_errors.append(f"{out_dir / PLOTS_DIR} is a symbolic link; links are never followed")
        return
    for plot in spec.plots:
        if ok.empty:
            result.plot_errors.append(f"plot {plot.name!r}: no successful runs to plot")
            continue
        out = out_dir / PLOTS_DIR / f"{plot.name}.png"
        try:
            plot_sweep(
                frame,
                x=plot.x,
                metrics=list(plot.metrics),
                hue=plot.hue,
                out=out,
                missing=plot.missing,
                title=plot.title,
                force=force,
            )
        except ValueError as exc:
            result.plot_errors.append(f"plot {plot.name!r}: {exc}")
        else:
            result.plots.append(out)


def run_sweep(
    spec: SweepSpec | Path | str,
    out_dir: Path | str,
    *,
    grid: Sequence[str] = (),
    grid_file: Path | str | None = None,
    seeds: str | int | Sequence[int] | None = None,
    overrides: Sequence[str] = (),
    executor: str | Executor = "local",
    jobs: int | None = None,
    progress: bool | None = None,
    load_fn: LoadFn | None = None,
    run_fn: RunFn | None = None,
    force: bool = False,
) -> SweepResult:
    """Run every planned run not already complete in ``out_dir``; write ``sweep.json``, ``sweep.parquet`` and plots.

    ``spec`` is a :class:`SweepSpec`, or a scenario / sweep-file path that is combined with ``grid``,
    ``grid_file``, ``seeds`` and ``overrides`` by :func:`~sim.sweep.grid.build_sweep` (those four are only
    for the path form).

    ``executor``: ``"local"`` (process pool of ``jobs``, default all CPUs), ``"serial"``, ``"ray"``, or an
    :class:`~sim.sweep.executors.Executor`. ``progress``: a rich progress bar (default: only on a TTY and when the
    ``CI`` environment variable is unset). ``load_fn`` / ``run_fn`` replace :func:`sim.config.load_scenario` /
    :func:`sim.api.run_scenario`; they must be module-level (picklable) functions.
    Failed runs are recorded, never raised; bad input raises :class:`~sim.sweep.grid.SweepError`.
    ``out_dir`` as a link, or holding a ``sweep.json`` / ``sweep.parquet`` this tool did not write, is refused
    before anything runs (:class:`~sim.trace.output.OutputPathError`) unless ``force``; an unwritable
    ``out_dir`` (read-only file system) raises :class:`~sim.trace.output.OutputWriteError`.
    """
    from sim.trace.output import check_output_file, open_output_dir, write_file

    if isinstance(spec, SweepSpec):
        if grid or grid_file is not None or seeds is not None or overrides:
            raise SweepError("grid, grid_file, seeds and overrides go with a scenario path, not with a SweepSpec")
    else:
        spec = build_sweep(spec, grid, grid_file, seeds, overrides)
    out_dir = Path(out_dir)
    runner = make_executor(executor, jobs) if isinstance(executor, str) else executor
    base_seed = _base_seed(spec, load_fn or default_load)
    runs = plan_runs(spec, base_seed)
    scenario_sha = _sha256(spec.scenario)
    scenario_path = str(spec.scenario.resolve())
    out_dir = Path(os.path.abspath(out_dir))
    with open_output_dir(out_dir):
        pass  # a real folder (never a link), created if missing, writable
    table_sha = _recorded_table_sha(out_dir)
    check_output_file(out_dir / MANIFEST_FILE, force=force, option="-o/--out")
    check_output_file(out_dir / TABLE_FILE, force=force, known_sha256=table_sha, option="-o/--out")

    reused: dict[str, dict[str, Any]] = {}
    for run in runs:
        run_dir = out_dir / run.run_id
        _check_ours(run_dir)
        identity = _read_identity(run_dir)
        wanted = _identity(scenario_sha, run)
        if identity is not None and identity != wanted:
            if identity.get("scenario_sha256") != scenario_sha:
                what = f"the base scenario {spec.scenario} changed since"
            else:
                what = f"its overrides were {identity.get('overrides')}, now {wanted['overrides']}"
            raise SweepError(
                f"{run_dir} holds a run of a different sweep ({what}); use a new output directory or remove that one"
            )
        summary = complete_summary(run_dir) if identity is not None else None
        if summary is not None:
            reused[run.run_id] = summary

    tasks = []
    for run in runs:
        if run.run_id in reused:
            continue
        run_dir = out_dir / run.run_id
        _clear_for_rerun(run_dir)
        write_file(run_dir / IDENTITY_FILE, json.dumps(_identity(scenario_sha, run), indent=2) + "\n", within=out_dir)
        tasks.append(RunTask(run.run_id, scenario_path, run.overrides, str(run_dir), load_fn, run_fn))

    outcomes: dict[str, RunOutcome] = {}
    for outcome in _with_progress(runner.run(tasks), len(tasks), len(reused), _progress_wanted(progress)):
        outcomes[outcome.run_id] = outcome

    records = []
    for run in runs:
        if run.run_id in reused:
            status, error, summary = "ok", None, reused[run.run_id]
        else:
            got = outcomes[run.run_id]
            status, error, summary = got.status, got.error, got.summary
        records.append(RunRecord(run.run_id, dict(run.values), run.seed, run.overrides, status, error, summary))

    rows = [
        {
            "run_id": r.run_id,
            "values": r.values,
            "seed": r.seed,
            "status": r.status,
            "error": r.error,
            "summary": r.summary,
        }
        for r in records
    ]
    notes: list[str] = []
    manifest = _manifest(spec, scenario_sha, spec.seeds.resolve(base_seed), records)
    manifest["table_sha256"] = write_table(
        build_table(spec.keys, rows), out_dir / TABLE_FILE, known_sha256=table_sha, force=force, within=out_dir
    )
    text = json.dumps(manifest, indent=2, default=yaml_text) + "\n"
    write_file(out_dir / MANIFEST_FILE, text, force=force, notes=notes, within=out_dir, option="-o/--out")

    result = SweepResult(
        out_dir=out_dir,
        runs=records,
        executed=[t.run_id for t in tasks],
        reused=[r.run_id for r in runs if r.run_id in reused],
        notes=notes,
    )
    if spec.plots:
        _draw_plots(spec, out_dir, result, force)
    return result
