"""A cluster with a shared tier and prefill/decode roles: each instance runs vLLM's MultiConnector over its NIXL
side and the tier (sim/cluster/instances.py), every request ends once after one leg, decode instances store to
the tier and load from it only what NIXL does not serve, and ``verify`` says identical per instance."""

from __future__ import annotations

from typing import Any

import pandas as pd
import pytest

import sim
from sim.cluster.instances import instance_scenarios
from sim.config import scenario_from_text
from sim.results.finalize import RunResult

PD_TIER = """
name: pd-tier
seed: 5
clock: steps
cache: {block_size: 16, num_blocks: 60, groups: [full_attention, mamba]}
scheduler: {max_num_seqs: 8, max_num_batched_tokens: 256, max_model_len: 4096, prefix_policy: pr48425}
outputs: {plots: false}
workload:
  generator:
    arrivals: {process: poisson, rate: 2}
    count: 60
    structure:
      kind: shared_system
      system: {num_prompts: 3, length: {dist: uniform, low: 60, high: 200}, zipf: 1.0}
      user_len: {dist: lognormal, mean: 40, sigma: 0.5}
    output: {dist: uniform, low: 2, high: 40}
cluster:
  instances: [{role: prefill}, {role: decode}, {role: decode}]
  router: {policy: round_robin}
  tier: {capacity_gb: 0.01, chunk_tokens: 32, transfer_steps: 3}
"""


def _run(text: str = PD_TIER) -> RunResult:
    return sim.run_scenario(scenario_from_text(text), None)


def test_each_role_runs_nixl_and_the_tier_in_vllms_order() -> None:
    kinds = [
        [c["type"] for c in s.connector.options()["connectors"]]
        for s in instance_scenarios(scenario_from_text(PD_TIER))
    ]
    assert kinds == [["offload", "remote"], ["remote", "offload"], ["remote", "offload"]]


def test_every_request_ends_once_and_decode_instances_store_to_the_tier() -> None:
    result = _run()
    requests = result.tables["requests"]
    legs = requests[requests["request_id"].str.endswith("@prefill")]
    clients = requests[~requests["request_id"].str.endswith("@prefill")]
    assert len(clients) == 60 and clients["request_id"].is_unique and set(requests["outcome"]) == {"ok"}
    assert sorted(legs["request_id"]) == sorted(r + "@prefill" for r in clients["request_id"])
    assert set(legs["instance"]) == {0} and set(clients["instance"]) == {1, 2}
    assert result.summary["requests"]["total"] == 60
    assert "pd" in result.summary and "tier" in result.summary
    events = result.tier_tables["tier_events"]
    for decode in (1, 2):
        mine = events[events["instance"] == decode]
        assert (mine["kind"] == "stored").sum() > 0  # the decode instances' offload connectors store
    # Every prefill leg was pulled once: NIXL served the decode instances' first loads, not the tier.
    pd_ = result.summary["pd"]
    assert pd_["prefills"] == pd_["pulls"] == 60
    metrics = [result.summary["instances"][i]["connector_metrics"] for i in range(3)]
    assert metrics[0]["remote.loads"] == 0 and metrics[0]["offload.loads"] > 0
    for m in metrics[1:]:
        assert m["loads"] == m["remote.loads"] + m["offload.loads"]
    # The tier's hit statistics count only what the tier served (not the admissions NIXL served).
    assert result.summary["tier"]["usable_hit_tokens"] == sum(m["offload.load_tokens"] for m in metrics) > 0


def test_reruns_are_identical() -> None:
    first, second = _run(), _run()
    for name, table in first.tables.items():
        pd.testing.assert_frame_equal(table, second.tables[name])
    pd.testing.assert_frame_equal(first.tier_tables["tier_events"], second.tier_tables["tier_events"])


def _verify(vllm: str) -> Any:
    from sim.verify.run import verify_scenario

    return verify_scenario(scenario_from_text(PD_TIER + f"vllm_version: '{vllm}'\n"))


@pytest.mark.slow
def test_each_instance_decides_as_vllm_with_its_recorded_answers(vllm: str) -> None:
    from sim.verify.run import VerifyStatus

    verdict = _verify(vllm)
    assert verdict.status is VerifyStatus.IDENTICAL, (verdict.reason, verdict.difference)
    assert verdict.reason == (
        "instance 0: identical (60 requests); instance 1: identical (30 requests); instance 2: identical (30 requests)"
    )
