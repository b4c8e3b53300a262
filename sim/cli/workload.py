"""``hybridsim workload stats``: what a scenario's workload or a trace holds."""

from __future__ import annotations

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
