"""``vllm_version``: which vLLM release a scenario mirrors, what it changes, and how bad values are refused."""

from __future__ import annotations

import json

import pytest

from sim.config import ScenarioError, resolved_yaml, scenario_from_text
from sim.config.vllm_versions import DEFAULT_BLOCK_SIZE, NEWEST, SUPPORTED
from sim.verify import vllm_side

BASE = """
name: v
cache: {num_blocks: 40, groups: [full_attention]}
workload:
  requests:
    - {id: r0, at: 0, prompt: [{content: doc, tokens: 40}], max_tokens: 2}
"""


def _load(extra: str = "", cache: str = "{num_blocks: 40, groups: [full_attention]}"):
    return scenario_from_text(BASE.replace("{num_blocks: 40, groups: [full_attention]}", cache) + extra, "v.yaml")


def test_the_default_is_the_newest_release_and_the_harness_drives_the_same_ones():
    assert NEWEST == SUPPORTED[-1] == "0.34"
    assert SUPPORTED == vllm_side.SUPPORTED_VERSIONS
    assert _load().vllm_version == "0.34"


@pytest.mark.parametrize("value", ['"0.33"', "0.33", '"0.34"', "0.34"])
def test_a_yaml_number_names_the_release_as_a_string(value):
    scenario = _load(f"vllm_version: {value}\n")
    assert scenario.vllm_version == value.strip('"')
    assert f"vllm_version: '{scenario.vllm_version}'" in resolved_yaml(scenario)


@pytest.mark.parametrize("value", ["0.35", '"0.32"', "1", "latest"])
def test_an_unknown_release_is_an_error_naming_the_key_and_the_valid_ones(value):
    with pytest.raises(ScenarioError) as err:
        _load(f"vllm_version: {value}\n")
    message = str(err.value)
    assert "vllm_version" in message and "0.33" in message and "0.34" in message


@pytest.mark.parametrize("release", SUPPORTED)
def test_a_null_block_size_is_vllms_default_of_the_release(release):
    scenario = _load(f'vllm_version: "{release}"\n', "{block_size: null, num_blocks: 40, groups: [full_attention]}")
    assert scenario.cache.block_size == DEFAULT_BLOCK_SIZE[release] == {"0.33": 16, "0.34": 64}[release]
    # hybridsim's own default stays 16 under both.
    assert _load(f'vllm_version: "{release}"\n').cache.block_size == 16


def test_the_release_is_in_the_summary(tmp_path):
    from sim.api import run_scenario

    result = run_scenario(_load('vllm_version: "0.33"\n'), tmp_path / "out")
    assert result.summary["vllm_version"] == "0.33"
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["vllm_version"] == "0.33"
    assert "vllm_version: '0.33'" in (tmp_path / "out" / "scenario.resolved.yaml").read_text()


KNOBS = {
    "cache_aware_admission_window": "8",
    "cache_aware_admission_threshold": "0.25",
    "max_num_inflight_kv_loads": "2",
}


@pytest.mark.parametrize("key", list(KNOBS))
def test_a_034_key_in_a_033_scenario_is_exit_2_naming_the_key_and_the_version(key, tmp_path):
    from typer.testing import CliRunner

    from sim.cli import app

    path = tmp_path / "old.yaml"
    path.write_text(BASE + f'vllm_version: "0.33"\nscheduler: {{{key}: {KNOBS[key]}}}\n')
    result = CliRunner().invoke(app, ["run", str(path), "-o", str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    assert f"scheduler.{key}" in result.output and "vLLM 0.34" in result.output and "0.33" in result.output
    assert not (tmp_path / "out").exists()


def test_the_034_keys_default_to_vllms_and_reach_the_scheduler_and_the_lowered_script():
    from sim.engine.build import build_components
    from sim.verify.lower import lower

    new = _load()
    assert (
        new.scheduler.cache_aware_admission_window,
        new.scheduler.cache_aware_admission_threshold,
        new.scheduler.max_num_inflight_kv_loads,
    ) == (0, 0.5, None)
    old = _load('vllm_version: "0.33"\n')
    assert old.scheduler.cache_aware_admission_window is None and old.scheduler.max_num_inflight_kv_loads is None
    turned = _load("scheduler: {" + ", ".join(f"{k}: {v}" for k, v in KNOBS.items()) + "}\n")
    config = build_components(turned).scheduler.config
    assert (
        config.cache_aware_admission_window,
        config.cache_aware_admission_threshold,
        config.max_num_inflight_kv_loads,
    ) == (8, 0.25, 2)
    script = lower(turned)
    assert [script[k] for k in KNOBS] == [8, 0.25, 2] and script["vllm_version"] == "0.34"  # type: ignore[literal-required]
    assert [lower(old)[k] for k in KNOBS] == [None, None, None]  # type: ignore[literal-required]


def test_a_resolved_034_scenario_runs_as_033_where_its_034_keys_are_at_their_defaults():
    """A resolved 0.34 scenario writes the new keys at their defaults (no reordering, no cap: what 0.33 does);
    ``--set vllm_version=0.33`` on it is accepted and clears them, while a key that changes decisions is refused."""
    resolved = resolved_yaml(_load())
    assert "cache_aware_admission_window: 0" in resolved
    old = scenario_from_text(resolved.replace("vllm_version: '0.34'", "vllm_version: '0.33'"), "r.yaml")
    assert (
        old.scheduler.cache_aware_admission_window,
        old.scheduler.cache_aware_admission_threshold,
        old.scheduler.max_num_inflight_kv_loads,
    ) == (None, None, None)
    turned = resolved.replace("cache_aware_admission_window: 0", "cache_aware_admission_window: 8")
    with pytest.raises(ScenarioError, match="scheduler.cache_aware_admission_window"):
        scenario_from_text(turned.replace("vllm_version: '0.34'", "vllm_version: '0.33'"), "r.yaml")
