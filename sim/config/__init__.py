"""Scenario configuration: pydantic models, safe YAML loading with file:line errors, presets."""

from sim.config.load import load_scenario, resolved_yaml, scenario_from_text
from sim.config.presets import (
    HARDWARE_PRESETS,
    MODEL_PRESETS,
    HardwarePreset,
    ModelPreset,
    hardware_preset,
    kv_memory_budget,
    model_preset,
)
from sim.config.scenario import Scenario
from sim.config.yamlio import ScenarioError

__all__ = [
    "HARDWARE_PRESETS",
    "MODEL_PRESETS",
    "HardwarePreset",
    "ModelPreset",
    "Scenario",
    "ScenarioError",
    "hardware_preset",
    "kv_memory_budget",
    "load_scenario",
    "model_preset",
    "resolved_yaml",
    "scenario_from_text",
]
