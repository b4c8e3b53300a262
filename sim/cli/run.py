"""``hybridsim run``, ``validate`` and ``scenarios``: run scenarios into bundles, check them, list them."""

# No ``from __future__ import annotations`` here: typer evaluates every command's parameter annotations, which
# strings would make a compile and an eval each (about 0.003 s of every command, docs/speed.md).

from pathlib import Path
from typing import List, Optional

import typer

from sim.cli.app import app
from sim.cli.errors import fail, handles_errors, naming_file
from sim.cli.exit_codes import RUN_STATUS_EXIT
from sim.cli.output import prepare_out_dir, print_summary, run_targets, show_progress, terminal_text, warn


# --------------------------------------------------------------------- run
def peak_rss_mib() -> float:
    """The process's peak resident set size so far, in MiB (``getrusage``: KiB on Linux, bytes on macOS)."""
    import resource
    import sys

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1 << 20) if sys.platform == "darwin" else peak / 1024


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
    plain: bool = typer.Option(
        False, "--plain", hidden=True, help="The plain core, without the speed layer sim.accel (same tables, slower)."
    ),
    force: bool = typer.Option(
        False,
        "--force",
        help="Use an output folder holding files hybridsim did not "
        "write (its old contents are kept aside as <folder>.old).",
    ),
) -> None:
    """Run scenario(s) and write a result bundle for each (whole: a previous bundle is replaced in one step)."""
    from sim.startup import end_quickly, long_lived

    end_quickly()  # every bundle is written and closed when the command returns (sim.startup)

    overrides = list(set_)
    if seed is not None:
        overrides.append(f"seed={seed}")
    result_overrides = list(overrides)  # what changes the results (and the default folder name)
    if tables_format is not None:
        overrides.append(f"outputs.tables_format={tables_format}")
    if no_plots:
        overrides.append("outputs.plots=false")
    with long_lived():  # the run path's imports and the scenarios' validators (sim.startup)
        from sim.api import RunOptions, run_scenario
        from sim.config import load_scenario

        loaded = [load_scenario(path, overrides) for path in scenarios]
    targets = run_targets(scenarios, [s.name for s in loaded], out, result_overrides)
    if out is None and result_overrides:
        for scenario, target in zip(loaded, targets):
            typer.echo(
                f"note: --set/--seed given: writing {target} (not results/{scenario.name}; -o names it)", err=True
            )
    for target in targets:
        prepare_out_dir(target, force)
    worst = 0
    for path, scenario, target in zip(scenarios, loaded, targets):
        options = RunOptions(
            progress=show_progress() and not quiet,
            check_invariants=check_invariants or scenario.check_invariants,
            plot_format="svg" if svg else "png",
            fast_paths=False if plain else None,
            force=force,
        )
        with naming_file(path):
            result = run_scenario(scenario, target, options=options)
        warn(result.notes)  # what the writer kept aside instead of deleting
        if not quiet:
            print_summary(result.summary, title=f"{scenario.name}  →  {target}")
            typer.echo(f"peak memory: {peak_rss_mib():.0f} MiB resident (this process so far)")
        worst = max(worst, RUN_STATUS_EXIT[result.status])
    if worst:
        raise typer.Exit(worst)


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
    from sim.startup import end_quickly, long_lived

    end_quickly()  # it writes nothing but its lines (sim.startup)

    with long_lived():
        from sim.config import load_scenario
        from sim.engine.build import build_components
        from sim.sweep.grid import build_sweep, is_grid_file, plan_runs

    for path in scenarios:
        if is_grid_file(path):
            spec = build_sweep(path, overrides=list(set_))
            points = {tuple(o for o in run.overrides if not o.startswith("seed=")) for run in plan_runs(spec, 0)}
            for overrides in sorted(points):
                scenario = load_scenario(spec.scenario, list(overrides))
                with naming_file(spec.scenario):
                    build_components(scenario, dry_run=True)
            typer.echo(f"{path}: ok (sweep of {spec.scenario.name}: {len(points)} grid points)")
            continue
        with long_lived():  # the scenario's validators (sim.startup)
            scenario = load_scenario(path, list(set_))
        with naming_file(path):
            build_components(scenario, dry_run=True)
            if scenario.cluster is not None:
                from sim.cluster.run import check_cluster

                check_cluster(scenario)
        typer.echo(f"{path}: ok ({scenario.name})")


# ---------------------------------------------------------------- scenarios
def _scenario_root() -> Path:
    return Path(__file__).resolve().parents[2] / "scenarios"


def _header_line(path: Path) -> str:
    """The first comment line of a scenario file (read through :mod:`sim.inputfile`: only its first 64 KiB,
    and only if it is a regular file); what stands in its place otherwise."""
    from sim.inputfile import InputFileError, read_head

    try:
        head = read_head(path, "scenario", 64 * 1024)
    except InputFileError as exc:
        return f"({str(exc).rpartition(': ')[2]})"
    for line in head.decode("utf-8", errors="replace").splitlines():
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
        fail(f"{root}: no such directory")
    for path in sorted(root.rglob("*.yaml")):
        typer.echo(terminal_text(f"{path.relative_to(root)!s:48}  {_header_line(path)}", keep_newlines=False))
