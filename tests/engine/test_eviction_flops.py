"""A what-if eviction policy on a real model weighs entries by the step-time model's prefill FLOPs."""

from __future__ import annotations

from pathlib import Path

from sim.config import load_scenario
from sim.engine.build import build_components
from sim.engine.timing import StepTimeModel

DEMO = Path(__file__).resolve().parents[2] / "scenarios" / "demo-pressure.yaml"


def test_marconi_on_a_preset_model_builds_with_prefill_flops() -> None:
    # Regression: the eviction context asked the step-time model for a method the per-operation
    # rewrite had removed, so every non-lru policy on a model + hardware crashed at build time.
    scenario = load_scenario(DEMO, ["cache.eviction_policy=marconi", "outputs.plots=false"])
    components = build_components(scenario)
    assert components is not None
    model = components.step_time_model
    assert isinstance(model, StepTimeModel)
    one, two = model.prefill_flops(1024), model.prefill_flops(2048)
    # Linear terms double; causal attention pairs grow quadratically: strictly more than double,
    # and the linear part dominates at these lengths (well under 3x).
    assert 2.0 * one < two < 3.0 * one
    # No prompt token: only the LM head's one sampled row (hidden x vocab weights, 2 FLOPs each).
    preset = scenario.model.preset_obj
    assert model.prefill_flops(0) == 2.0 * preset.hidden_size * preset.vocab_size
