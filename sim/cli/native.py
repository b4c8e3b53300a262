"""``hybridsim native build|status|clean``: the compiled core (docs/native.md)."""

from __future__ import annotations

import typer

from sim.cli.app import native_app
from sim.cli.errors import fail
from sim.cli.exit_codes import ExitCode


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
        fail(f"--opt-level: expected 0, 1, 2 or 3, got {opt_level!r}")
    if if_stale and native.decide(native.read_manifest(), env={}).compiled:
        typer.echo("the compiled build matches the sources")
        return
    try:
        done = build(opt_level=opt_level, echo=verbose)
    except NativeBuildError as exc:
        fail(str(exc), code=ExitCode.WRITE_FAILED)
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
