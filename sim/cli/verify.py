"""``hybridsim verify`` and ``fuzz``: hybridsim's decisions against the real vLLM scheduler (docs/verify.md)."""

# No ``from __future__ import annotations`` here: typer evaluates every command's parameter annotations, which
# strings would make a compile and an eval each (about 0.003 s of every command, docs/speed.md).

from pathlib import Path
from typing import TYPE_CHECKING, List, Optional

import typer

from sim.cli.app import app
from sim.cli.errors import handles_errors
from sim.cli.exit_codes import ExitCode
from sim.cli.output import force_option

if TYPE_CHECKING:
    from sim.verify.run import VerifyStatus


def _verify_exit(status: "VerifyStatus") -> ExitCode:
    """The exit code of a verification's verdict (``sim.verify.run.VerifyStatus``)."""
    from sim.verify.run import VerifyStatus

    return {
        VerifyStatus.IDENTICAL: ExitCode.OK,
        VerifyStatus.DIFFER: ExitCode.DIFF,
        VerifyStatus.BAD_INPUT: ExitCode.BAD_INPUT,
        VerifyStatus.NOT_VERIFIABLE: ExitCode.NOT_VERIFIABLE,
    }[status]


# ------------------------------------------------------------------- verify
@app.command()
@handles_errors
def verify(
    scenarios: List[Path] = typer.Argument(..., help="Step-clock scenario YAML files."),
    table: Optional[Path] = typer.Option(None, "--table", help="Side-by-side CSV (a directory for several scenarios)."),
    set_: List[str] = typer.Option([], "--set", help="Override a key of every scenario: key.path=value."),
    force: bool = force_option(),
) -> None:
    """Run each scenario through hybridsim and the installed vLLM (0.33 or 0.34, the scenario's vllm_version) and
    compare decisions (docs/verify.md).

    Exit 0 identical, 1 differ, 2 bad input (vLLM missing: `make vllm-env`; another release than the scenario's),
    7 not verifiable."""
    from sim.verify.run import verify_paths

    raise typer.Exit(_verify_exit(verify_paths(list(scenarios), table, typer.echo, list(set_), force=force)))


@app.command()
@handles_errors
def fuzz(
    seed: int = typer.Option(0, "--seed", help="Generator seed (scenario i of seed s is always the same)."),
    count: int = typer.Option(100, "--count", min=1, help="Number of scenarios."),
    use_vllm: bool = typer.Option(False, "--vllm", help="Verify each scenario against the installed vLLM."),
    e2e: bool = typer.Option(
        False,
        "--e2e",
        help="End to end: each scenario through run, show, rerun + trace diff, explain, replay, shrink, export and "
        "verify (vLLM's when installed); failures written to -o (docs/fuzz.md). Exit 1 if any check fails.",
    ),
    vllm_version: Optional[str] = typer.Option(
        None,
        "--vllm-version",
        help="The release the scenarios are for: 0.33 or 0.34 (default: the installed one with --vllm or --e2e, "
        "else 0.34).",
    ),
    out: Optional[Path] = typer.Option(
        None,
        "-o",
        "--out",
        help="Where to write scenarios (with --vllm: the differing ones); default results/fuzz-<seed>.",
    ),
    force: bool = force_option(),
) -> None:
    """Seeded random step-clock scenarios; with --vllm verify each (exit 1 if any differ)."""
    from sim.config.vllm_versions import SUPPORTED
    from sim.verify.run import fuzz_command

    if vllm_version is not None and vllm_version not in SUPPORTED:
        typer.echo(
            f"error: --vllm-version: {vllm_version!r} is not a release hybridsim mirrors (valid: {', '.join(SUPPORTED)})"
        )
        raise typer.Exit(ExitCode.BAD_INPUT)
    if e2e:
        from sim.e2e.driver import fuzz_e2e

        out_dir = out or Path("results") / f"fuzz-e2e-{seed}"
        figures = fuzz_e2e(seed, count, out_dir, typer.echo, vllm_version=vllm_version, force=force)
        raise typer.Exit(ExitCode.DIFF if figures.failed else ExitCode.OK)
    raise typer.Exit(_verify_exit(fuzz_command(seed, count, use_vllm, out, typer.echo, vllm_version, force=force)))
