"""``hybridsim shrink`` on a crashed cluster: the crashing instance alone (sim.shrink.isolate)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.cli import invoke

from sim.config import load_scenario, scenario_from_text
from sim.config.scenario import Scenario
from sim.shrink import ShrinkError
from sim.shrink.isolate import isolate_crash
from sim.shrink.probe import probe

# Round robin sends c and then `bad` to instance 1, where the scripted connector claims 41 tokens of `bad`'s
# 17-token prompt.
CRASHING = """\
name: cluster-crash
seed: 1
clock: steps
cache: {block_size: 16, num_blocks: 40, groups: [full_attention]}
scheduler: {max_num_seqs: 2, max_num_batched_tokens: 32}
connector: {type: scripted, matched_tokens: {bad: 41}, supports_divergent_local_hybrid_hits: true}
outputs: {plots: false}
workload:
  requests:
  - {id: a, at: 0, prompt: [{content: doc0, tokens: 16}], max_tokens: 2}
  - {id: c, at: 0, prompt: [{content: doc1, tokens: 40}], max_tokens: 2}
  - {id: e, at: 1, prompt: [{content: doc1, tokens: 48}], max_tokens: 2}
  - {id: bad, at: 2, prompt: [{content: doc0, tokens: 17}], max_tokens: 1}
cluster: {instances: 2}
"""
REASON = "AssertionError: num_computed_tokens <= request.num_tokens"


def test_the_crashing_instance_alone_gets_what_the_router_sent_it() -> None:
    isolated = isolate_crash(scenario_from_text(CRASHING))
    alone = isolated.scenario
    assert isolated.instance == 1 and alone.cluster is None
    assert [(r.id, r.at) for r in alone.workload.requests] == [("c", 0), ("bad", 2)]
    crash = probe(alone).crash
    assert crash is not None and (crash.reason, crash.request_id) == (REASON, "bad")
    assert "instance 1: shrinking that instance alone (2 requests" in isolated.note()


def test_instance_overrides_carry_over() -> None:
    text = CRASHING.replace("cluster: {instances: 2}", "cluster: {instances: [{}, {cache: {num_blocks: 30}}]}")
    assert isolate_crash(scenario_from_text(text)).scenario.cache.num_blocks == 30


def test_cli_shrinks_a_crashed_cluster_bundle_to_one_engine(tmp_path: Path) -> None:
    source = tmp_path / "cluster.yaml"
    source.write_text(CRASHING)
    bundle = tmp_path / "bundle"
    res = invoke("run", source, "-o", bundle, "-q")
    assert res.exit_code == 3, res.output
    assert "the crashing instance alone" in json.loads((bundle / "crash.json").read_text())["next"]
    small = tmp_path / "small.yaml"
    res = invoke("shrink", bundle, "-o", small, "-q")
    assert res.exit_code == 0, res.output
    assert "crashed on instance 1: shrinking that instance alone" in res.output
    shrunk = load_scenario(small)
    assert shrunk.cluster is None
    assert probe(shrunk).crash.reason == REASON
    res = invoke("export", "vllm-test", small, "-o", tmp_path / "test_repro.py")
    assert res.exit_code == 0, res.output


def test_a_cluster_that_does_not_crash_is_refused() -> None:
    with pytest.raises(ShrinkError, match="only when it crashes"):
        isolate_crash(scenario_from_text(CRASHING.replace("bad: 41", "bad: 0")))


@pytest.mark.parametrize(
    "cluster",
    [
        "cluster: {instances: 2, tier: {capacity_gb: 1.0}}",
        "cluster: {instances: [{role: prefill}, {role: decode}]}",
    ],
)
def test_shared_state_clusters_are_refused_in_one_line(cluster: str, tmp_path: Path) -> None:
    text = CRASHING.replace("cluster: {instances: 2}", cluster).replace(
        "connector: {type: scripted, matched_tokens: {bad: 41}, supports_divergent_local_hybrid_hits: true}\n", ""
    )
    source = tmp_path / "s.yaml"
    source.write_text(text)
    res = invoke("shrink", source, "-o", tmp_path / "small.yaml", "-q")
    assert res.exit_code == 2, res.output
    assert res.output.strip().splitlines()[-1].startswith("error: cluster: shrink reduces a crashed cluster")
    assert not (tmp_path / "small.yaml").exists()


def test_a_crash_that_needs_the_cluster_is_refused(monkeypatch) -> None:
    """When the instance alone does not crash as it did in the cluster (here: made to finish clean), the
    isolation says so rather than shrinking something else."""
    from sim.shrink import isolate

    real = isolate.probe
    clean = isolate_crash(scenario_from_text(CRASHING)).scenario.model_dump(mode="json")
    clean["connector"]["matched_tokens"] = {"bad": 0}
    monkeypatch.setattr(isolate, "probe", lambda scenario: real(Scenario.model_validate(clean)))
    with pytest.raises(ShrinkError, match="alone, fed the same requests at the same times, it does not crash"):
        isolate_crash(scenario_from_text(CRASHING))
