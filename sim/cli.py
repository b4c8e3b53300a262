"""The ``hybridsim`` command line (typer).

Exit codes (documented in docs/cli.md):

* 0 — success (``trace diff``: the traces are identical);
* 1 — ``trace diff`` found a difference;
* 2 — bad input: a scenario, trace, override or path that cannot be used
  (one line on stderr naming the file, key or line; ``--debug`` shows the
  traceback);
* 3 — the run crashed and ``on_crash: stop`` stopped it (the bundle and
  ``crash.json`` are written);
* 4 — ``--check-invariants`` found a broken invariant (the run stopped; the
  bundle is written and marked partial);
* 5 — the run stalled (requests left that can never be scheduled);
* 6 — ``sweep``: some runs failed (each is recorded with its error in the sweep's table);
* 130 — interrupted (Ctrl-C); the bundle is written and marked partial.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any, Callable, Iterator, List, Optional

import typer

from sim.trace.diff import DEFAULT_TABLES

EXIT_DIFF = 1
EXIT_BAD_INPUT = 2
EXIT_CRASH = 3
EXIT_INVARIANT = 4
EXIT_STALLED = 5
EXIT_SWEEP_FAILURES = 6
EXIT_INTERRUPTED = 130

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="hybridsim: vLLM v1 serving of hybrid Mamba + attention models under KV-cache block pressure.",
)
trace_app = typer.Typer(no_args_is_help=True, help="Compare result traces.")
workload_app = typer.Typer(no_args_is_help=True, help="Inspect workloads.")
app.add_typer(trace_app, name="trace")
app.add_typer(workload_app, name="workload")
golden_app = typer.Typer(no_args_is_help=True, help="Golden traces: re-run the golden scenarios and check or rewrite them.")
app.add_typer(golden_app, name="golden")

_state = {"debug": False}


@app.callback()
def _main(debug: bool = typer.Option(False, "--debug", help="Show full tracebacks on errors.")) -> None:
    _state["debug"] = debug


def _fail(message: str, code: int = EXIT_BAD_INPUT) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def _bad_input_types() -> tuple[type[BaseException], ...]:
    from sim.config import ScenarioError
    from sim.sweep.grid import SweepError
    from sim.trace.diff import TraceDiffError
    from sim.workload.errors import WorkloadError

    return (ScenarioError, WorkloadError, TraceDiffError, SweepError, FileNotFoundError, PermissionError,
            NotADirectoryError, IsADirectoryError, FileExistsError)


@contextlib.contextmanager
def _naming_file(path: Path) -> Iterator[None]:
    """Prefix a build-time bad-input error (which names only the key) with the scenario file."""
    from sim.config import ScenarioError
    from sim.workload.errors import WorkloadError

    try:
        yield
    except (ScenarioError, WorkloadError) as exc:
        if str(exc).startswith(str(path)):
            raise
        raise ScenarioError(f"{path}: {exc}") from exc


def _prepare_out_dir(target: Path) -> None:
    """Create the output directory before running, so an unusable ``-o`` fails in a second, not after the run."""
    from sim.config import ScenarioError

    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ScenarioError(f"-o/--out {target}: cannot create the output directory ({exc.strerror}); "
                            "give a writable directory path") from exc
    if not os.access(target, os.W_OK):
        raise ScenarioError(f"-o/--out {target}: the output directory is not writable; give a writable directory path")


def handles_errors(fn: Callable) -> Callable:
    """Turn known bad-input errors into one line + exit 2 (``--debug``: traceback)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except typer.Exit:
            raise
        except _bad_input_types() as exc:
            if _state["debug"]:
                traceback.print_exc()
            _fail(str(exc) if not isinstance(exc, OSError) else f"{exc.strerror}: {exc.filename}")
        except ValueError as exc:
            if _state["debug"]:
                traceback.print_exc()
            _fail(str(exc))

    return wrapper


def _console():
    from rich.console import Console

    return Console()


def _show_progress() -> bool:
    return sys.stderr.isatty() and not os.environ.get("CI")


# --------------------------------------------------------------------- run
@app.command()
@handles_errors
def run(
    scenarios: List[Path] = typer.Argument(..., help="Scenario YAML file(s)."),
    out: Optional[Path] = typer.Option(None, "-o", "--out", help="Output directory (default results/<name>)."),
    set_: List[str] = typer.Option([], "--set", help="Override a key: key.path=value (YAML value)."),
    seed: Optional[int] = typer.Option(None, "--seed", help="Override the scenario's seed."),
    tables_format: Optional[str] = typer.Option(None, "--format", help="Table format: parquet or csv."),
    no_plots: bool = typer.Option(False, "--no-plots", help="Do not draw plots."),
    svg: bool = typer.Option(False, "--svg", help="Draw plots as SVG instead of PNG."),
    check_invariants: bool = typer.Option(False, "--check-invariants", help="Verify cache invariants after every step."),
    quiet: bool = typer.Option(False, "-q", "--quiet", help="No progress bar and no summary table."),
) -> None:
    """Run scenario(s) and write a result bundle for each."""
    from sim.config import load_scenario
    from sim.api import RunOptions, run_scenario

    overrides = list(set_)
    if seed is not None:
        overrides.append(f"seed={seed}")
    if tables_format is not None:
        overrides.append(f"outputs.tables_format={tables_format}")
    if no_plots:
        overrides.append("outputs.plots=false")
    loaded = [load_scenario(path, overrides) for path in scenarios]
    worst = 0
    for path, scenario in zip(scenarios, loaded):
        if out is None:
            target = Path("results") / scenario.name
        elif len(loaded) > 1:
            target = out / scenario.name
        else:
            target = out
        options = RunOptions(
            progress=_show_progress() and not quiet,
            check_invariants=check_invariants or scenario.check_invariants,
            plot_format="svg" if svg else "png",
        )
        _prepare_out_dir(target)
        with _naming_file(path):
            result = run_scenario(scenario, target, options=options)
        if not quiet:
            print_summary(result.summary, title=f"{scenario.name}  →  {target}")
        worst = max(worst, result.exit_code)
    if worst:
        raise typer.Exit(worst)


def print_summary(summary: dict, title: str = "") -> None:
    """The end-of-run table: latency, hits, divergence, outcomes, evictions."""
    from sim.analysis.report import summary_rows
    from rich.table import Table

    table = Table(title=title or None, show_header=False, box=None, pad_edge=False)
    table.add_column("metric", style="bold")
    table.add_column("value")
    for name, value in summary_rows(summary):
        table.add_row(name, value)
    _console().print(table)


# ----------------------------------------------------------------- validate
@app.command()
@handles_errors
def validate(
    scenarios: List[Path] = typer.Argument(..., help="Scenario YAML file(s)."),
    set_: List[str] = typer.Option([], "--set", help="Override a key: key.path=value."),
) -> None:
    """Check scenario files (keys, types, presets, workload) without running them."""
    from sim.config import load_scenario
    from sim.engine.build import build_components

    for path in scenarios:
        scenario = load_scenario(path, list(set_))
        with _naming_file(path):
            build_components(scenario, dry_run=True)
        typer.echo(f"{path}: ok ({scenario.name})")


# ---------------------------------------------------------------- scenarios
def _scenario_root() -> Path:
    return Path(__file__).resolve().parent.parent / "scenarios"


def _header_line(path: Path) -> str:
    for line in path.read_text(encoding="utf-8").splitlines():
        text = line.strip()
        if text.startswith("#"):
            text = text.lstrip("#").strip()
            if text:
                return text
        elif text:
            break
    return ""


@app.command()
def scenarios(directory: Optional[Path] = typer.Option(None, "--dir", help="Directory to list.")) -> None:
    """List the bundled scenarios with their one-line descriptions."""
    root = directory or _scenario_root()
    if not root.is_dir():
        _fail(f"{root}: no such directory")
    for path in sorted(root.rglob("*.yaml")):
        typer.echo(f"{path.relative_to(root)!s:48}  {_header_line(path)}")


# --------------------------------------------------------------------- show
@app.command()
@handles_errors
def show(result_dir: Path = typer.Argument(..., help="A result bundle directory.")) -> None:
    """Print a result bundle's summary again."""
    from sim.trace.bundle import load_result

    result = load_result(result_dir)
    print_summary(result.summary, title=str(result_dir))


# --------------------------------------------------------------------- plot
@app.command()
@handles_errors
def plot(
    result_dirs: List[Path] = typer.Argument(..., help="Result bundle directories."),
    svg: bool = typer.Option(False, "--svg", help="SVG instead of PNG."),
) -> None:
    """(Re)draw the plots of result bundles into <bundle>/plots/."""
    from sim.analysis.plots import plot_all
    from sim.trace.bundle import load_result

    for directory in result_dirs:
        result = load_result(directory)
        paths = plot_all(result, directory / "plots", fmt="svg" if svg else "png",
                         group_kinds=result.group_kinds or None)
        for p in paths:
            typer.echo(str(p))


# ------------------------------------------------------------------ compare
@app.command()
@handles_errors
def compare(
    result_dirs: List[Path] = typer.Argument(..., help="Result bundle directories (two or more)."),
    out: Optional[Path] = typer.Option(None, "-o", "--out", help="Directory for the overlay plots."),
) -> None:
    """One table and overlay plots across runs (e.g. one run per prefix policy)."""
    from rich.table import Table

    from sim.analysis.plots import compare_latency_cdfs, compare_outcomes
    from sim.analysis.report import compare_rows
    from sim.trace.bundle import load_result

    if len(result_dirs) < 2:
        _fail("compare needs at least two result directories")
    results = {}
    for directory in result_dirs:
        label = directory.name
        while label in results:
            label = f"{label}'"
        results[label] = load_result(directory)
    header, rows = compare_rows({k: v.summary for k, v in results.items()})
    table = Table(show_header=True)
    for name in header:
        table.add_column(name)
    for row in rows:
        table.add_row(*row)
    _console().print(table)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        typer.echo(str(compare_latency_cdfs(results, out / "latency_cdfs.png")))
        typer.echo(str(compare_outcomes(results, out / "outcomes.png")))


# -------------------------------------------------------------- trace diff
@trace_app.command("diff")
@handles_errors
def trace_diff(
    a: Path = typer.Argument(..., help="Result bundle or golden directory A."),
    b: Path = typer.Argument(..., help="Result bundle or golden directory B."),
    tables: str = typer.Option(",".join(DEFAULT_TABLES), "--tables", help="Comma-separated tables to compare."),
    context: int = typer.Option(3, "--context", help="Rows of context around the first difference."),
) -> None:
    """First differing KV event / admission with context; exit 1 when they differ."""
    from sim.trace.diff import diff_traces

    report = diff_traces(a, b, tables=tuple(t.strip() for t in tables.split(",") if t.strip()), context=context)
    typer.echo(report.format())
    if not report.identical:
        raise typer.Exit(EXIT_DIFF)


# ------------------------------------------------------------------- replay
@app.command()
@handles_errors
def replay(
    bundle: Path = typer.Argument(..., help="A replay bundle (directory with replay.yaml) written on a crash."),
    out: Optional[Path] = typer.Option(None, "-o", "--out", help="Output directory."),
) -> None:
    """Re-run a crash replay bundle and check that the same crash happens."""
    from sim.config import load_scenario
    from sim.api import RunOptions, run_scenario

    scenario_file = bundle / "replay.yaml" if bundle.is_dir() else bundle
    if not scenario_file.is_file():
        _fail(f"{bundle}: no replay.yaml (a replay bundle is written next to crash.json when a run crashes)")
    expected_file = scenario_file.parent / "crash.json"
    scenario = load_scenario(scenario_file)
    target = out or scenario_file.parent / "replayed"
    result = run_scenario(scenario, target, options=RunOptions(progress=False))
    crash = result.crash
    typer.echo(f"crash: {json.dumps(crash, sort_keys=True)}")
    if expected_file.is_file():
        expected = json.loads(expected_file.read_text(encoding="utf-8"))
        same = crash is not None and all(crash.get(k) == expected.get(k) for k in ("step", "request_id", "reason"))
        typer.echo("reproduced" if same else "NOT reproduced")
        if not same:
            raise typer.Exit(EXIT_DIFF)


# ---------------------------------------------------------- workload stats
@workload_app.command("stats")
@handles_errors
def workload_stats(
    source: Path = typer.Argument(..., help="A scenario YAML, or a trace file (Mooncake JSONL, ...)."),
    block_size: Optional[int] = typer.Option(
        None, "--block-size", help="Block size for the ideal hit rate (default: 512 for Mooncake traces, else 16)."
    ),
    trace_format: str = typer.Option("mooncake", "--format", help="Trace format when SOURCE is a trace."),
    limit: Optional[int] = typer.Option(None, "--limit", help="Read at most this many requests."),
) -> None:
    """Requests, rate, length distributions and the ideal (infinite-cache) prefix-hit rate."""
    import numpy as np

    from sim.workload.build import build_requests
    from sim.workload.spec import WorkloadSpec
    from sim.workload.stats import workload_stats as compute

    if source.suffix in (".yaml", ".yml"):
        from sim.config import load_scenario

        scenario = load_scenario(source)
        spec = scenario.workload
        base, seed, clock = Path.cwd(), scenario.seed, scenario.clock  # scenario paths are already absolute
    else:
        raw: dict[str, Any] = {"trace": {"format": trace_format, "path": str(source.resolve())}}
        if limit is not None:
            raw["limit"] = limit
        spec = WorkloadSpec.model_validate(raw)
        base, seed, clock = Path.cwd(), 0, "time"
    if block_size is None:
        block_size = 512 if spec.trace is not None and spec.trace.format == "mooncake" else 16
    requests = build_requests(spec, base_dir=base, rng=np.random.default_rng(seed), clock=clock)
    stats = compute(requests, block_size)
    typer.echo(json.dumps(stats, indent=2, sort_keys=True))


# -------------------------------------------------------------------- sweep
@app.command()
@handles_errors
def sweep(
    scenario: Path = typer.Argument(..., help="Base scenario YAML, or a sweep file (scenarios/sweeps/*.yaml)."),
    grid: List[str] = typer.Option([], "--grid", help="key.path=v1,v2,... (repeatable; Cartesian product)."),
    grid_file: Optional[Path] = typer.Option(None, "--grid-file", help="A grid file (YAML)."),
    seeds: Optional[str] = typer.Option(None, "--seeds", help="Number of seeds (N) or a list (1,2,3)."),
    executor: str = typer.Option("local", "--executor", help="local (process pool), serial or ray."),
    jobs: Optional[int] = typer.Option(None, "-j", "--jobs", help="Parallel runs (local executor)."),
    out: Path = typer.Option(..., "-o", "--out", help="Sweep output directory."),
    set_: List[str] = typer.Option([], "--set", help="Override a key in every run."),
) -> None:
    """Run a parameter grid (one bundle per point and seed) and write sweep.parquet + plots."""
    from sim.sweep import build_sweep, run_sweep

    spec = build_sweep(scenario, grids=list(grid), grid_file=grid_file, seeds=seeds, overrides=list(set_))
    result = run_sweep(spec, out, executor=executor, jobs=jobs, progress=_show_progress())
    typer.echo(result.describe())
    if result.failed:
        raise typer.Exit(EXIT_SWEEP_FAILURES)


# ------------------------------------------------------- golden, divergence
_GOLDEN_ONLY = typer.Option([], "--scenario", help="Only this golden scenario (repeatable); default: all.")
_SCENARIOS_DIR = typer.Option(Path("scenarios"), "--scenarios-dir", help="Directory of the golden scenarios.")
_GOLDEN_DIR = typer.Option(Path("results/golden"), "--golden-dir", help="Directory of the stored golden traces.")
_BATCH_EXECUTOR = typer.Option("serial", "--executor", help="serial, local (process pool) or ray.")
_BATCH_JOBS = typer.Option(None, "-j", "--jobs", help="Parallel runs (local executor).")


@golden_app.command("check")
@handles_errors
def golden_check(scenario: List[str] = _GOLDEN_ONLY, scenarios_dir: Path = _SCENARIOS_DIR,
                 golden_dir: Path = _GOLDEN_DIR, executor: str = _BATCH_EXECUTOR,
                 jobs: Optional[int] = _BATCH_JOBS) -> None:
    """Re-run the golden scenarios and compare; exit 1 if a trace differs, 2 if one is missing."""
    from sim.sweep import golden

    code = golden.check(scenario, scenario_root=scenarios_dir, golden_root=golden_dir, executor=executor, jobs=jobs)
    raise typer.Exit(code)


@golden_app.command("regenerate")
@handles_errors
def golden_regenerate(scenario: List[str] = _GOLDEN_ONLY, scenarios_dir: Path = _SCENARIOS_DIR,
                      golden_dir: Path = _GOLDEN_DIR, executor: str = _BATCH_EXECUTOR,
                      jobs: Optional[int] = _BATCH_JOBS) -> None:
    """Re-run the golden scenarios, print what changed, and overwrite the stored traces."""
    from sim.sweep import golden

    golden.regenerate(scenario, scenario_root=scenarios_dir, golden_root=golden_dir, executor=executor, jobs=jobs)


@app.command("divergence-table")
@handles_errors
def divergence_table(
    write: Optional[Path] = typer.Option(None, "--write", help="Write the markdown here instead of stdout."),
    repro_dir: Path = typer.Option(Path("scenarios/repro"), "--repro-dir", help="Directory of divergence-*.yaml."),
    executor: str = _BATCH_EXECUTOR,
    jobs: Optional[int] = _BATCH_JOBS,
) -> None:
    """Run every (direction, policy, connector) cell and render docs/divergence.md."""
    from sim.analysis.divergence_table import render
    from sim.sweep.divergence import divergence_matrix

    text = render(divergence_matrix(repro_dir, executor=executor, jobs=jobs))
    if write is None:
        sys.stdout.write(text)
    else:
        write.write_text(text, encoding="utf-8")


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
