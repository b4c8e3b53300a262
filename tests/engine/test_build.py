"""Building a run: what the scheduler hands the kv manager, and which scenarios are refused.

The exact numbers here are vLLM 0.33.0's answers, obtained by running vLLM's
real ``Scheduler`` + ``KVCacheManager`` on CPU on the same case (a throwaway
script that builds ``VllmConfig`` and ``KVCacheConfig`` by hand and fabricates
model output as vLLM's scheduler tests do), then pinned here so no vLLM is
needed at test time.
"""

from __future__ import annotations

import sim
from sim.config import scenario_from_text
from sim.engine.build import build_components

SWA_LONG_PROMPT = """
name: swa-admission-cap
clock: steps
cache: {block_size: 16, num_blocks: 30, groups: [full_attention, {type: sliding_window, window: 32}]}
scheduler: {max_num_seqs: 4, max_num_batched_tokens: 64, max_model_len: 8192, prefix_policy: pr48425}
workload:
  requests:
    - {id: r0, at: 0, prompt: [{content: doc, tokens: 320}], max_tokens: 2}
"""


def test_sliding_window_admission_cap_uses_the_in_flight_tokens():
    """vLLM 0.33: ``max_in_flight_tokens`` = 1 batch x 64 tokens, so the SWA group
    reserves at most cdiv(32 - 1 + 64, 16) + 1 = 7 blocks for the new request;
    20 FA + 7 SWA fit in the 29 usable blocks and r0 is admitted at step 0.
    (Capped at max_model_len instead, it would need 20 + 20 and never run.)"""
    scenario = scenario_from_text(SWA_LONG_PROMPT, "swa-admission-cap.yaml")
    components = build_components(scenario)
    swa = components.kv_manager.coordinator.single_type_managers[1]
    assert swa.max_admission_blocks_per_request == 7
    result = sim.run(scenario)
    assert result.summary["crash"] is None
    sched = result.schedule
    # vLLM 0.33's schedule: 64-token chunks at steps 0-4, the decode at step 5.
    assert list(sched["step"]) == [0, 1, 2, 3, 4, 5]
    assert list(sched["num_scheduled_tokens"]) == [64, 64, 64, 64, 64, 1]
    # vLLM 0.33's free blocks after each step (block_pool.get_num_free_blocks()).
    assert list(result.steps["free_blocks"]) == [21, 15, 11, 7, 3, 29]
