"""A forced eviction of a running request's prompt-boundary Mamba state is undone at its next step.

vLLM 0.33's ``MambaManager._cache_partial_tail_block`` keys the block holding
the state at the prompt's last hash boundary whenever the cached prefix
reaches that boundary and the block is not keyed there. Pinned from vLLM
0.33 (run through ``sim/verify/vllm_side.py``): the evict action at step 2
drops the state at 112 (block 8, group 1); the same step's ``allocate_slots``
for the last prompt token stores block 8 again under the same hash.
"""

from __future__ import annotations

from sim.api import run_scenario
from sim.config.load import scenario_from_text

SCENARIO = """
name: rekey
clock: steps
cache:
  block_size: 16
  num_blocks: 38
  groups: [full_attention, {type: mamba}]
  retention_interval: 16
scheduler: {max_num_seqs: 3, max_num_batched_tokens: 256}
workload:
  requests:
    - {id: r0, at: 1, prompt: [{content: doc0, tokens: 82}, {content: tail0, tokens: 31}], max_tokens: 1}
actions:
  - {at: 2, evict: {prefix_of: r0, group: mamba, blocks: [5, 6]}}
"""


def test_evicted_prompt_boundary_state_is_keyed_again_like_vllm():
    result = run_scenario(scenario_from_text(SCENARIO, "rekey.yaml"))
    ev = result.tables["kv_events"]
    step2 = ev[ev["step"] == 2][["kind", "group", "block_id"]].values.tolist()
    assert step2 == [["removed", 1, 8], ["stored", 1, 8]]
    stored_at_1 = ev[(ev["step"] == 1) & (ev["group"] == 1)]
    assert stored_at_1["block_hash"].tolist() == ev[(ev["step"] == 2) & (ev["kind"] == "stored")]["block_hash"].tolist()
