"""The ``hybridsim`` Typer application and its command groups; the command modules register on these.

Importing this module imports no command's dependencies: each command imports what it needs when it runs,
so ``hybridsim --help`` stays cheap.
"""

# No ``from __future__ import annotations`` here: typer evaluates every command's parameter annotations, which
# strings would make a compile and an eval each (about 0.003 s of every command, docs/speed.md).

import typer

from sim.cli.errors import set_debug

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="hybridsim: vLLM v1 serving of hybrid Mamba + attention models under KV-cache block pressure.",
)
trace_app = typer.Typer(no_args_is_help=True, help="Compare result traces.")
workload_app = typer.Typer(no_args_is_help=True, help="Inspect workloads.")
timing_app = typer.Typer(no_args_is_help=True, help="Hold the step-time model against GPU kernel profiles.")
golden_app = typer.Typer(
    no_args_is_help=True, help="Golden traces: re-run the golden scenarios and check or rewrite them."
)
export_app = typer.Typer(no_args_is_help=True, help="Export a scenario for other tools.")
app.add_typer(trace_app, name="trace")
app.add_typer(workload_app, name="workload")
app.add_typer(timing_app, name="timing")
app.add_typer(golden_app, name="golden")
app.add_typer(export_app, name="export")


@app.callback()
def _main(debug: bool = typer.Option(False, "--debug", help="Show full tracebacks on errors.")) -> None:
    set_debug(debug)
    import warnings

    # Scenario warnings (e.g. a pool that cannot hold a request) as one "warning: ..." line.
    warnings.formatwarning = lambda message, category, *rest: f"warning: {message}\n"
