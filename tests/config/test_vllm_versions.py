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
