"""Hold the step-time model against a profile: predicted vs profiled per step, MAPE per regime.

The model's prediction of a step is the sum of its terms that the profile
measured (``ProfiledStep.parts``' keys: no LM head, final norm or CPU time on
either side), so the comparison is like for like.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.engine.timing import StepTimeModel
from sim.timing.profiles import ProfiledStep

REGIMES = ("prefill", "decode", "mixed")


@dataclass(frozen=True)
class StepComparison:
    """One step: profiled and predicted seconds and the signed relative error of the prediction."""

    step: ProfiledStep
    predicted_s: float

    @property
    def profiled_s(self) -> float:
        return self.step.seconds

    @property
    def error(self) -> float:
        return self.predicted_s / self.profiled_s - 1.0


@dataclass(frozen=True)
class RegimeSummary:
    regime: str
    steps: int
    mape: float
    worst: float
    """Signed error of the step with the largest absolute error."""


def predict(model: StepTimeModel, step: ProfiledStep) -> float:
    """The model's seconds for ``step``, summed over the terms the profile measured."""
    terms = model.breakdown(step.batch)
    return sum(terms.get(name, 0.0) for name in step.parts)


def compare(model: StepTimeModel, steps: list[ProfiledStep]) -> list[StepComparison]:
    return [StepComparison(s, predict(model, s)) for s in steps]


def summarize(rows: list[StepComparison]) -> list[RegimeSummary]:
    """MAPE and worst signed error per regime present (in :data:`REGIMES` order), then ``all``."""
    out = []
    for regime in REGIMES + ("all",):
        sel = [r for r in rows if regime == "all" or r.step.regime == regime]
        if not sel:
            continue
        worst = max(sel, key=lambda r: abs(r.error))
        out.append(RegimeSummary(regime, len(sel), sum(abs(r.error) for r in sel) / len(sel), worst.error))
    return out


def format_table(rows: list[StepComparison], summary: list[RegimeSummary], *, steps: bool = True) -> str:
    """Plain-text report: one line per step (unless ``steps=False``), then the per-regime summary."""
    lines = []
    if steps:
        width = max([len(r.step.label) for r in rows] + [4])
        lines.append(f"{'step':<{width}}  {'regime':<7}  {'profiled ms':>11}  {'predicted ms':>12}  {'error':>7}")
        for r in rows:
            lines.append(
                f"{r.step.label:<{width}}  {r.step.regime:<7}  {r.profiled_s * 1e3:>11.3f}  "
                f"{r.predicted_s * 1e3:>12.3f}  {r.error * 100:>+6.1f}%"
            )
        lines.append("")
    lines.append(f"{'regime':<8}  {'steps':>5}  {'MAPE':>6}  {'worst':>7}")
    for s in summary:
        lines.append(f"{s.regime:<8}  {s.steps:>5}  {s.mape * 100:>5.1f}%  {s.worst * 100:>+6.1f}%")
    return "\n".join(lines)
