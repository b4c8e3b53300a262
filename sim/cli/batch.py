"""Batches of runs: ``sweep``, ``golden check|regenerate`` and ``divergence-table``."""

# No ``from __future__ import annotations`` here: typer evaluates every command's parameter annotations, which
# strings would make a compile and an eval each (about 0.003 s of every command, docs/speed.md).

import sys
from pathlib import Path
from typing import List, Optional

import typer

from sim.cli.app import app, golden_app
from sim.cli.errors import handles_errors
from sim.cli.exit_codes import ExitCode
from sim.cli.output import force_option, show_progress, warn


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
    force: bool = force_option("sweep.json, sweep.parquet or plot"),
) -> None:
    """Run a parameter grid (one bundle per point and seed) and write sweep.parquet + plots."""
    from sim.sweep import build_sweep, run_sweep

    spec = build_sweep(scenario, grids=list(grid), grid_file=grid_file, seeds=seeds, overrides=list(set_))
    result = run_sweep(spec, out, executor=executor, jobs=jobs, progress=show_progress(), force=force)
    warn(result.notes)
    typer.echo(result.describe())
    if result.failed:
        raise typer.Exit(ExitCode.SWEEP_FAILURES)


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
    force: bool = force_option("golden folder's contents"),
) -> None:
    """Re-run the golden scenarios, print what changed, and replace the stored traces (each folder whole)."""
    from sim.sweep import golden

    notes = golden.regenerate(
        scenario, scenario_root=scenarios_dir, golden_root=golden_dir, executor=executor, jobs=jobs, force=force
    )
    warn(notes)


@app.command("divergence-table")
@handles_errors
def divergence_table(
    write: Optional[Path] = typer.Option(None, "--write", help="Write the markdown here instead of stdout."),
    repro_dir: Path = typer.Option(Path("scenarios/repro"), "--repro-dir", help="Directory of divergence-*.yaml."),
    executor: str = _BATCH_EXECUTOR,
    jobs: Optional[int] = _BATCH_JOBS,
    force: bool = force_option(),
) -> None:
    """Run every (direction, policy, connector) cell and render docs/divergence.md."""
    from sim.analysis.divergence_table import render
    from sim.sweep.divergence import divergence_matrix
    from sim.trace.output import check_output_file, write_file

    if write is not None:
        check_output_file(write, force=force, option="--write")
    text = render(divergence_matrix(repro_dir, executor=executor, jobs=jobs))
    if write is None:
        sys.stdout.write(text)
    else:
        notes: list[str] = []
        write_file(write, text, force=force, notes=notes, option="--write")
        warn(notes)
