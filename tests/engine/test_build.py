"""Building a run: what the scheduler hands the kv manager, and which scenarios are refused.

The exact numbers here are vLLM 0.33.0's answers, obtained by running vLLM's
real ``Scheduler`` + ``KVCacheManager`` on CPU on the same case (a throwaway
script that builds ``VllmConfig`` and ``KVCacheConfig`` by hand and fabricates
model output as vLLM's scheduler tests do), then pinned here so no vLLM is
needed at test time.
"""

from __future__ import annotations

import pytest

import sim
from sim.config import ScenarioError, scenario_from_text
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


UNDERCOUNT = """
name: mamba-undercount-crash
clock: steps
cache: {block_size: 16, num_blocks: 7, groups: [full_attention, mamba]}
scheduler: {max_num_seqs: 4, max_num_batched_tokens: 8192, prefix_policy: pr48425}
connector: {type: scripted, matched_tokens: {r: 64}}
workload:
  requests:
    - {id: r, at: 0, prompt: [{content: doc, tokens: 80}], max_tokens: 1}
on_crash: stop
"""


def test_explicit_num_blocks_is_not_refused_and_the_undercount_crash_replays(tmp_path):
    """vLLM 0.33's answer (its real Scheduler on CPU, a hand-built KVCacheConfig of
    7 blocks, FA + align-mode Mamba, a MockKVConnector-like connector answering 64):
    no gate before it runs; r is admitted (5 FA + 1 counted Mamba block fit the 6
    usable), the Mamba group takes a second block for the external tokens, and
    step 0 raises ``ValueError: Cannot get 1 free blocks from the pool`` with r's
    tables at ([1, 2, 3, 4, 6], [0, 0, 0, 5]). hybridsim only warns."""
    from typer.testing import CliRunner

    from sim.cli import app
    from sim.engine.build import CapacityWarning

    scenario = scenario_from_text(UNDERCOUNT, "mamba-undercount-crash.yaml")
    with pytest.warns(CapacityWarning, match="cache.num_blocks: 7 blocks"):
        components = build_components(scenario)
    assert components is not None
    out = tmp_path / "run"
    with pytest.warns(CapacityWarning):
        result = sim.run(scenario, out)
    assert result.crash == {
        "step": 0,
        "time_s": 0.0,
        "request_id": "r",
        "reason": "ValueError: Cannot get 1 free blocks from the pool",
    }
    assert list(result.admissions["outcome"]) == ["crash"]
    assert list(result.admissions["external_tokens"]) == [64]
    # The replay bundle reproduces it.
    with pytest.warns(CapacityWarning):
        res = CliRunner().invoke(app, ["replay", str(out / "replay"), "-o", str(tmp_path / "replayed")])
    assert res.exit_code == 0, res.output
    assert "reproduced" in res.output and "NOT" not in res.output


KV_MEMORY = """
name: kv-memory-sizing
clock: steps
model: {preset: nemotron-h-8b}
cache: {kv_memory_gb: GIB}
scheduler: {max_num_seqs: 4, max_num_batched_tokens: 2048}
workload:
  requests:
    - {id: r0, at: 0, prompt: [{content: doc, tokens: 40}], max_tokens: 2}
"""


def test_memory_derived_blocks_keep_vllms_startup_sizing_check():
    """vLLM 0.33's ``check_enough_kv_cache_memory`` on the same layer specs (4 FA
    layers and 24 Mamba2 layers with prefill checkpoints, block 1040, pages of
    4259840 bytes, max_model_len 8192), called directly: 460062720 bytes pass,
    460062719 are refused (8 FA pages x 4 + 3 Mamba pages x 24 = 104 pages needed,
    besides one 4-page null block)."""
    ok = scenario_from_text(KV_MEMORY.replace("GIB", repr(460062720 / (1 << 30))), "kv-memory-sizing.yaml")
    assert ok.kv_memory_bytes() == 460062720
    components = build_components(ok)
    assert components is not None and components.kv_cache_config.num_blocks == 27
    short = scenario_from_text(KV_MEMORY.replace("GIB", repr(460062719 / (1 << 30))), "kv-memory-sizing.yaml")
    assert short.kv_memory_bytes() == 460062719
    with pytest.raises(
        ScenarioError, match=r"^cache.kv_memory_gb: one request of the max seq len \(8192\) needs 443023360 bytes"
    ):
        build_components(short)
