"""hybridsim: vLLM v1 serving of hybrid Mamba + attention models under KV-cache pressure.

What a notebook needs is importable from here::

    import sim
    scenario = sim.load_scenario("scenarios/demo-pressure.yaml")
    result = sim.run(scenario, "results/demo")      # RunResult: .summary, .admissions, ...
    again = sim.load_result("results/demo")         # the bundle read back
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "load_scenario": ("sim.config", "load_scenario"),
    "Scenario": ("sim.config", "Scenario"),
    "ScenarioError": ("sim.config", "ScenarioError"),
    "run": ("sim.api", "run"),
    "run_scenario": ("sim.api", "run_scenario"),
    "RunResult": ("sim.results", "RunResult"),
    "RunOptions": ("sim.engine.run", "RunOptions"),
    "build_run": ("sim.engine.run", "build_run"),
    "finalize": ("sim.results", "finalize"),
    "write_bundle": ("sim.results", "write_bundle"),
    "load_result": ("sim.trace.bundle", "load_result"),
    "diff_traces": ("sim.trace.diff", "diff_traces"),
    "plot_all": ("sim.analysis.plots", "plot_all"),
}

__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name: str) -> Any:
    """Import public objects lazily, so ``import sim`` stays cheap."""
    try:
        module, attr = _EXPORTS[name]
    except KeyError:
        raise AttributeError(f"module 'sim' has no attribute {name!r}") from None
    import importlib

    return getattr(importlib.import_module(module), attr)
