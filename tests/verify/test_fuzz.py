"""The fuzz generator: deterministic, loadable, verifiable, covering its dimensions (no vLLM needed)."""

from __future__ import annotations

from sim.config.load import scenario_from_text
from sim.verify.fuzz import LAYOUTS, generate, scenario_yaml
from sim.verify.lower import not_verifiable_reason


def test_deterministic_per_seed_and_index():
    assert scenario_yaml(generate(5, 3)) == scenario_yaml(generate(5, 3))
    assert scenario_yaml(generate(5, 3)) != scenario_yaml(generate(5, 4))
    assert scenario_yaml(generate(5, 3)) != scenario_yaml(generate(6, 3))


def test_scenarios_load_are_verifiable_and_cover_the_dimensions():
    layouts, policies, retention, modes, async_loads, evicts = set(), set(), set(), set(), set(), 0
    for i in range(80):
        data = generate(11, i)
        scenario = scenario_from_text(scenario_yaml(data), f"{data['name']}.yaml")
        assert not_verifiable_reason(scenario) is None
        layouts.add(tuple(g["type"] for g in data["cache"]["groups"]))
        policies.add(data["scheduler"]["prefix_policy"])
        retention.add(data["cache"]["retention_interval"] if data["cache"]["retention_interval"] in (0, None) else "N")
        conn = data["connector"]
        modes.add("matched_tokens" if "matched_tokens" in conn else "holds" if "holds" in conn else "none")
        async_loads.add(bool(conn.get("load_async")))
        evicts += len(data["actions"])
    assert layouts == set(LAYOUTS)
    assert policies == {"pr48425", "max_per_group"}
    assert retention == {0, None, "N"}
    assert modes == {"none", "matched_tokens", "holds"} and async_loads == {True, False}
    assert evicts > 0
