"""The ``hybridsim`` command line: one module per command group, registered on :mod:`sim.cli.app`.

Exit codes are :class:`sim.cli.exit_codes.ExitCode` (docs/cli.md lists them); errors are one line
(:mod:`sim.cli.errors`). Command modules import their dependencies inside each command, so that
``hybridsim --help`` imports no simulator stage.
"""

from __future__ import annotations

# isort: off
# Registration, in the order ``hybridsim --help`` lists the commands.
from sim.cli import run, bundles, verify, crash, batch, workload, timing  # noqa: F401

# isort: on
from sim.cli.app import app
from sim.cli.exit_codes import ExitCode

__all__ = ["ExitCode", "app", "main"]


def main() -> None:
    """Console-script entry point."""
    app()
