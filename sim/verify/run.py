"""``hybridsim verify``: one scenario through hybridsim and through vLLM 0.33, compared decision by decision.

hybridsim runs in-process with ``on_crash: stop`` (vLLM's engine dies at a
crash, so both sides stop there) and the ``schedule`` table on; every other
key is the scenario's. The vLLM side is :mod:`sim.verify.vllm_side` on the
lowered script of :mod:`sim.verify.lower`.

Exit codes: 0 identical, 1 differ, 2 bad input (including vLLM not
installed), 3 not verifiable.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sim.config.scenario import Scenario
from sim.engine.build import build_components
from sim.engine.run import RunOptions, run_scenario
from sim.verify import vllm_side
from sim.verify.compare import Difference, first_difference
from sim.verify.decisions import decision_trace
from sim.verify.lower import lower, not_verifiable_reason
from sim.verify.vllm_side import DecisionTrace

EXIT_IDENTICAL = 0
EXIT_DIFFER = 1
EXIT_BAD_INPUT = 2
EXIT_NOT_VERIFIABLE = 3

INSTALL_HINT = "install the vLLM side with `make vllm-env` (see docs/verify.md)"


class VllmNotInstalled(ValueError):
    """vLLM cannot be imported; the message names the install command."""


@dataclass
class Verdict:
    """The outcome of verifying one scenario."""

    name: str
    exit_code: int
    reason: str = ""
    difference: Difference | None = None
    ours: DecisionTrace | None = None
    theirs: DecisionTrace | None = None

    @property
    def label(self) -> str:
        return {EXIT_IDENTICAL: "identical", EXIT_DIFFER: "differ", EXIT_NOT_VERIFIABLE: "not verifiable"}.get(
            self.exit_code, "bad input")


def require_vllm() -> None:
    """Import vLLM once (about 10 s); raise :class:`VllmNotInstalled` naming ``make vllm-env`` if it is missing."""
    try:
        vllm_side._load_vllm()
    except vllm_side.VllmMissing as exc:
        raise VllmNotInstalled(f"vLLM 0.33 is not installed or not importable ({exc}); {INSTALL_HINT}") from None


def hybridsim_trace(scenario: Scenario, max_steps: int) -> DecisionTrace:
    """hybridsim's decision trace of ``scenario`` (run with ``on_crash: stop`` and the schedule table)."""
    outputs = scenario.outputs.model_copy(update={"schedule_table": True, "plots": False})
    run = scenario.model_copy(update={"on_crash": "stop", "outputs": outputs})
    result = run_scenario(run, None, options=RunOptions(max_steps=max_steps, write_plots=False))
    return decision_trace(result.tables, result.summary)


def verify_scenario(scenario: Scenario) -> Verdict:
    """Verify one loaded scenario (vLLM must be importable: see :func:`require_vllm`)."""
    reason = not_verifiable_reason(scenario)
    if reason is not None:
        return Verdict(scenario.name, EXIT_NOT_VERIFIABLE, reason)
    components = build_components(scenario)
    script = lower(scenario, components)
    theirs = vllm_side.run_script(script)
    ours = hybridsim_trace(scenario, script["max_steps"])
    diff = first_difference(ours, theirs)
    return Verdict(scenario.name, EXIT_DIFFER if diff else EXIT_IDENTICAL, "", diff, ours, theirs)


def verify_file(path: str | Path) -> Verdict:
    from sim.config import load_scenario

    return verify_scenario(load_scenario(path))
