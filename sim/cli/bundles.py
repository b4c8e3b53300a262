"""Commands that read result bundles: ``show``, ``explain``, ``plot``, ``compare`` and ``trace diff``."""

# No ``from __future__ import annotations`` here: typer evaluates every command's parameter annotations, which
# strings would make a compile and an eval each (about 0.003 s of every command, docs/speed.md).

import os
import sys
from pathlib import Path
from typing import List, Mapping, Optional

import typer

from sim.cli.app import app, trace_app
from sim.cli.errors import fail, handles_errors
from sim.cli.exit_codes import ExitCode
from sim.cli.output import console, force_option, print_summary, terminal_text, warn

#: ``trace diff``'s default tables: :data:`sim.trace.diff.DEFAULT_TABLES`, spelled out here so that
#: ``hybridsim --help`` does not import pandas (a test holds the two equal).
DIFF_TABLES = "kv_events,admissions"


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
        typer.echo(terminal_text(f"warning: {result_dir}: unverified bundle ({check.problems[0]})"), err=True)
    elif result.partial:
        typer.echo(terminal_text(f"warning: {check.describe() if check else result_dir}"), err=True)
    print_summary(result.summary, title=f"{result_dir}  (PARTIAL)" if result.partial else str(result_dir))


# ------------------------------------------------------------------ explain
@app.command()
@handles_errors
def explain(
    bundle: Path = typer.Argument(..., help="A result bundle directory."),
    request: str = typer.Argument(..., help="A request id."),
    attempt: Optional[int] = typer.Option(None, "--attempt", help="Admission attempt (1-based; default the last)."),
    plot_path: Optional[Path] = typer.Option(None, "--plot", help="Also draw the block map to this PNG/SVG."),
    force: bool = force_option(),
) -> None:
    """The story of one admission: hits, cached blocks, policy, connector, fallback, outcome and why."""
    from sim.analysis.explain import render_block_map
    from sim.api import explain_bundle
    from sim.trace.output import check_output_file

    if plot_path is not None:
        check_output_file(plot_path, force=force, option="--plot")
    story = explain_bundle(bundle, request, attempt)
    typer.echo(terminal_text(story.text()), nl=False)
    if plot_path is not None:
        notes: list[str] = []
        typer.echo(str(render_block_map(story, plot_path, force=force, notes=notes)))
        warn(notes)


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
    force: bool = force_option("plot"),
) -> None:
    """Metrics as rows, runs as columns; Δ marks what differs from the first run (with the ratio to it)."""
    from sim.analysis.compare import FORMATS, table_rows, to_csv, to_json, to_markdown
    from sim.analysis.compare import compare as compare_runs

    if len(result_dirs) < 2:
        fail("compare needs at least two result directories")
    if len(labels) > len(result_dirs):
        fail(f"--label given {len(labels)} times for {len(result_dirs)} result directories")
    if fmt not in FORMATS:
        fail(f"--format: {fmt!r} is not one of {', '.join(FORMATS)}")
    from sim.trace.bundle import LoadedResult, load_result
    from sim.trace.output import check_output_file, open_output_dir

    if out is not None:  # refuse a link or a user's figure before any work
        if os.path.lexists(out) and (out.is_symlink() or not out.is_dir()):
            with open_output_dir(out):
                pass  # raises the one-line error
        for name in _COMPARE_FIGURES:
            check_output_file(out / name, force=force, option="-o/--out")

    results: dict[str, LoadedResult] = {}
    for i, directory in enumerate(result_dirs):
        results[_unique_label(labels[i] if i < len(labels) else directory.name, results)] = load_result(directory)
    summaries = {k: v.summary for k, v in results.items()}
    try:
        comparison = compare_runs(summaries, tolerance)
    except ValueError as e:
        fail(str(e))
    if fmt == "table":
        from rich.table import Table
        from rich.text import Text

        header, rows = table_rows(comparison)
        table = Table(show_header=True)
        for i, name in enumerate(header):
            table.add_column(Text(terminal_text(name)), justify="left" if i == 0 else "right", overflow="fold")
        for row in rows:
            table.add_row(*(Text(terminal_text(cell)) for cell in row))
        console().print(table)
        typer.echo(f"Δ: differs from the first run by more than {tolerance:.0%}; ×r is the ratio to it.")
    else:
        render = {"markdown": to_markdown, "csv": to_csv, "json": to_json}[fmt]
        sys.stdout.write(terminal_text(render(comparison)))
    if out is not None:
        from sim.analysis.plots import compare_latency_cdfs, compare_outcomes

        notes: list[str] = []
        with open_output_dir(out):  # a real folder, never a link; made if missing
            pass
        cdfs, outcomes = (out / name for name in _COMPARE_FIGURES)
        typer.echo(str(compare_latency_cdfs(results, cdfs, force=force, notes=notes)), err=fmt != "table")
        typer.echo(str(compare_outcomes(results, outcomes, force=force, notes=notes)), err=fmt != "table")
        warn(notes)


#: The files ``compare -o DIR`` writes into DIR.
_COMPARE_FIGURES = ("latency_cdfs.png", "outcomes.png")


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
    tables: str = typer.Option(DIFF_TABLES, "--tables", help="Comma-separated tables to compare."),
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
    typer.echo(terminal_text(report.format()))
    if not report.identical:
        raise typer.Exit(ExitCode.DIFF)
