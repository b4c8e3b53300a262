"""After an async load, Mamba's block-aligned split can leave a resuming request no chunk (a small token budget):
vLLM's waiting loop stops there, before allocate_slots. hybridsim records that attempt (after_async_load,
not_admitted, no_aligned_chunk); the vLLM harness now sees it too (it looked only at lookups and allocations, so
`fuzz --vllm` seed 29002 reported 3 of 800 scenarios, and a targeted search 1 of 1,500, as differing)."""

from __future__ import annotations

import pytest

from sim.config.load import scenario_from_text
from sim.verify.run import VerifyStatus, hybridsim_trace, verify_scenario

pytestmark = pytest.mark.slow

# fuzz --vllm seed 29002, scenario 720: a 24-token budget, r0's async load (32 external tokens) lands at step 16.
SCENARIO = """\
name: async-load-no-aligned-chunk
seed: 29002
clock: steps
vllm_version: '0.33'
cache:
  block_size: 16
  num_blocks: 19
  groups:
  - {type: full_attention}
  - {type: mamba, prefill_checkpoints: false}
  - {type: mamba, prefill_checkpoints: true}
  enable_prefix_caching: true
  retention_interval: null
scheduler: {max_num_seqs: 2, max_num_batched_tokens: 24, prefix_policy: pr48425}
connector:
  type: scripted
  matched_tokens: {r0: 32, r1: 16, r2: 0}
  supports_divergent_local_hybrid_hits: true
  load_async: true
  async_load_steps: 1
workload:
  requests:
  - id: r0
    at: 15
    prompt:
    - {content: doc0, tokens: 160}
    - {content: tail0, tokens: 38}
    max_tokens: 4
  - id: r1
    at: 22
    prompt:
    - {content: doc0, tokens: 177}
    - {content: tail1, tokens: 7}
    max_tokens: 6
  - id: r2
    at: 15
    prompt:
    - {content: doc0, tokens: 32}
    - {content: tail2, tokens: 40}
    max_tokens: 3
actions:
- at: 20
  evict:
    prefix_of: r0
    group: full_attention
    blocks: [8, 9]
- at: 38
  evict:
    prefix_of: r2
    group: mamba
    blocks: [1, 2]
on_crash: stop
outputs: {plots: false}
"""


def test_the_attempt_without_a_chunk_after_an_async_load_is_recorded_on_both_sides(vllm) -> None:
    # Both releases decide this scenario alike (no 0.34 knob is set): verify against whichever is installed.
    scenario = scenario_from_text(SCENARIO, "async-load-no-aligned-chunk.yaml", overrides=[f"vllm_version={vllm}"])
    ours = hybridsim_trace(scenario, 10_000)
    step16 = next(s for s in ours["steps"] if s["step"] == 16)
    assert [(a["request"], a["kind"], a["result"]) for a in step16["admissions"]] == [
        ("r0", "after_async_load", "skipped")
    ]
    verdict = verify_scenario(scenario, quiet=True)
    assert verdict.status is VerifyStatus.IDENTICAL, verdict.difference and verdict.difference.describe()
