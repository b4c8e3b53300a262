"""``hybridsim workload stats``: what a scenario's workload or a trace holds."""

# No ``from __future__ import annotations`` here: typer evaluates every command's parameter annotations, which
# strings would make a compile and an eval each (about 0.003 s of every command, docs/speed.md).

import json
from pathlib import Path
from typing import Any, Optional

import typer

from sim.cli.app import workload_app
from sim.cli.errors import handles_errors


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
    from sim.workload.stats import workload_stats as compute

    if source.suffix in (".yaml", ".yml"):
        from sim.config import load_scenario
        from sim.engine.build import scenario_workload

        # The run's own seeding path: stats describe exactly the requests a run of the scenario gets.
        scenario = load_scenario(source)
        kept, rejected = scenario_workload(scenario, read_at_most=limit)
        spec = scenario.workload
        requests = sorted(kept + rejected, key=lambda r: r.arrival_time)
    else:
        import numpy as np

        from sim.workload.build import build_requests
        from sim.workload.spec import WorkloadSpec

        raw: dict[str, Any] = {"trace": {"format": trace_format, "path": str(source.resolve())}}
        if limit is not None:
            raw["limit"] = limit
        spec = WorkloadSpec.model_validate(raw)
        requests = build_requests(spec, base_dir=Path.cwd(), rng=np.random.default_rng(0), read_at_most=limit)
        rejected = []
    if block_size is None:
        block_size = 512 if spec.trace is not None and spec.trace.format == "mooncake" else 16
    stats = compute(requests, block_size)
    if rejected:
        stats["rejected_too_long"] = len(rejected)
    typer.echo(json.dumps(stats, indent=2, sort_keys=True))
