"""Simulator throughput benchmark (``make bench``).

Runs two scenarios in-process, without writing a bundle, and prints for each:
simulated requests per wall second, engine steps per wall second, wall time
and peak resident memory (``ru_maxrss`` of this process, so cumulative: the
second line is the peak over both runs).

* ``demo-pressure``: synthetic multi-turn chat on Nemotron-H 8B under block
  pressure (240 blocks, 7 groups).
* ``mooncake-conversation-nemotron``: the Mooncake conversation trace replay
  (12,031 requests by default; ``--limit N`` replays the first ``N``). Skipped
  with a message when the shared traces directory is absent.

Wall time covers building the components and stepping the engine (scenario
loading and table assembly are included; plots and bundle writing are not).
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sim.config import load_scenario  # noqa: E402
from sim.api import RunOptions, run_scenario  # noqa: E402

DEMO = ROOT / "scenarios" / "demo-pressure.yaml"
MOONCAKE = ROOT / "scenarios" / "mooncake-conversation-nemotron.yaml"
TRACES = ROOT.parent / "shared" / "traces"


def _peak_rss_mb() -> float:
    """Peak resident set size of this process in MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def bench(name: str, path: Path, overrides: list[str]) -> dict:
    """Run one scenario; returns its throughput numbers."""
    scenario = load_scenario(path, [*overrides, "outputs.plots=false"])
    start = time.perf_counter()
    result = run_scenario(scenario, None, options=RunOptions(write_plots=False))
    wall = time.perf_counter() - start
    summary = result.summary
    requests = len(result.requests)
    steps = int(summary["steps"])
    return {
        "name": name,
        "status": summary["status"],
        "requests": requests,
        "steps": steps,
        "wall_s": wall,
        "req_per_s": requests / wall,
        "steps_per_s": steps / wall,
        "peak_rss_mb": _peak_rss_mb(),
    }


def _line(r: dict) -> str:
    return (
        f"{r['name']:<34} {r['status']:<9} {r['requests']:>7} req {r['steps']:>8} steps "
        f"{r['wall_s']:>8.2f} s  {r['req_per_s']:>9.1f} req/s  {r['steps_per_s']:>9.1f} steps/s  "
        f"peak {r['peak_rss_mb']:>7.1f} MiB"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--limit", type=int, default=None, help="Replay only the first N Mooncake requests.")
    parser.add_argument("--only", choices=("demo", "mooncake"), default=None, help="Run one benchmark only.")
    args = parser.parse_args(argv)
    if args.limit is not None and args.limit < 1:
        parser.error(f"--limit: expected an integer >= 1, got {args.limit}")

    if args.only in (None, "demo"):
        print(_line(bench("demo-pressure", DEMO, [])), flush=True)
    if args.only in (None, "mooncake"):
        if not (TRACES / "mooncake_conversation_trace.jsonl").is_file():
            print(f"mooncake-conversation-nemotron: skipped ({TRACES} has no mooncake_conversation_trace.jsonl)")
        else:
            overrides = [f"workload.limit={args.limit}"] if args.limit is not None else []
            label = "mooncake-conversation-nemotron" + (f" (limit {args.limit})" if args.limit else "")
            print(_line(bench(label, MOONCAKE, overrides)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
