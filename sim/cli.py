"""The ``hybridsim`` command line (typer).

Exit codes (documented in docs/cli.md):

* 0 — success (``trace diff``: the traces are identical);
* 1 — ``trace diff`` found a difference; ``replay``: the crash was not reproduced; any command: the result
  bundle could not be written (disk full, I/O error; the previous bundle is untouched);
* 2 — bad input: a scenario, trace, override or path that cannot be used
  (one line on stderr naming the file, key or line; ``--debug`` shows the
  traceback);
* 3 — the run crashed and ``on_crash: stop`` stopped it (the bundle and
  ``crash.json`` are written);
* 4 — ``--check-invariants`` found a broken invariant (the run stopped; the
  bundle is written and marked partial);
* 5 — the run stalled (requests left that can never be scheduled);
* 6 — ``sweep``: some runs failed (each is recorded with its error in the sweep's table);
* 130 — interrupted (Ctrl-C or SIGTERM); the bundle is written whole and marked partial (or, when the
  signal came before the run started, nothing is written).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any, Callable, Iterator, List, Mapping, Optional

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
from sim.timing.cli import timing_app  # noqa: E402  (the `timing check|fit` sub-app)

app.add_typer(timing_app, name="timing")
golden_app = typer.Typer(
    no_args_is_help=True, help="Golden traces: re-run the golden scenarios and check or rewrite them."
)
app.add_typer(golden_app, name="golden")
native_app = typer.Typer(
    no_args_is_help=True, help="The compiled core (mypyc): build it, see whether this process runs it, remove it."
)
app.add_typer(native_app, name="native")

_state = {"debug": False}


@app.callback()
def _main(debug: bool = typer.Option(False, "--debug", help="Show full tracebacks on errors.")) -> None:
    _state["debug"] = debug
    import warnings

    # Scenario warnings (e.g. a pool that cannot hold a request) as one "warning: ..." line.
    warnings.formatwarning = lambda message, category, *rest: f"warning: {message}\n"


def _fail(message: str, code: int = EXIT_BAD_INPUT) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def _bad_input_types() -> tuple[type[BaseException], ...]:
    from sim.config import ScenarioError
    from sim.sweep.grid import SweepError
    from sim.trace.diff import TraceDiffError
    from sim.workload.errors import WorkloadError

    return (
        ScenarioError,
        WorkloadError,
        TraceDiffError,
        SweepError,
        FileNotFoundError,
        PermissionError,
        NotADirectoryError,
        IsADirectoryError,
        FileExistsError,
    )


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


def _prepare_out_dir(target: Path, force: bool = False) -> None:
    """Check ``-o`` before running, so an unusable output folder fails in a second, not after the run:
    not a link or a file, holding nothing hybridsim did not write (unless ``force``), parent writable."""
    from sim.config import ScenarioError
    from sim.trace.atomic import OutputFolderError, check_output_folder

    try:
        check_output_folder(Path(os.path.abspath(target)), force=force)
    except OutputFolderError as exc:
        raise ScenarioError(f"-o/--out {exc}") from None
    parent = Path(os.path.abspath(target)).parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ScenarioError(
            f"-o/--out {target}: cannot create the output directory ({exc.strerror}); give a writable directory path"
        ) from exc
    if not os.access(parent, os.W_OK):
        raise ScenarioError(f"-o/--out {target}: the output directory is not writable; give a writable directory path")


def _run_targets(scenarios: List[Path], names: List[str], out: Optional[Path]) -> List[Path]:
    """One output folder per scenario; names are path-safe (checked by the scenario model); two scenarios
    with the same name in one invocation are refused (they would overwrite each other)."""
    from sim.config import ScenarioError

    seen: dict[str, Path] = {}
    for path, name in zip(scenarios, names):
        if name in seen and (out is None or len(scenarios) > 1):
            raise ScenarioError(
                f"{path}: name: {name!r} is also the name of {seen[name]}; two runs in one "
                "invocation would write the same folder (rename one)"
            )
        seen[name] = path
    if out is None:
        return [Path("results") / name for name in names]
    if len(scenarios) > 1:
        return [out / name for name in names]
    return [out]


def handles_errors(fn: Callable) -> Callable:
    """Turn known bad-input errors into one line + exit 2 (``--debug``: traceback); a bundle that cannot be
    written (disk full) into one line + exit 1; SIGINT/SIGTERM into one line + exit 130."""
    from sim.interrupts import interrupts_raise
    from sim.trace.atomic import BundleWriteError

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            with interrupts_raise():
                return fn(*args, **kwargs)
        except typer.Exit:
            raise
        except KeyboardInterrupt as exc:
            _fail(f"{exc or 'interrupted'}; output folders hold whole bundles only (old or new)", EXIT_INTERRUPTED)
        except BundleWriteError as exc:
            if _state["debug"]:
                traceback.print_exc()
            _fail(exc.strerror or str(exc), 1)
        except RecursionError:
            if _state["debug"]:
                traceback.print_exc()
            _fail("input nested too deeply (see docs/limits.md)")
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
    """A rich console; piped output is not cut to 80 columns (rich's default without a terminal)."""
    from rich.console import Console

    return Console() if sys.stdout.isatty() else Console(width=200)


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
    check_invariants: bool = typer.Option(
        False, "--check-invariants", help="Verify cache invariants after every step."
    ),
    quiet: bool = typer.Option(False, "-q", "--quiet", help="No progress bar and no summary table."),
    plain: bool = typer.Option(False, "--plain", hidden=True, help="No simulator fast paths (same tables, slower)."),
    force: bool = typer.Option(
        False,
        "--force",
        help="Use an output folder holding files hybridsim did not "
        "write (its old contents are kept aside as <folder>.old).",
    ),
) -> None:
    """Run scenario(s) and write a result bundle for each (whole: a previous bundle is replaced in one step)."""
    from sim.api import RunOptions, run_scenario
    from sim.config import load_scenario

    overrides = list(set_)
    if seed is not None:
        overrides.append(f"seed={seed}")
    if tables_format is not None:
        overrides.append(f"outputs.tables_format={tables_format}")
    if no_plots:
        overrides.append("outputs.plots=false")
    loaded = [load_scenario(path, overrides) for path in scenarios]
    targets = _run_targets(scenarios, [s.name for s in loaded], out)
    for target in targets:
        _prepare_out_dir(target, force)
    worst = 0
    for path, scenario, target in zip(scenarios, loaded, targets):
        options = RunOptions(
            progress=_show_progress() and not quiet,
            check_invariants=check_invariants or scenario.check_invariants,
            plot_format="svg" if svg else "png",
            fast_paths=False if plain else None,
            force=force,
        )
        with _naming_file(path):
            result = run_scenario(scenario, target, options=options)
        for note in result.notes:
            typer.echo(f"note: {note}", err=True)
        if not quiet:
            print_summary(result.summary, title=f"{scenario.name}  →  {target}")
        worst = max(worst, result.exit_code)
    if worst:
        raise typer.Exit(worst)


def print_summary(summary: dict, title: str = "") -> None:
    """The end-of-run table: latency, hits, divergence, outcomes, evictions."""
    from rich.table import Table

    from sim.analysis.report import summary_rows

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
    """Check scenario files (keys, types, presets, workload) without running them.

    A sweep file (one with a top-level ``scenario:`` key) is checked as a sweep: its grid, and the base scenario
    at every grid point (seeds aside: a seed changes draws, not validity)."""
    from sim.config import load_scenario
    from sim.engine.build import build_components
    from sim.sweep.grid import build_sweep, is_grid_file, plan_runs

    for path in scenarios:
        if is_grid_file(path):
            spec = build_sweep(path, overrides=list(set_))
            points = {tuple(o for o in run.overrides if not o.startswith("seed=")) for run in plan_runs(spec, 0)}
            for overrides in sorted(points):
                scenario = load_scenario(spec.scenario, list(overrides))
                with _naming_file(spec.scenario):
                    build_components(scenario, dry_run=True)
            typer.echo(f"{path}: ok (sweep of {spec.scenario.name}: {len(points)} grid points)")
            continue
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
    """Print a result bundle's summary again (refused when the bundle does not match its manifest)."""
    from sim.trace.atomic import BundleError, check_bundle
    from sim.trace.bundle import load_result

    check = check_bundle(result_dir) if result_dir.is_dir() else None
    if check is not None and check.has_manifest and not check.ok:
        raise BundleError(check.describe())
    result = load_result(result_dir, verify=False)
    if check is not None and not check.has_manifest:
        typer.echo(f"warning: {result_dir}: unverified bundle ({check.problems[0]})", err=True)
    elif result.partial:
        typer.echo(f"warning: {check.describe() if check else result_dir}", err=True)
    print_summary(result.summary, title=f"{result_dir}  (PARTIAL)" if result.partial else str(result_dir))


# ------------------------------------------------------------------ explain
@app.command()
@handles_errors
def explain(
    bundle: Path = typer.Argument(..., help="A result bundle directory."),
    request: str = typer.Argument(..., help="A request id."),
    attempt: Optional[int] = typer.Option(None, "--attempt", help="Admission attempt (1-based; default the last)."),
    plot_path: Optional[Path] = typer.Option(None, "--plot", help="Also draw the block map to this PNG/SVG."),
) -> None:
    """The story of one admission: hits, cached blocks, policy, connector, fallback, outcome and why."""
    from sim.analysis.explain import explain_bundle, render_block_map

    story = explain_bundle(bundle, request, attempt)
    typer.echo(story.text(), nl=False)
    if plot_path is not None:
        typer.echo(str(render_block_map(story, plot_path)))


# --------------------------------------------------------------------- plot
@app.command()
@handles_errors
def plot(
    result_dirs: List[Path] = typer.Argument(..., help="Result bundle directories."),
    svg: bool = typer.Option(False, "--svg", help="SVG instead of PNG."),
) -> None:
    """(Re)draw the plots of result bundles into <bundle>/plots/."""
    for directory in result_dirs:
        for p in _redraw_plots(directory, svg):
            typer.echo(str(p))


def _redraw_plots(directory: Path, svg: bool) -> list[Path]:
    """Redraw one bundle's plots (the bundle is replaced whole; links in plots/ are never followed); their paths."""
    from sim.analysis.plots import plot_all
    from sim.trace.atomic import rewrite_bundle
    from sim.trace.bundle import load_result

    result = load_result(directory, verify=False)
    drawn: list[Path] = []

    def draw(stage: Path) -> None:
        paths = plot_all(result, stage / "plots", fmt="svg" if svg else "png", group_kinds=result.group_kinds or None)
        drawn.extend(directory / p.relative_to(stage) for p in paths)

    # The other format's figures stay (`plot --svg` adds SVGs beside the PNGs); the index is redrawn.
    other = ".png" if svg else ".svg"
    rewrite_bundle(directory, draw, keep=lambda rel: rel.endswith(other))
    return drawn


# ------------------------------------------------------------------ compare
@app.command()
@handles_errors
def compare(
    result_dirs: List[Path] = typer.Argument(..., help="Result bundle directories (two or more)."),
    out: Optional[Path] = typer.Option(None, "-o", "--out", help="Directory for the overlay plots."),
    labels: List[str] = typer.Option(
        [], "--label", help="A run's label (repeatable, in order; default the folder name)."
    ),
    fmt: str = typer.Option("table", "--format", help="table | markdown (for an issue) | csv | json."),
    tolerance: float = typer.Option(
        0.02, "--tolerance", help="Relative difference from the first run under which a metric counts as equal."
    ),
) -> None:
    """Metrics as rows, runs as columns; Δ marks what differs from the first run (with the ratio to it)."""
    from sim.analysis.compare import FORMATS, table_rows, to_csv, to_json, to_markdown
    from sim.analysis.compare import compare as compare_runs

    if len(result_dirs) < 2:
        _fail("compare needs at least two result directories")
    if len(labels) > len(result_dirs):
        _fail(f"--label given {len(labels)} times for {len(result_dirs)} result directories")
    if fmt not in FORMATS:
        _fail(f"--format: {fmt!r} is not one of {', '.join(FORMATS)}")
    from sim.trace.bundle import LoadedResult, load_result

    results: dict[str, LoadedResult] = {}
    for i, directory in enumerate(result_dirs):
        results[_unique_label(labels[i] if i < len(labels) else directory.name, results)] = load_result(directory)
    summaries = {k: v.summary for k, v in results.items()}
    try:
        comparison = compare_runs(summaries, tolerance)
    except ValueError as e:
        _fail(str(e))
    if fmt == "table":
        from rich.table import Table
        from rich.text import Text

        header, rows = table_rows(comparison)
        table = Table(show_header=True)
        for i, name in enumerate(header):
            table.add_column(Text(name), justify="left" if i == 0 else "right", overflow="fold")
        for row in rows:
            table.add_row(*(Text(cell) for cell in row))
        _console().print(table)
        typer.echo(f"Δ: differs from the first run by more than {tolerance:.0%}; ×r is the ratio to it.")
    else:
        render = {"markdown": to_markdown, "csv": to_csv, "json": to_json}[fmt]
        sys.stdout.write(render(comparison))
    if out is not None:
        from sim.analysis.plots import compare_latency_cdfs, compare_outcomes

        out.mkdir(parents=True, exist_ok=True)
        for name in ("latency_cdfs.png", "outcomes.png"):
            if out.is_symlink() or (out / name).is_symlink():
                _fail(f"-o/--out {out}: {name} or the folder is a symbolic link; links are never followed")
        typer.echo(str(compare_latency_cdfs(results, out / "latency_cdfs.png")), err=fmt != "table")
        typer.echo(str(compare_outcomes(results, out / "outcomes.png")), err=fmt != "table")


def _unique_label(label: str, taken: Mapping[str, object]) -> str:
    """``label``, primed until no earlier run has it (two folders with one name)."""
    while label in taken:
        label = f"{label}'"
    return label


# -------------------------------------------------------------- trace diff
@trace_app.command("diff")
@handles_errors
def trace_diff(
    a: Path = typer.Argument(..., help="Result bundle or golden directory A."),
    b: Path = typer.Argument(..., help="Result bundle or golden directory B."),
    tables: str = typer.Option(",".join(DEFAULT_TABLES), "--tables", help="Comma-separated tables to compare."),
    context: int = typer.Option(3, "--context", help="Rows of context around the first difference."),
    allow_partial: bool = typer.Option(
        False,
        "--allow-partial",
        help="Compare partial or unverified bundles (an inconsistent bundle is always refused).",
    ),
) -> None:
    """First differing KV event / admission with context; exit 1 when they differ."""
    from sim.trace.diff import diff_traces

    report = diff_traces(
        a,
        b,
        tables=tuple(t.strip() for t in tables.split(",") if t.strip()),
        context=context,
        allow_partial=allow_partial,
    )
    typer.echo(report.format())
    if not report.identical:
        raise typer.Exit(EXIT_DIFF)


# ------------------------------------------------------------------- verify
@app.command()
@handles_errors
def verify(
    scenarios: List[Path] = typer.Argument(..., help="Step-clock scenario YAML files."),
    table: Optional[Path] = typer.Option(None, "--table", help="Side-by-side CSV (a directory for several scenarios)."),
) -> None:
    """Run each scenario through hybridsim and vLLM 0.33 and compare decisions (docs/verify.md).

    Exit 0 identical, 1 differ, 2 bad input (vLLM missing: `make vllm-env`), 3 not verifiable."""
    from sim.verify.run import verify_paths

    raise typer.Exit(verify_paths(list(scenarios), table, typer.echo))


@app.command()
@handles_errors
def fuzz(
    seed: int = typer.Option(0, "--seed", help="Generator seed (scenario i of seed s is always the same)."),
    count: int = typer.Option(100, "--count", min=1, help="Number of scenarios."),
    use_vllm: bool = typer.Option(False, "--vllm", help="Verify each scenario against vLLM 0.33."),
    out: Optional[Path] = typer.Option(
        None, "-o", "--out", help="Where to write scenarios (with --vllm: the differing ones)."
    ),
) -> None:
    """Seeded random step-clock scenarios; with --vllm verify each (exit 1 if any differ)."""
    from sim.verify.run import fuzz_command

    raise typer.Exit(fuzz_command(seed, count, use_vllm, out, typer.echo))


# ------------------------------------------------------------------- replay
@app.command()
@handles_errors
def replay(
    bundle: Path = typer.Argument(..., help="A replay bundle (directory with replay.yaml) written on a crash."),
    out: Optional[Path] = typer.Option(None, "-o", "--out", help="Output directory."),
    shrink: bool = typer.Option(
        False, "--shrink", help="Then shrink it (keeping the crash) into <bundle>/shrunk.yaml."
    ),
) -> None:
    """Re-run a crash replay bundle and check that the same crash happens (exit 1 when it does not)."""
    from sim.api import RunOptions, run_scenario
    from sim.config import load_scenario

    scenario_file = bundle / "replay.yaml" if bundle.is_dir() else bundle
    if not scenario_file.is_file():
        _fail(f"{bundle}: no replay.yaml (a replay bundle is written next to crash.json when a run crashes)")
    expected_file = scenario_file.parent / "crash.json"
    expected = _read_crash_json(expected_file)
    _check_enclosing_bundle(scenario_file.parent)
    scenario = load_scenario(scenario_file)
    target = out or scenario_file.parent / "replayed"
    _prepare_out_dir(target)
    result = run_scenario(scenario, target, options=RunOptions(progress=False))
    crash = result.crash
    typer.echo(f"crash: {json.dumps(crash, sort_keys=True)}")
    same = crash is not None and all(crash.get(k) == expected.get(k) for k in ("step", "request_id", "reason"))
    typer.echo("reproduced" if same else "NOT reproduced")
    if not same:
        raise typer.Exit(EXIT_DIFF)
    if shrink:
        shrink_cmd(
            source=scenario_file,
            out=scenario_file.parent / "shrunk.yaml",
            keep="auto",
            contrast="pr48425",
            set_=[],
            quiet=False,
        )


def _read_crash_json(path: Path) -> dict:
    """The expected crash of a replay bundle: a JSON object with step, request_id and reason."""
    from sim.config import ScenarioError

    if path.is_symlink() or not path.is_file():
        raise ScenarioError(f"{path}: crash.json is missing; a replay bundle holds replay.yaml and crash.json")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise ScenarioError(f"{path}: crash.json is not valid JSON ({type(exc).__name__})") from None
    missing = [k for k in ("step", "request_id", "reason") if not isinstance(data, dict) or k not in data]
    if not isinstance(data, dict) or missing:
        got = type(data).__name__ if not isinstance(data, dict) else f"missing {', '.join(missing)}"
        raise ScenarioError(f"{path}: crash.json must be a JSON object with step, request_id and reason ({got})")
    return data


def _check_enclosing_bundle(replay_dir: Path) -> None:
    """A replay folder inside a run bundle (``RUN/replay``) must belong to a whole bundle that matches its
    manifest: a stale or tampered copy is refused rather than 'reproduced'."""
    from sim.trace.atomic import BundleError, check_bundle

    parent = replay_dir.resolve().parent
    if replay_dir.name == "replay" and (parent / "summary.json").is_file():
        check = check_bundle(parent)
        if not check.ok:
            raise BundleError(check.describe())


# ------------------------------------------------------------------- shrink
@app.command("shrink")
@handles_errors
def shrink_cmd(
    source: Path = typer.Argument(..., help="A scenario YAML, or a result/replay bundle (its replay.yaml is used)."),
    out: Path = typer.Option(..., "-o", "--out", help="The shrunk scenario YAML to write."),
    keep: str = typer.Option(
        "auto",
        "--keep",
        help="Property to keep: auto (contrast if the policy causes it, else divergence), crash-reason, outcome, "
        "divergence, contrast or first-difference (needs vLLM).",
    ),
    contrast: str = typer.Option(
        "pr48425", "--contrast", help="The prefix policy under which a contrast must run clean."
    ),
    set_: List[str] = typer.Option([], "--set", help="Override a key of the input first: key.path=value."),
    quiet: bool = typer.Option(False, "-q", "--quiet", help="No progress bar."),
) -> None:
    """Delta-debug a scenario down to a small one that keeps its crash or outcome and its cause (docs/shrink.md)."""
    from sim.shrink.command import run_shrink

    result = run_shrink(source, out, keep, set_, progress=_show_progress() and not quiet, contrast=contrast)
    typer.echo(f"{out}: {result.property.describe()}")
    typer.echo(f"  {result.before.line(result.after)}; {result.candidates} candidate runs, {result.wall_s:.1f}s")
    if result.interrupted:
        typer.echo(f"interrupted: wrote the smallest scenario found so far to {out}", err=True)
        raise typer.Exit(EXIT_INTERRUPTED)


# ------------------------------------------------------------------- export
export_app = typer.Typer(no_args_is_help=True, help="Export a scenario for other tools.")
app.add_typer(export_app, name="export")


@export_app.command("vllm-test")
@handles_errors
def export_vllm_test_cmd(
    scenario: Path = typer.Argument(..., help="A step-clock scenario YAML (e.g. the output of hybridsim shrink)."),
    out: Path = typer.Option(..., "-o", "--out", help="The pytest module to write (test_*.py)."),
) -> None:
    """Write a self-contained pytest that replays SCENARIO in vLLM 0.33 and asserts what hybridsim observed."""
    from sim.config import load_scenario
    from sim.export.vllm_test import export_vllm_test, write_module

    write_module(out, export_vllm_test(load_scenario(scenario), str(scenario)))
    typer.echo(f"{out}: run it with: VLLM_TARGET_DEVICE=cpu python -m pytest {out}")


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
    requests = build_requests(spec, base_dir=base, rng=np.random.default_rng(seed), clock=clock, read_at_most=limit)
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
def golden_check(
    scenario: List[str] = _GOLDEN_ONLY,
    scenarios_dir: Path = _SCENARIOS_DIR,
    golden_dir: Path = _GOLDEN_DIR,
    executor: str = _BATCH_EXECUTOR,
    jobs: Optional[int] = _BATCH_JOBS,
) -> None:
    """Re-run the golden scenarios and compare; exit 1 if a trace differs, 2 if one is missing."""
    from sim.sweep import golden

    code = golden.check(scenario, scenario_root=scenarios_dir, golden_root=golden_dir, executor=executor, jobs=jobs)
    raise typer.Exit(code)


@golden_app.command("regenerate")
@handles_errors
def golden_regenerate(
    scenario: List[str] = _GOLDEN_ONLY,
    scenarios_dir: Path = _SCENARIOS_DIR,
    golden_dir: Path = _GOLDEN_DIR,
    executor: str = _BATCH_EXECUTOR,
    jobs: Optional[int] = _BATCH_JOBS,
) -> None:
    """Re-run the golden scenarios, print what changed, and overwrite the stored traces."""
    from sim.sweep import golden

    golden.regenerate(scenario, scenario_root=scenarios_dir, golden_root=golden_dir, executor=executor, jobs=jobs)


@native_app.command("build")
def native_build(
    opt_level: str = typer.Option("3", "--opt-level", help="C optimisation level for the compiler (0-3)."),
    verbose: bool = typer.Option(False, "--verbose", help="Show mypyc's and the compiler's output."),
    if_stale: bool = typer.Option(False, "--if-stale", help="Do nothing if the compiled build matches the sources."),
) -> None:
    """Compile the core with mypyc (about a minute); until it finishes every run is interpreted."""
    from sim import native
    from sim.native.build import NativeBuildError, build

    if opt_level not in ("0", "1", "2", "3"):
        _fail(f"--opt-level: expected 0, 1, 2 or 3, got {opt_level!r}")
    if if_stale and native.decide(native.read_manifest(), env={}).compiled:
        typer.echo("the compiled build matches the sources")
        return
    try:
        done = build(opt_level=opt_level, echo=verbose)
    except NativeBuildError as exc:
        _fail(str(exc), code=1)
    typer.echo(f"compiled {done.modules} modules in {done.seconds} s (mypyc {done.mypyc})")


@native_app.command("status")
def native_status() -> None:
    """Say whether runs in this environment use the compiled core, and why."""
    from sim import native

    typer.echo(native.status().reason)


@native_app.command("clean")
def native_clean() -> None:
    """Remove the compiled core (its extensions and manifest); runs are interpreted again."""
    from sim.native.build import clean

    for path in clean():
        typer.echo(f"removed {path}")


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
