"""The crash replay's cut (sim.results.replay_cut) and a crash bundle that survives a failed derivation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from support.cli import invoke

from sim.api import RunOptions, run_scenario
from sim.config import load_scenario
from sim.config.scenario import Scenario
from sim.results import write as write_module
from sim.results.replay_cut import replay_scenario
from sim.trace.atomic import check_bundle

# FA + Mamba, max_per_group: r1 crashes at step 2 (the scripted connector claims 48 tokens beyond its local hit
# of 32 on a 48-token prompt). `late` and `later` arrive after the crash but are named in the connector's maps;
# `later` quotes `late`'s answer and an action after the crash evicts its blocks; an action *before* the crash
# evicts blocks of `evicted`, which arrives after it (an action's hashes come from the prompt, arrived or not).
CRASH_NAMING_LATER_REQUESTS = """\
name: names-later-requests
clock: steps
cache: {block_size: 16, num_blocks: 40, groups: [full_attention, mamba], retention_interval: 0}
scheduler: {prefix_policy: max_per_group}
connector:
  type: scripted
  supports_divergent_local_hybrid_hits: true
  matched_tokens: {r1: 48, late: 16}
  holds: {later: 32}
  load_async: {late: true, r0: true}
workload:
  requests:
    - {id: r0, at: 0, prompt: [{content: doc, tokens: 64}], max_tokens: 3}
    - {id: r1, at: 2, prompt: [{content: doc, tokens: 48}], max_tokens: 2}
    - {id: late, at: 9, prompt: [{content: doc, tokens: 80}], max_tokens: 2}
    - {id: later, at: 12, prompt: [{content: doc, tokens: 64}, {output_of: late, tokens: 1}], max_tokens: 2}
    - {id: evicted, at: 20, prompt: [{content: doc, tokens: 64}], max_tokens: 1}
actions:
  - {at: 1, evict: {prefix_of: evicted, group: mamba, blocks: [1]}}
  - {at: 15, evict: {prefix_of: later, group: full_attention, blocks: [0]}}
"""


def _scenario(text: str) -> Scenario:
    return Scenario.model_validate(yaml.safe_load(text))


def _crash_key(crash: dict | None) -> tuple | None:
    return None if crash is None else (crash["step"], crash["request_id"], crash["reason"])


def test_a_crash_whose_maps_name_later_requests_keeps_its_whole_bundle_and_replay_reproduces_it(
    tmp_path: Path,
) -> None:
    source = tmp_path / "crash.yaml"
    source.write_text(CRASH_NAMING_LATER_REQUESTS)
    out = tmp_path / "run"
    res = invoke("run", source, "-o", out, "--no-plots", "-q")
    assert res.exit_code == 3, res.output
    assert check_bundle(out).ok
    crash = json.loads((out / "crash.json").read_text())
    assert (crash["step"], crash["request_id"]) == (2, "r1") and "replay_note" not in crash

    replay = yaml.safe_load((out / "replay" / "replay.yaml").read_text())
    assert [r["id"] for r in replay["workload"]["requests"]] == ["r0", "r1", "evicted"]
    assert replay["connector"]["matched_tokens"] == {"r1": 48}
    assert replay["connector"]["holds"] == {} and replay["connector"]["load_async"] == {"r0": True}
    assert [a["at"] for a in replay["actions"]] == [1]

    replayed = invoke("replay", out / "replay", "-o", tmp_path / "replayed")
    assert replayed.exit_code == 0, replayed.output
    assert "reproduced" in replayed.stdout and "NOT" not in replayed.stdout


def test_the_replay_decides_what_the_run_decided_up_to_the_crash(tmp_path: Path) -> None:
    original = run_scenario(
        _scenario(CRASH_NAMING_LATER_REQUESTS), tmp_path / "run", options=RunOptions(write_plots=False)
    )
    replayed = run_scenario(load_scenario(tmp_path / "run" / "replay" / "replay.yaml"), None)
    assert _crash_key(replayed.crash) == _crash_key(original.crash)
    for table in ("admissions", "kv_events", "schedule"):
        assert original.tables[table].equals(replayed.tables[table]), table


def test_a_failed_replay_derivation_keeps_the_bundle_with_a_note(tmp_path: Path, monkeypatch) -> None:
    def broken(*args: object, **kwargs: object) -> Scenario:
        raise ValueError("cannot cut this\nsecond line")

    monkeypatch.setattr(write_module, "replay_scenario", broken)
    out = tmp_path / "run"
    result = run_scenario(_scenario(CRASH_NAMING_LATER_REQUESTS), out, options=RunOptions(write_plots=False))
    assert result.crash is not None and result.path == out
    assert check_bundle(out).ok
    assert (out / "summary.json").is_file() and (out / "admissions.parquet").is_file()
    crash = json.loads((out / "crash.json").read_text())
    assert crash["replay_note"] == (
        "replay/ not written: deriving the replay scenario failed (ValueError: cannot cut this)"
    )
    assert "hybridsim replay" not in crash["next"] and "hybridsim shrink" in crash["next"]
    assert not (out / "replay").exists()


# --------------------------------------------------------------------------- the cut, unit by unit


def _script(requests: list[dict], **extra: object) -> dict:
    return {
        "name": "cut",
        "clock": "steps",
        "cache": {"block_size": 16, "num_blocks": 40, "groups": ["full_attention"]},
        "workload": {"requests": requests, **extra.pop("workload", {})},  # type: ignore[dict-item]
        **extra,
    }


def _req(rid: str, at: int, **extra: object) -> dict:
    return {"id": rid, "at": at, "prompt": [{"content": "doc", "tokens": 32}], "max_tokens": 2, **extra}


def _ids(scenario: Scenario) -> list[str]:
    assert scenario.workload.requests is not None
    return [r.id for r in scenario.workload.requests]


def test_the_cut_keeps_the_parents_a_kept_request_waits_for() -> None:
    data = _script(
        [_req("a", 0), _req("b", 9), _req("c", 1, after=["b"]), _req("d", 9)], workload={"sessions": {"mode": "open"}}
    )
    cut = replay_scenario(Scenario.model_validate(data), 3, arrived={"a", "c"})
    assert _ids(cut) == ["a", "b", "c"]
    assert cut.on_crash == "stop" and cut.name == "cut-replay"


def test_with_closed_loop_concurrency_the_cut_keeps_whole_sessions() -> None:
    requests = [_req("s1", 0), _req("s1t2", 0, after=["s1"]), _req("s2", 0), _req("s2t2", 0, after=["s2"])]
    data = _script(requests, workload={"sessions": {"mode": "closed", "concurrency": 1}})
    cut = replay_scenario(Scenario.model_validate(data), 3, arrived={"s1"})
    # Dropping s1's second turn would end s1 early and start s2 in its slot before the crash.
    assert _ids(cut) == ["s1", "s1t2"]


def test_the_cut_filters_a_wrapped_connector_and_fault_actions_to_the_kept_requests() -> None:
    data = _script(
        [_req("a", 0), _req("b", 9)],
        connector={
            "type": "faulty",
            "wraps": {"type": "scripted", "matched_tokens": {"a": 16, "b": 16}},
            "fail_loads": ["a", "b"],
            "slow": {"b": 2.0},
        },
        actions=[{"at": 2, "connector_fault": {"drop_mamba": ["b"], "partial_loads": {"a": 0.5, "b": 0.5}}}],
    )
    cut = replay_scenario(Scenario.model_validate(data), 3, arrived={"a"})
    options = cut.connector.options()
    assert options["wraps"]["matched_tokens"] == {"a": 16}
    assert options["fail_loads"] == ["a"] and options["slow"] == {}
    fault = cut.actions[0].connector_fault
    assert fault is not None and fault.model_extra == {"drop_mamba": [], "partial_loads": {"a": 0.5}}


@pytest.mark.parametrize("workload", [{"sample": 0.5}, {"limit": 3}])
def test_a_workload_whose_draws_depend_on_position_keeps_every_request(workload: dict) -> None:
    data = _script([_req("a", 0), _req("b", 9), _req("c", 12)], workload=workload)
    cut = replay_scenario(Scenario.model_validate(data), 3, arrived={"a"})
    assert _ids(cut) == ["a", "b", "c"]


def test_on_the_time_clock_only_the_crash_mode_and_name_change() -> None:
    data = {
        "name": "timed",
        "clock": "time",
        "model": {"preset": "nemotron-h-8b"},
        "hardware": {"preset": "h100-80g"},
        "workload": {"requests": [_req("a", 0), _req("b", 9)]},
        "actions": [{"at": 100.0, "reset_prefix_cache": True}],
        "on_crash": "record",
    }
    scenario = Scenario.model_validate(data)
    cut = replay_scenario(scenario, 3, arrived={"a"})
    assert _ids(cut) == ["a", "b"] and len(cut.actions) == 1 and cut.on_crash == "stop"
