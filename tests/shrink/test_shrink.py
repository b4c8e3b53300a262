"""``hybridsim shrink``: the output keeps the property, is smaller, loads back equal, and is deterministic."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import yaml
from support.registries import Valid
from typer.testing import CliRunner

from sim.cli import app
from sim.config import ScenarioError, load_scenario, scenario_from_text
from sim.config.scenario import Scenario
from sim.shrink import ShrinkError, shrink
from sim.shrink import driver as shrink_driver
from sim.shrink.output import header, scenario_yaml
from sim.shrink.probe import probe, under_policy, with_contrast
from sim.shrink.property import property_for

ROOT = Path(__file__).resolve().parents[2]
REPRO = ROOT / "scenarios" / "repro"
PATHOLOGIES = ROOT / "scenarios" / "pathologies"

# (scenario, overrides): bundled reproductions that show a crash, a corrupt or a recompute outcome.
CASES = [
    ("pr48425-mamba-deeper-ext16.yaml", ["scheduler.prefix_policy=max_per_group"]),  # crash num_new_tokens > 0
    ("pr48425-mamba-deeper-ext16.yaml", []),  # recompute
    ("taint-propagation.yaml", []),  # corrupt
    ("nixl-mamba-deeper-ext0.yaml", []),  # corrupt, remote connector
    ("divergence-fa-deeper.yaml", ["scheduler.prefix_policy=max_per_group"]),  # corrupt, FA deeper
]

# A time-clock replay on a model preset that crashes: r2 is shown a local hit of one 1040-token block and the
# scripted connector answers one more block, which reaches the end of its 3120-token prompt.
TIME_CRASH = """\
name: time-crash
clock: time
model: {preset: nemotron-h-8b}
hardware: {preset: h100-80g}
cache: {num_blocks: 60}
scheduler: {prefix_policy: max_per_group}
connector: {type: scripted, matched_tokens: {r2: 1040}}
workload:
  requests:
    - {id: r0, at: 0.0, prompt: [{content: doc, tokens: 2100}], max_tokens: 3}
    - {id: x0, at: 0.01, prompt: [{content: other, tokens: 900}], max_tokens: 5}
    - {id: r1, at: 0.5, prompt: [{content: doc, tokens: 3150}], max_tokens: 2}
    - {id: x1, at: 0.6, prompt: [{content: more, tokens: 500}], max_tokens: 4}
    - {id: r2, at: 1.0, prompt: [{content: doc, tokens: 3120}], max_tokens: 2}
    - {id: x2, at: 1.5, prompt: [{content: other, tokens: 1500}], max_tokens: 2}
"""


def _check_shrunk(original: Scenario, keep: str = "auto", contrast: str = "pr48425") -> tuple[str, Scenario]:
    """Shrink, then reload the written text and check the property on it from scratch (a contrast to the end)."""
    result = shrink(original, keep, contrast=contrast)
    prop = result.property
    text = header(result, "test") + scenario_yaml(result.scenario)
    reloaded = scenario_from_text(text)
    assert reloaded == result.scenario
    after = probe(reloaded)
    if prop.contrast_policy is not None:
        after = with_contrast(reloaded, after, prop.contrast_policy, None)
    assert prop.holds(after), (prop.describe(), text)
    assert f"Preserves ({prop.name})" in text
    assert result.after.prompt_tokens < result.before.prompt_tokens, text
    assert result.after.requests <= result.before.requests
    assert result.after.steps <= result.before.steps
    return text, reloaded


@pytest.mark.parametrize("name,overrides", CASES, ids=[f"{n}{'+' if o else ''}" for n, o in CASES])
def test_shrink_keeps_the_property_of_bundled_reproductions(name: str, overrides: list[str]) -> None:
    original = load_scenario(REPRO / name, overrides)
    _, small = _check_shrunk(original)
    assert len(small.workload.requests or []) < len(original.workload.requests or [])


# ------------------------------------------------------------------ the property keeps the cause

MAMBA_DEEPER = "mamba > full_attention"
NUM_NEW_TOKENS = "AssertionError: num_new_tokens > 0"


def _ext16_max_per_group() -> Scenario:
    return load_scenario(REPRO / "pr48425-mamba-deeper-ext16.yaml", ["scheduler.prefix_policy=max_per_group"])


def _noisy_46453() -> Scenario:
    """#46453's pattern (FA tail evicted, the Mamba state deeper, the connector +16, ``max_per_group``) among
    unrelated requests on other documents, a second connector answer, and extra actions."""
    data = _ext16_max_per_group().model_dump(mode="json")
    noise = [
        {"id": "n0", "at": 1, "prompt": [{"content": "other", "tokens": 40}], "max_tokens": 3},
        {"id": "n1", "at": 5, "prompt": [{"content": "other", "tokens": 70}], "max_tokens": 2},
        {"id": "n2", "at": 9, "prompt": [{"content": "noise", "tokens": 30}], "max_tokens": 4},
        {"id": "n3", "at": 14, "prompt": [{"content": "noise", "tokens": 50}], "max_tokens": 1},
        {"id": "n4", "at": 20, "prompt": [{"content": "other", "tokens": 20}], "max_tokens": 2},
    ]
    data["workload"]["requests"] = sorted(data["workload"]["requests"] + noise, key=lambda r: r["at"])
    data["connector"]["matched_tokens"]["n1"] = 16
    data["actions"] += [
        {"at": 7, "evict": {"prefix_of": "n1", "group": "full_attention", "blocks": [1]}},
        {"at": 15, "evict": {"prefix_of": "n3", "group": "mamba", "blocks": [0]}},
        {"at": 25, "reset_prefix_cache": True},
    ]
    data["name"] = "noisy-46453"
    return Scenario.model_validate(data)


def _crash_at(scenario: Scenario, policy: str | None = None):
    return probe(scenario if policy is None else under_policy(scenario, policy)).crash


def test_shrinking_46453_out_of_a_noisy_workload_keeps_its_cause() -> None:
    """The default keeps the cause: the shrunk scenario crashes under max_per_group with the Mamba hit deeper
    than full attention's, and runs clean under pr48425 (the fix), so an exported test blames the right code."""
    original = _noisy_46453()
    crash = _crash_at(original)
    assert crash is not None and crash.reason == NUM_NEW_TOKENS and crash.divergence == MAMBA_DEEPER
    assert _crash_at(original, "pr48425") is None
    text, small = _check_shrunk(original)
    assert "Preserves (contrast)" in text and "Under prefix_policy pr48425 it runs clean to the end" in text
    assert small.scheduler.prefix_policy == "max_per_group" and small.on_crash == "stop"
    crash = _crash_at(small)
    assert crash is not None and crash.reason == NUM_NEW_TOKENS and crash.divergence == MAMBA_DEEPER
    assert _crash_at(small, "pr48425") is None
    assert len(small.workload.requests or []) == 2 and len(small.actions) <= 1


def test_keep_crash_reason_keeps_only_the_reason_and_the_admission_shape() -> None:
    text, small = _check_shrunk(_ext16_max_per_group(), "crash-reason")
    crash = _crash_at(small)
    assert crash is not None and crash.reason == NUM_NEW_TOKENS
    assert crash.site == "first, local hit, external tokens, per-group hits diverged"
    assert "Preserves (crash-reason)" in text and "pr48425" not in text.split("name:")[0]


def test_keep_divergence_keeps_the_divergence_kind_of_the_crashing_admission() -> None:
    result = shrink(_ext16_max_per_group(), "divergence")
    assert result.property.name == "divergence" and result.contrast_run is None
    assert result.property.describe().endswith(f"per-group hits {MAMBA_DEEPER}")
    crash = _crash_at(result.scenario)
    assert crash is not None and crash.reason == NUM_NEW_TOKENS and crash.divergence == MAMBA_DEEPER


def test_keep_divergence_of_an_outcome_keeps_the_target_admissions_divergence() -> None:
    original = load_scenario(REPRO / "divergence-fa-deeper.yaml", ["scheduler.prefix_policy=max_per_group"])
    before = probe(original)
    prop = property_for("divergence", before)
    assert prop.name == "divergence" and "per-group hits full_attention > mamba" in prop.describe()
    _, small = _check_shrunk(original, "divergence")
    assert any(
        a.divergence == "full_attention > mamba" and a.signature.outcome == "corrupt" for a in probe(small).admissions
    )


def test_keep_outcome_keeps_the_worst_admission_signature() -> None:
    original = load_scenario(REPRO / "taint-propagation.yaml")
    text, small = _check_shrunk(original, "outcome")
    assert "Preserves (outcome): an admission with outcome 'corrupt'" in text
    assert probe(small).crash is None


def test_keep_contrast_against_a_named_policy() -> None:
    """``--contrast trim_to_min``: the shrunk crash also runs clean under that policy."""
    text, small = _check_shrunk(_ext16_max_per_group(), "contrast", contrast="trim_to_min")
    assert "under prefix_policy trim_to_min it runs clean (no crash)" in text
    assert _crash_at(small, "trim_to_min") is None
    crash = _crash_at(small)
    assert crash is not None and crash.divergence == MAMBA_DEEPER


def test_auto_without_a_contrast_keeps_the_divergence() -> None:
    """Under pr48425 the repro only recomputes: nothing to contrast with pr48425 itself, so auto keeps the
    recompute with its divergence kind."""
    result = shrink(load_scenario(REPRO / "pr48425-mamba-deeper-ext16.yaml"))
    assert result.property.name == "divergence" and MAMBA_DEEPER in result.property.describe()


def test_a_contrast_that_cannot_be_kept_is_an_error() -> None:
    with pytest.raises(ShrinkError, match="already runs under the contrast policy"):
        shrink(load_scenario(REPRO / "pr48425-mamba-deeper-ext16.yaml"), "contrast")
    with pytest.raises(
        ShrinkError, match=re.escape(f"--contrast 'nonsense': not a prefix policy; {Valid('scheduler.prefix_policy')}")
    ):
        shrink(_ext16_max_per_group(), "contrast", contrast="nonsense")
    # Under pr48425 the repro recomputes too: the recompute is no contrast.
    original = load_scenario(REPRO / "pr48425-mamba-deeper-ext16.yaml")
    with pytest.raises(ShrinkError, match="shows it too: nothing to contrast"):
        shrink(original, "contrast", contrast="reconciled")


def test_the_header_is_comment_lines_whatever_the_source_name() -> None:
    result = shrink(_ext16_max_per_group(), "divergence")
    hostile = "x\nname: injected\r\n\u2028\x85- [evil]\ty"
    text = header(result, hostile)
    assert all(line.startswith("# ") for line in text.splitlines())
    assert len(text.splitlines()) == len(text.split("\n")) - 1 == 4
    assert scenario_from_text(text + scenario_yaml(result.scenario)) == result.scenario
    assert "x\\nname: injected\\r\\n\\u2028\\x85- [evil]\\ty" in text


def test_the_capacity_warning_is_shown_once_and_never_caused_by_the_shrink() -> None:
    import warnings

    from sim.engine.build import CapacityWarning, build_components

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = shrink(_ext16_max_per_group(), "crash-reason")
    assert not [w for w in caught if issubclass(w.category, CapacityWarning)]
    with warnings.catch_warnings():
        warnings.simplefilter("error", CapacityWarning)
        build_components(result.scenario)  # the shrunk scenario fits: no warning of its own making
    # An input that warns itself: the warning once, not once per candidate.
    late_and_too_long = "  - {id: big, at: 50, prompt: [{content: other, tokens: 400}], max_tokens: 1}\n"
    text = scenario_yaml(result.scenario).replace("on_crash:", late_and_too_long + "on_crash:")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        shrink(scenario_from_text(text), "crash-reason")
    assert len([w for w in caught if issubclass(w.category, CapacityWarning)]) == 1


def test_shrink_is_deterministic() -> None:
    original = load_scenario(REPRO / "taint-propagation.yaml")
    first = shrink(original)
    second = shrink(load_scenario(REPRO / "taint-propagation.yaml"))
    assert scenario_yaml(first.scenario) == scenario_yaml(second.scenario)
    assert header(first, "x") == header(second, "x")


def test_a_time_clock_replay_becomes_a_step_script_with_explicit_groups() -> None:
    original = scenario_from_text(TIME_CRASH)
    text, small = _check_shrunk(original)
    assert small.clock == "steps" and small.model is None and small.hardware is None
    assert small.cache.groups is not None and small.workload.requests is not None
    assert "time-clock replay -> step-clock script" in text
    assert all(float(r.at).is_integer() for r in small.workload.requests)


def test_converting_a_replay_keeps_every_arrival_step_exactly() -> None:
    """The step script built from the arrivals replays the same admissions step for step."""
    from sim.shrink.convert import to_step_script

    original = scenario_from_text(TIME_CRASH)
    obs = probe(original)
    data = to_step_script(original.model_dump(mode="json"), obs.arrivals, obs.num_blocks)
    assert data is not None
    again = probe(Scenario.model_validate(data))
    assert [step for step, _ in again.arrivals] == [step for step, _ in obs.arrivals]
    assert again.admissions == obs.admissions and again.crash == obs.crash


def test_shrinking_a_scenario_with_nothing_to_keep_is_an_error() -> None:
    with pytest.raises(ShrinkError, match="every admission is ok"):
        shrink(load_scenario(PATHOLOGIES / "lcm-block-alignment.yaml"))
    with pytest.raises(ShrinkError, match="does not crash"):
        shrink(load_scenario(REPRO / "taint-propagation.yaml"), keep="crash-reason")


# ------------------------------------------------------------------ a crash found by a seeded random search


def _random_scenario(rng: np.random.Generator, index: int) -> dict:
    """A small random FA + Mamba step script: shared documents, random evictions, a scripted connector."""
    docs = ["a", "b", "c"]
    requests = []
    for i in range(int(rng.integers(4, 10))):
        requests.append(
            {
                "id": f"q{i}",
                "at": int(rng.integers(0, 30)),
                "prompt": [{"content": str(rng.choice(docs)), "tokens": int(rng.integers(8, 120))}],
                "max_tokens": int(rng.integers(1, 6)),
            }
        )
    actions = []
    for _ in range(int(rng.integers(0, 4))):
        victim = requests[int(rng.integers(0, len(requests)))]
        actions.append(
            {
                "at": int(rng.integers(1, 35)),
                "evict": {
                    "prefix_of": victim["id"],
                    "group": str(rng.choice(["full_attention", "mamba"])),
                    "blocks": sorted({int(b) for b in rng.integers(0, 6, size=2)}),
                },
            }
        )
    matched = {r["id"]: int(rng.integers(0, 48)) for r in requests if rng.random() < 0.5}
    return {
        "name": f"random-{index}",
        "clock": "steps",
        "cache": {
            "block_size": 16,
            "num_blocks": int(rng.integers(20, 60)),
            "groups": ["full_attention", "mamba"],
            "retention_interval": None,
        },
        "scheduler": {"max_num_seqs": 4, "max_num_batched_tokens": 256, "prefix_policy": "max_per_group"},
        "connector": {"type": "scripted", "matched_tokens": matched},
        "workload": {"requests": requests},
        "actions": actions,
        "on_crash": "stop",
    }


def test_shrink_a_crash_found_by_a_seeded_random_search() -> None:
    rng = np.random.default_rng(18)
    for index in range(200):
        scenario = Scenario.model_validate(_random_scenario(rng, index))
        try:
            obs = probe(scenario)
        except ScenarioError:  # an eviction beyond its request's prompt blocks
            continue
        if obs.crash is not None and obs.crash.site != "step" and len(obs.arrivals) >= 4:
            break
    else:
        pytest.fail("no crash in 200 random scenarios")
    _, small = _check_shrunk(scenario)
    assert len(small.workload.requests or []) < len(scenario.workload.requests or [])


def test_shrink_a_crash_found_by_hybridsim_fuzz() -> None:
    """Fuzz scenario (seed 1, index 80) crashes with num_computed_tokens <= request.num_tokens."""
    from sim.verify.fuzz import generate

    scenario = Scenario.model_validate(generate(1, 80))
    crash = probe(scenario).crash
    assert crash is not None and crash.reason == "AssertionError: num_computed_tokens <= request.num_tokens"
    _, small = _check_shrunk(scenario)
    assert len(small.workload.requests or []) < len(scenario.workload.requests or [])


# ------------------------------------------------------------------ command line


def _invoke(*args: object):
    return CliRunner().invoke(app, [str(a) for a in args])


def test_cli_shrinks_a_crash_bundle(tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    res = _invoke(
        "run",
        REPRO / "pr48425-mamba-deeper-ext16.yaml",
        "--set",
        "scheduler.prefix_policy=max_per_group",
        "--set",
        "on_crash=stop",
        "-o",
        bundle,
        "-q",
        "--no-plots",
    )
    assert res.exit_code == 3, res.output
    assert "hybridsim shrink" in (bundle / "crash.json").read_text()
    assert "hybridsim export vllm-test" in (bundle / "crash.json").read_text()
    out = tmp_path / "small.yaml"
    res = _invoke("shrink", bundle, "-o", out)
    assert res.exit_code == 0, res.output
    small = load_scenario(out)
    assert probe(small).crash.reason == "AssertionError: num_new_tokens > 0"
    assert out.read_text().startswith("# Shrunk by `hybridsim shrink`")
    res = _invoke("replay", bundle / "replay", "--shrink")
    assert res.exit_code == 0, res.output

    def body(path: Path) -> str:  # without the source line (first) and the ownership stamp (last)
        return path.read_text().split("\n", 1)[1].rsplit("# hybridsim-output", 1)[0]

    assert body(bundle / "replay" / "shrunk.yaml") == body(out)


def test_cli_bad_input_exits_2(tmp_path: Path) -> None:
    res = _invoke("shrink", PATHOLOGIES / "lcm-block-alignment.yaml", "-o", tmp_path / "x.yaml")
    assert res.exit_code == 2 and "every admission is ok" in res.output
    res = _invoke("shrink", tmp_path / "missing.yaml", "-o", tmp_path / "x.yaml")
    assert res.exit_code == 2
    res = _invoke("shrink", REPRO / "taint-propagation.yaml", "-o", tmp_path / "x.yaml", "--keep", "nonsense")
    assert res.exit_code == 2 and "valid: auto" in res.output


def test_ctrl_c_writes_the_best_scenario_so_far_and_exits_130(tmp_path: Path, monkeypatch) -> None:
    real_probe = shrink_driver.probe
    calls = {"n": 0}

    def interrupting_probe(scenario, max_steps=None):
        calls["n"] += 1
        if calls["n"] > 12:  # the original run, the conversions, then a few successful drops
            raise KeyboardInterrupt
        return real_probe(scenario, max_steps)

    monkeypatch.setattr(shrink_driver, "probe", interrupting_probe)
    out = tmp_path / "best.yaml"
    res = _invoke("shrink", REPRO / "taint-propagation.yaml", "-o", out)
    assert res.exit_code == 130, res.output
    text = out.read_text()
    assert "Interrupted" in text
    monkeypatch.setattr(shrink_driver, "probe", real_probe)
    prop = property_for("auto", probe(load_scenario(REPRO / "taint-propagation.yaml")))
    assert prop.holds(probe(load_scenario(out)))
    original = yaml.safe_load((REPRO / "taint-propagation.yaml").read_text())
    assert len(yaml.safe_load(text)["workload"]["requests"]) <= len(original["workload"]["requests"])


def test_first_difference_keeps_the_same_item_of_the_difference(monkeypatch) -> None:
    """The driver's first-difference plumbing, with a stand-in for vLLM that differs in ``admissions[].local``
    whenever a request is admitted with a local hit (so the shrink must keep one, and may drop the rest)."""
    from sim.verify.compare import Difference

    def fake_with_difference(scenario, obs):
        step = next((a.step for a in obs.admissions if a.signature.shape.local), None)
        obs.difference = None if step is None else Difference(step, "admissions[1].local", 16, 0)
        return obs

    monkeypatch.setattr(shrink_driver, "with_difference", fake_with_difference)
    original = load_scenario(REPRO / "taint-propagation.yaml")
    result = shrink(original, "first-difference")
    assert result.property.describe() == "hybridsim and vLLM 0.33 first differ in admissions[].local"
    after = fake_with_difference(result.scenario, probe(result.scenario))
    assert after.difference is not None
    assert result.after.requests == 2 < result.before.requests  # one to cache a prefix, one to hit it


def test_divergence_kind_ranks_group_types_by_hit() -> None:
    from sim.shrink.probe import divergence_kind

    assert divergence_kind([32, 64], ["full_attention", "mamba"]) == "mamba > full_attention"
    assert divergence_kind([16, 0], ["full_attention", "mamba"]) == "full_attention > mamba"
    assert divergence_kind([48, 48], ["full_attention", "mamba"]) == "none"
    assert divergence_kind([48, 32, 48], ["full_attention", "mamba", "sliding_window"]) == (
        "full_attention = sliding_window > mamba"
    )


def test_a_crash_outside_an_admission_has_no_divergence_to_describe() -> None:
    from sim.shrink.property import CrashReason

    prop = CrashReason("AssertionError: x", "step", "")
    assert prop.name == "divergence" and prop.describe() == "crash 'AssertionError: x' outside an admission"
