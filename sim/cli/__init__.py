"""The ``hybridsim`` command line: one module per command group, registered on :mod:`sim.cli.app`.

Exit codes are :class:`sim.cli.exit_codes.ExitCode` (docs/cli.md lists them); errors are one line
(:mod:`sim.cli.errors`). Command modules import their dependencies inside each command, so that
``hybridsim --help`` imports no simulator stage.
"""

from __future__ import annotations

import sys

# isort: off
# Registration, in the order ``hybridsim --help`` lists the commands.
from sim.cli import run, bundles, verify, crash, batch, workload, timing  # noqa: F401

# isort: on
from sim.cli.app import app
from sim.cli.exit_codes import ExitCode

__all__ = ["ExitCode", "app", "main"]


def main() -> None:
    """Console-script entry point.

    What typer imports at its first use is imported with the collector off and frozen after, as the command
    line was (:func:`sim.startup.long_lived`: about 30 collections of a growing heap otherwise): for the help page,
    rich (the whole page, then the process ends without the interpreter's teardown, sim.startup.end_quickly);
    for every command, typer's pydantic adapters (typer converts arguments through pydantic, importing it at the
    first conversion)."""
    from sim.startup import end_quickly, long_lived

    if sys.argv[1:] in ([], ["--help"]):
        end_quickly()
        with long_lived():
            app()
        return
    with long_lived():
        try:
            import typer._adapters  # noqa: F401
        except ImportError:  # a typer that converts without pydantic
            pass
    app()
