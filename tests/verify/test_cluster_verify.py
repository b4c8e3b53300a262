"""``verify`` on a cluster: every instance against vLLM given the requests the router sent it (slow: vLLM)."""

from __future__ import annotations

import pytest

from sim.config import scenario_from_text
from sim.verify.run import VerifyStatus, verify_scenario

pytestmark = pytest.mark.slow

CLUSTER = """
name: cluster-verify
seed: 5
clock: steps
cache: {block_size: 16, num_blocks: 120, groups: [full_attention, mamba]}
scheduler: {max_num_seqs: 4, max_num_batched_tokens: 256, max_model_len: 4096, prefix_policy: pr48425}
outputs: {plots: false}
workload:
  generator:
    arrivals: {process: poisson, rate: 0.6}
    count: 30
    structure:
      kind: shared_system
      system: {num_prompts: 3, length: {dist: uniform, low: 60, high: 200}, zipf: 1.0}
      user_len: {dist: lognormal, mean: 40, sigma: 0.5}
    output: {dist: uniform, low: 2, high: 12}
cluster: {instances: 2, router: {policy: prefix_aware, group_aware: true}}
"""


def test_each_instance_decides_as_vllm(vllm: str) -> None:
    verdict = verify_scenario(scenario_from_text(CLUSTER + f"vllm_version: '{vllm}'\n"))
    assert verdict.status is VerifyStatus.IDENTICAL, (verdict.reason, verdict.difference)
    assert "instance 0: identical" in verdict.reason and "instance 1: identical" in verdict.reason


def test_a_cluster_with_a_what_if_instance_is_not_verifiable(vllm: str) -> None:
    text = CLUSTER.replace(
        "cluster: {instances: 2,", "cluster: {instances: [{}, {scheduler: {prefix_policy: reconciled}}],"
    )
    verdict = verify_scenario(scenario_from_text(text + f"vllm_version: '{vllm}'\n"))
    assert verdict.status is VerifyStatus.NOT_VERIFIABLE
    assert verdict.reason.startswith("instance 1: scheduler.prefix_policy")
