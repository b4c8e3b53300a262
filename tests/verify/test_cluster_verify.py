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


SPLIT_TURNS = """
name: split-turns
clock: steps
cache: {block_size: 16, num_blocks: 64, groups: [full_attention, mamba]}
scheduler: {max_num_seqs: 4, max_num_batched_tokens: 256, prefix_policy: pr48425}
outputs: {plots: false}
workload:
  sessions: {mode: open}
  requests:
    - {id: t1, at: 0, prompt: [{content: chat, tokens: 40}], max_tokens: 3}
    - {id: o1, at: 0, prompt: [{content: other, tokens: 40}], max_tokens: 3}
    - {id: o2, at: 0, prompt: [{content: more, tokens: 40}], max_tokens: 3}
    - {id: t2, at: 6, after: t1, max_tokens: 2,
       prompt: [{content: chat, tokens: 40}, {output_of: t1, tokens: 3}, {content: u2, tokens: 10}]}
    - {id: t3, at: 9, after: t1, max_tokens: 2,
       prompt: [{content: chat, tokens: 40}, {output_of: t1, tokens: 3}, {content: u3, tokens: 10}]}
cluster: {instances: 2, router: {policy: round_robin}}
"""


def test_a_turn_quoting_a_parent_that_ran_elsewhere_is_verified(vllm: str) -> None:
    """Round robin: t2 runs on instance 1 and quotes t1's answer, generated on instance 0 (t3 quotes it beside
    t1): instance 1's lowering numbers that output as a stream of its own (it was 'not verifiable: the
    reserved stream of a request not in the workload')."""
    verdict = verify_scenario(scenario_from_text(SPLIT_TURNS + f"vllm_version: '{vllm}'\n"))
    assert verdict.status is VerifyStatus.IDENTICAL, (verdict.reason, verdict.difference)
    assert "instance 0: identical (3 requests); instance 1: identical (2 requests)" in verdict.reason


def test_an_instance_that_stalls_while_the_others_run_is_verified(vllm: str) -> None:
    from cluster.test_cluster_run import STALLS_EARLY

    verdict = verify_scenario(scenario_from_text(STALLS_EARLY + f"vllm_version: '{vllm}'\n"))
    assert verdict.status is VerifyStatus.IDENTICAL, (verdict.reason, verdict.difference)
