"""Scenario loading: file:line errors, did-you-mean, unsafe tags, overrides, defaults, round trip."""

import textwrap
from pathlib import Path

import pytest

from sim.config import ScenarioError, kv_memory_budget, load_scenario, resolved_yaml, scenario_from_text
from sim.config.presets import HARDWARE_PRESETS, MODEL_PRESETS, GiB

STEPS = """\
name: mamba-deeper-than-fa
seed: 7
clock: steps
model: {preset: nemotron-h-8b}
cache:
  block_size: 16
  num_blocks: 100
  enable_prefix_caching: true
  mamba_cache_mode: align
  retention_interval: null
  groups: [full_attention, mamba]
scheduler: {max_num_seqs: 4, max_num_batched_tokens: 8192, prefix_policy: pr48425}
connector: {type: scripted, supports_divergent_local_hybrid_hits: true, matched_tokens: {r1: 16}}
workload:
  requests:
    - {id: r0, at: 0, prompt: [{content: doc, tokens: 80}], max_tokens: 1}
    - {id: r1, at: 5, prompt: [{content: doc, tokens: 80}], max_tokens: 4}
actions:
  - {at: 3, evict: {prefix_of: r0, group: full_attention, blocks: [2, 3]}}
on_crash: record
"""

TIME = """\
name: mooncake-conversation-nemotron
seed: 1
clock: time
model: {preset: nemotron-h-8b}
hardware: {preset: h100-80g, gpu_memory_utilization: 0.92}
scheduler: {prefix_policy: pr48425}
connector: {type: offload, capacity_gb: 200}
workload:
  trace: {format: mooncake, path: ../shared/traces/mooncake_conversation_trace.jsonl}
"""


def write(tmp_path: Path, text: str, name: str = "s.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def error(path: Path, overrides=()) -> str:
    with pytest.raises(ScenarioError) as info:
        load_scenario(path, overrides)
    return str(info.value)


# ------------------------------------------------------------------ valid scenarios and defaults


def test_design_examples_load_with_defaults(tmp_path):
    s = load_scenario(write(tmp_path, STEPS))
    assert s.cache.groups[1].type == "mamba" and s.cache.groups[1].prefill_checkpoints is False
    assert s.cache.retention_interval is None
    assert s.scheduler.max_model_len == 8192  # the preset's context length
    assert s.scheduler.policy == "fcfs" and s.scheduler.long_prefill_token_threshold == 0
    assert s.connector.type == "scripted"
    assert s.connector.options() == {"supports_divergent_local_hybrid_hits": True, "matched_tokens": {"r1": 16}}
    assert s.outputs.schedule_table is True  # on by default with clock: steps
    assert s.actions[0].evict.group == "full_attention" and s.actions[0].at == 3
    assert s.kv_memory_bytes() is None  # num_blocks given

    t = load_scenario(write(tmp_path, TIME, "t.yaml"))
    assert t.cache.retention_interval == 0 and t.cache.mamba_cache_mode == "align"
    # vLLM's server defaults for a >= 70 GiB non-A100 GPU
    assert (t.scheduler.max_num_batched_tokens, t.scheduler.max_num_seqs) == (8192, 1024)
    assert t.outputs.schedule_table is False
    assert t.on_crash == "stop" and t.hardware.gpu_memory_utilization == 0.92
    # paths are relative to the scenario file
    assert t.workload.trace.path == str((tmp_path / "../shared/traces/mooncake_conversation_trace.jsonl").resolve())
    assert t.kv_memory_bytes() == kv_memory_budget(
        MODEL_PRESETS["nemotron-h-8b"],
        HARDWARE_PRESETS["h100-80g"],
        gpu_memory_utilization=0.92,
        max_num_batched_tokens=8192,
        max_num_seqs=1024,
    )


def test_explicit_groups_without_model(tmp_path):
    text = """\
    name: g
    cache: {num_blocks: 10, groups: [full_attention, {type: sliding_window, window: 64}]}
    workload: {requests: [{id: a, prompt: [{content: x, tokens: 4}], max_tokens: 1}]}
    """
    s = load_scenario(write(tmp_path, text))
    assert s.model is None and s.model_shape() is None
    assert s.scheduler.max_model_len == 8192
    assert (s.scheduler.max_num_batched_tokens, s.scheduler.max_num_seqs) == (2048, 128)
    assert s.cache.groups[1].window == 64


def test_batch_defaults_follow_the_gpu(tmp_path):
    path = write(tmp_path, TIME)
    for hw, expected in (("a100-80g", (2048, 256)), ("l40s", (2048, 256)), ("h200", (8192, 1024))):
        s = load_scenario(path, [f"hardware.preset={hw}"])
        assert (s.scheduler.max_num_batched_tokens, s.scheduler.max_num_seqs) == expected
    s = load_scenario(path, ["hardware.overrides.memory_bytes=" + str(192 * GiB)])
    assert (s.scheduler.max_num_batched_tokens, s.scheduler.max_num_seqs) == (16384, 1024)


def test_model_shape_follows_hardware_and_max_model_len(tmp_path):
    path = write(tmp_path, TIME)
    s = load_scenario(
        path, ["model.preset=qwen3-next-80b-a3b", "cache.kv_memory_gb=20", "scheduler.max_model_len=4096"]
    )
    shape = s.model_shape()
    assert shape.max_model_len == 4096
    assert all(layer.prefill_checkpoints for layer in shape.layers if hasattr(layer, "mixer"))  # GDN on Hopper
    assert s.kv_memory_bytes() == 20 * GiB


def test_resolved_round_trip(tmp_path):
    for text in (STEPS, TIME):
        s = load_scenario(write(tmp_path, text))
        dumped = resolved_yaml(s)
        again = scenario_from_text(dumped, "resolved.yaml")
        assert again == s
        assert resolved_yaml(again) == dumped
        assert "max_model_len: 8192" in dumped and "watermark: 0.0" in dumped


# ------------------------------------------------------------------ errors: FILE:LINE: key.path: message


def test_unknown_key_did_you_mean(tmp_path):
    path = write(tmp_path, STEPS.replace("  block_size: 16", "  blok_size: 16"))
    msg = error(path)
    assert msg.startswith(
        f"{path}:6: cache.blok_size: unknown key 'blok_size' (did you mean 'block_size'?) (valid: block_size, "
    )


def test_unknown_top_level_key(tmp_path):
    path = write(tmp_path, STEPS + "schedular: {}\n")
    assert error(path).startswith(f"{path}:21: schedular: unknown key 'schedular' (did you mean 'scheduler'?)")


def test_unknown_key_inside_a_union_member(tmp_path):
    path = write(
        tmp_path,
        STEPS.replace("{content: doc, tokens: 80}], max_tokens: 4", "{content: doc, tokenz: 80}], max_tokens: 4"),
    )
    assert error(path).startswith(
        f"{path}:17: workload.requests.1.prompt.0.tokenz: unknown key 'tokenz' (did you mean 'tokens'?)"
    )


def test_bad_value_points_at_its_line(tmp_path):
    path = write(tmp_path, STEPS.replace("num_blocks: 100", "num_blocks: 0"))
    assert error(path) == f"{path}:7: cache.num_blocks: must be >= 2 (got 0)"
    path = write(tmp_path, STEPS.replace("on_crash: record", "on_crash: explode"))
    assert error(path) == f"{path}:20: on_crash: invalid value 'explode' (valid: 'stop' or 'record')"


def test_unknown_preset_lists_valid(tmp_path):
    path = write(tmp_path, STEPS.replace("nemotron-h-8b", "nemotron-h"))
    msg = error(path)
    assert msg.startswith(f"{path}:4: model.preset: unknown model preset 'nemotron-h' (did you mean 'nemotron-h-8b'?)")
    assert (
        "(valid: nemotron-h-8b, jamba-1.5-mini, granite-4.0-h-small, qwen3-next-80b-a3b, falcon-h1-7b, llama-3.1-8b)"
        in msg
    )


def test_conflicting_block_sources(tmp_path):
    path = write(tmp_path, STEPS.replace("  num_blocks: 100", "  num_blocks: 100\n  kv_memory_gb: 4"))
    assert error(path) == f"{path}:8: cache.kv_memory_gb: give cache.num_blocks or cache.kv_memory_gb, not both"


def test_retention_not_multiple_of_block_size(tmp_path):
    path = write(tmp_path, STEPS.replace("retention_interval: null", "retention_interval: 24"))
    assert error(path) == f"{path}:10: cache.retention_interval: 24 is not a multiple of the block size 16"


def test_retention_needs_sparse_layers(tmp_path):
    path = write(tmp_path, TIME)
    msg = error(path, ["model.preset=llama-3.1-8b", "cache.retention_interval=32"])
    assert msg.startswith(
        "--set cache.retention_interval=32: cache.retention_interval: a positive retention interval needs"
    )


def test_mamba_cache_mode_must_match_prefix_caching(tmp_path):
    path = write(tmp_path, STEPS.replace("enable_prefix_caching: true", "enable_prefix_caching: false"))
    assert error(path).startswith(f"{path}:9: cache.mamba_cache_mode: 'align' contradicts enable_prefix_caching: false")


def test_empty_workload(tmp_path):
    path = write(
        tmp_path,
        TIME.replace(
            "  trace: {format: mooncake, path: ../shared/traces/mooncake_conversation_trace.jsonl}", "  requests: []"
        ),
    )
    assert error(path).startswith(f"{path}:8: workload: ")
    assert "at least one request" in error(path)


def test_missing_required_key(tmp_path):
    path = write(tmp_path, STEPS.replace("name: mamba-deeper-than-fa\n", ""))
    assert error(path) == f"{path}:1: name: required key is missing"


def test_sliding_window_group_needs_window(tmp_path):
    path = write(tmp_path, STEPS.replace("groups: [full_attention, mamba]", "groups: [full_attention, sliding_window]"))
    assert error(path) == f"{path}:11: cache.groups.1.window: required key is missing"
    path = write(tmp_path, STEPS.replace("groups: [full_attention, mamba]", "groups: [full_attention, slidingwindow]"))
    assert "unknown group type 'slidingwindow' (did you mean 'sliding_window'?)" in error(path)


def test_action_checks(tmp_path):
    path = write(tmp_path, STEPS.replace("prefix_of: r0", "prefix_of: r00"))
    assert error(path) == f"{path}:19: actions.0.evict.prefix_of: no request 'r00' in the workload (did you mean 'r0'?)"
    path = write(tmp_path, STEPS.replace("group: full_attention", "group: sliding_window"))
    assert error(path).startswith(f"{path}:19: actions.0.evict.group: no sliding_window group in cache.groups")
    path = write(tmp_path, STEPS.replace("{at: 3, evict:", "{at: 3, reset_prefix_cache: true, evict:"))
    assert "exactly one of 'evict', 'reset_prefix_cache' or 'connector_fault' (got evict, reset_prefix_cache)" in error(
        path
    )


def test_clock_time_needs_preset_and_hardware(tmp_path):
    path = write(tmp_path, TIME.replace("hardware: {preset: h100-80g, gpu_memory_utilization: 0.92}\n", ""))
    assert "hardware: clock: time needs a hardware preset (valid: a100-80g, h100-80g, h200, l40s)" in error(path)


def test_model_that_does_not_fit(tmp_path):
    path = write(tmp_path, TIME)
    msg = error(path, ["model.preset=qwen3-next-80b-a3b"])
    assert msg.startswith(f"{path}:5: hardware.preset: model qwen3-next-80b-a3b")
    assert msg.endswith("give cache.num_blocks or cache.kv_memory_gb")


def test_python_tag_is_rejected_not_run(tmp_path):
    marker = tmp_path / "pwned"
    path = write(tmp_path, STEPS + f"extra: !!python/object/apply:os.system ['touch {marker}']\n")
    assert error(path) == (
        f"{path}:21: extra: tag !!python/object/apply:os.system is not allowed "
        "(valid: plain YAML scalars, mappings and lists)"
    )
    assert not marker.exists()


def test_yaml_syntax_error_and_duplicates(tmp_path):
    path = write(tmp_path, "name: x\ncache: {block_size: 16\n")
    assert error(path).startswith(f"{path}:3: <yaml>: ")
    path = write(tmp_path, STEPS + "seed: 8\n")
    assert error(path) == f"{path}:21: seed: duplicate key"


# ------------------------------------------------------------------ overrides


def test_overrides(tmp_path):
    path = write(tmp_path, STEPS)
    s = load_scenario(
        path,
        [
            "cache.block_size=32",
            "cache.retention_interval=64",
            "scheduler.policy=priority",
            "cache.groups=[full_attention, {type: mamba, prefill_checkpoints: true}]",
            "workload.requests.1.max_tokens=9",
            "slo.ttft_s=0.5",
        ],
    )
    assert s.cache.block_size == 32 and s.cache.retention_interval == 64
    assert s.scheduler.policy == "priority"
    assert s.cache.groups[1].prefill_checkpoints is True
    assert s.workload.requests[1].max_tokens == 9
    assert s.slo.ttft_s == 0.5 and s.slo.tpot_s is None


def test_bad_overrides(tmp_path):
    path = write(tmp_path, STEPS)
    assert error(path, ["cache.block_size=-4"]) == "--set cache.block_size=-4: cache.block_size: must be >= 1 (got -4)"
    assert error(path, ["cache.block_size"]).startswith("--set cache.block_size: <override>: expected key.path=value")
    assert "unknown key 'blocksize'" in error(path, ["cache.blocksize=3"])
    assert error(path, ["workload.requests.7.max_tokens=3"]).startswith("--set workload.requests.7.max_tokens: ")
