"""The demo's plots against its simulation (docs/speed.md, "Plots against the simulation").

For each checkout given (default: this one), in its own subprocess: ``load_scenario`` + ``run_scenario`` of
``scenarios/demo-pressure.yaml`` without a bundle or plots, then ``plot_all`` on that fresh result (so its
pandas view is built inside), in one warm process; CPU time as ``getrusage`` user + system; the first round a
warm-up, then the best of ``--repeat`` for the simulation, the plots and each figure. ``--rounds`` runs the
checkouts alternately that many times, so that they share the sitting (on a shared machine only same-sitting
ratios compare).

    python benchmarks/plots_ratio.py [CHECKOUT ...] [--repeat 5] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

FIGURES = ("block_usage", "divergence", "eviction_raster", "latency_cdfs")


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def work(root: Path, repeat: int) -> dict[str, float]:
    """Best CPU seconds of the simulation, the plots and each figure in ``root``'s checkout."""
    sys.path.insert(0, str(root))
    import sim.analysis.plots as plots
    from sim.api import RunOptions, run_scenario
    from sim.config import load_scenario

    per_figure: dict[str, list[float]] = {name: [] for name in FIGURES}

    def timed(name: str, draw: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            start = _cpu()
            try:
                return draw(*args, **kwargs)
            finally:
                per_figure[name].append(_cpu() - start)

        return wrapper

    for name in FIGURES:
        setattr(plots, f"plot_{name}", timed(name, getattr(plots, f"plot_{name}")))
    simulation, drawing = [], []
    for round_ in range(repeat + 1):
        start = _cpu()
        scenario = load_scenario(str(root / "scenarios" / "demo-pressure.yaml"), ["outputs.plots=false"])
        result = run_scenario(scenario, None, options=RunOptions(write_plots=False))
        simulated = _cpu() - start
        with tempfile.TemporaryDirectory() as out:
            start = _cpu()
            plots.plot_all(result, out)
            drawn = _cpu() - start
        if round_ == 0:  # warm-up
            for times in per_figure.values():
                times.clear()
            continue
        simulation.append(simulated)
        drawing.append(drawn)
    best = {"simulation": min(simulation), "plots": min(drawing)}
    best.update({name: min(times) for name, times in per_figure.items() if times})
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkouts", nargs="*", type=Path, default=[Path(__file__).resolve().parent.parent])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        print(json.dumps(work(args.worker.resolve(), args.repeat)))
        return
    for _ in range(args.rounds):
        for checkout in args.checkouts:
            command = [sys.executable, __file__, "--worker", str(checkout), "--repeat", str(args.repeat)]
            best = json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout)
            figures = " ".join(f"{name} {1000 * best[name]:.0f}" for name in FIGURES if name in best)
            print(
                f"{checkout}: simulation {best['simulation']:.3f} s, plots {best['plots']:.3f} s, "
                f"{best['plots'] / best['simulation']:.2f}x (ms: {figures})"
            )


if __name__ == "__main__":
    main()
