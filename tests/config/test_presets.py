"""Model and hardware presets: layer mix, state bytes and parameter counts against hand-computed numbers."""

import pytest

from sim.config.presets import (
    HARDWARE_PRESETS,
    MODEL_PRESETS,
    NON_TORCH_OVERHEAD_BYTES,
    GiB,
    activation_peak_bytes,
    hardware_preset,
    kv_memory_budget,
    model_preset,
)
from sim.core.kv.shapes import AttentionLayerShape, MambaLayerShape

# name: (attention layers, mamba layers, mixer, state bytes per layer, attention KV bytes per token per layer)
EXPECTED = {
    # conv (3, 8192 + 2*8*128) bf16 + ssm (128, 64, 128) fp32
    "nemotron-h-8b": (4, 24, "mamba2", 3 * 10240 * 2 + 128 * 64 * 128 * 4, 8 * 256 * 2),
    # conv (3, 8192) bf16 + ssm (8192, 16) bf16
    "jamba-1.5-mini": (4, 28, "mamba1", 3 * 8192 * 2 + 8192 * 16 * 2, 8 * 256 * 2),
    # conv (3, 8192 + 2*1*128) + ssm (128, 64, 128), bf16
    "granite-4.0-h-small": (4, 36, "mamba2", 3 * 8448 * 2 + 128 * 64 * 128 * 2, 8 * 256 * 2),
    # conv (3, 2*16*128 + 32*128) + recurrent (32, 128, 128), bf16
    "qwen3-next-80b-a3b": (12, 36, "gdn", 3 * 8192 * 2 + 32 * 128 * 128 * 2, 2 * 512 * 2),
    # conv (3, 3072 + 2*1*256) + ssm (24, 128, 256), bf16
    "falcon-h1-7b": (44, 44, "mamba2", 3 * 3584 * 2 + 24 * 128 * 256 * 2, 2 * 256 * 2),
    "llama-3.1-8b": (32, 0, None, None, 8 * 256 * 2),
}


@pytest.mark.parametrize("name", list(EXPECTED))
def test_layer_mix_and_state_bytes(name):
    n_attn, n_mamba, mixer, state_bytes, kv_bytes = EXPECTED[name]
    preset = MODEL_PRESETS[name]
    attn = [layer for layer in preset.shape.layers if isinstance(layer, AttentionLayerShape)]
    mamba = [layer for layer in preset.shape.layers if isinstance(layer, MambaLayerShape)]
    assert (len(attn), len(mamba)) == (n_attn, n_mamba)
    assert (preset.num_attention_layers, preset.num_mamba_layers) == (n_attn, n_mamba)
    assert {layer.bytes_per_token for layer in attn} == {kv_bytes}
    assert all(layer.window is None for layer in attn)
    if mixer is None:
        assert not preset.shape.has_mamba
    else:
        assert {layer.mixer for layer in mamba} == {mixer}
        assert {layer.state_bytes for layer in mamba} == {state_bytes}


def test_layer_order():
    nemotron = MODEL_PRESETS["nemotron-h-8b"].shape.layers
    attn_at = [i for i, layer in enumerate(nemotron) if isinstance(layer, AttentionLayerShape)]
    # cache layers of "M-M-M-M*-M-M-M-M-M*-..." : the 5th cache layer (index 4) is the first attention
    assert attn_at == [4, 10, 16, 22]
    jamba = MODEL_PRESETS["jamba-1.5-mini"].shape.layers
    assert [i for i, layer in enumerate(jamba) if isinstance(layer, AttentionLayerShape)] == [4, 12, 20, 28]
    qwen = MODEL_PRESETS["qwen3-next-80b-a3b"].shape.layers
    assert [i for i, layer in enumerate(qwen) if isinstance(layer, AttentionLayerShape)] == list(range(3, 48, 4))
    falcon = MODEL_PRESETS["falcon-h1-7b"].shape.layers
    assert all(isinstance(layer, AttentionLayerShape) for layer in falcon[0::2])
    assert all(isinstance(layer, MambaLayerShape) for layer in falcon[1::2])


def test_prefill_checkpoints_follow_vllm():
    assert all(
        layer.prefill_checkpoints
        for layer in MODEL_PRESETS["nemotron-h-8b"].shape.layers
        if isinstance(layer, MambaLayerShape)
    )
    assert not any(
        layer.prefill_checkpoints
        for layer in MODEL_PRESETS["jamba-1.5-mini"].shape.layers
        if isinstance(layer, MambaLayerShape)
    )
    qwen = MODEL_PRESETS["qwen3-next-80b-a3b"]
    gdn = lambda shape: [layer for layer in shape.layers if isinstance(layer, MambaLayerShape)]  # noqa: E731
    assert not any(layer.prefill_checkpoints for layer in gdn(qwen.shape_for(hardware_preset("a100-80g"))))
    assert all(layer.prefill_checkpoints for layer in gdn(qwen.shape_for(hardware_preset("h100-80g"))))
    # attention layers are untouched
    assert qwen.shape_for(hardware_preset("h200")).layers[3] == qwen.shape.layers[3]


def test_parameter_counts():
    # Exact published totals: Qwen3-Next (safetensors total / active) and Llama-3.1-8B.
    qwen = MODEL_PRESETS["qwen3-next-80b-a3b"]
    assert (qwen.total_params, qwen.active_params) == (79_674_391_296, 3_874_929_408)
    assert MODEL_PRESETS["llama-3.1-8b"].total_params == 8_030_261_248
    # Model cards: Jamba 1.5 Mini 52B / 12B active; Granite-4.0-H-Small 32B / 9B; Falcon-H1-7B 7.59B; Nemotron-H 8B.
    assert MODEL_PRESETS["jamba-1.5-mini"].total_params == pytest.approx(52e9, rel=0.01)
    assert MODEL_PRESETS["jamba-1.5-mini"].active_params == pytest.approx(12e9, rel=0.02)
    assert MODEL_PRESETS["granite-4.0-h-small"].total_params == pytest.approx(32e9, rel=0.01)
    assert MODEL_PRESETS["granite-4.0-h-small"].active_params == pytest.approx(9e9, rel=0.03)
    assert MODEL_PRESETS["falcon-h1-7b"].total_params == pytest.approx(7.59e9, rel=0.005)
    assert MODEL_PRESETS["nemotron-h-8b"].total_params == pytest.approx(8.1e9, rel=0.01)
    for preset in MODEL_PRESETS.values():
        assert preset.weight_bytes == 2 * preset.total_params
        if not preset.num_experts:
            assert preset.active_params == preset.total_params


def test_max_model_len_from_config():
    lens = {name: p.max_model_len for name, p in MODEL_PRESETS.items()}
    assert lens == {
        "nemotron-h-8b": 8192,
        "jamba-1.5-mini": 262144,
        "granite-4.0-h-small": 131072,
        "qwen3-next-80b-a3b": 262144,
        "falcon-h1-7b": 262144,
        "llama-3.1-8b": 131072,
    }


def test_hardware_presets():
    assert set(HARDWARE_PRESETS) == {"a100-80g", "h100-80g", "h200", "l40s"}
    h100 = HARDWARE_PRESETS["h100-80g"]
    assert (h100.memory_bytes, h100.memory_bandwidth, h100.bf16_flops) == (80 * GiB, 3.35e12, 989.5e12)
    assert HARDWARE_PRESETS["l40s"].memory_bandwidth == 864e9


def test_unknown_preset_lists_valid_names():
    with pytest.raises(ValueError, match=r"unknown model preset 'llama'.*valid: nemotron-h-8b, .*llama-3.1-8b"):
        model_preset("llama")
    with pytest.raises(ValueError, match=r"valid: a100-80g, h100-80g, h200, l40s"):
        hardware_preset("b200")


def test_kv_memory_budget_formula():
    m, hw = MODEL_PRESETS["llama-3.1-8b"], HARDWARE_PRESETS["h100-80g"]
    # activation: 8192 tokens * (4*4096 + 2*2*14336) * 2 bytes + 1024 seqs * 128256 * 4 bytes
    act = 8192 * (4 * 4096 + 2 * 2 * 14336) * 2 + 1024 * 128256 * 4
    assert activation_peak_bytes(m, 8192, 1024) == act
    budget = kv_memory_budget(m, hw, gpu_memory_utilization=0.9, max_num_batched_tokens=8192, max_num_seqs=1024)
    assert budget == int(80 * GiB * 0.9) - 2 * 8_030_261_248 - act - NON_TORCH_OVERHEAD_BYTES


def test_kv_memory_budget_model_too_big():
    with pytest.raises(ValueError, match="leaves no KV-cache memory on h100-80g"):
        kv_memory_budget(
            MODEL_PRESETS["qwen3-next-80b-a3b"],
            HARDWARE_PRESETS["h100-80g"],
            max_num_batched_tokens=8192,
            max_num_seqs=1024,
        )


def test_every_model_data_file_is_a_listed_preset_named_as_its_file():
    from sim.config.presets import MODEL_NAMES, PRESET_DATA

    files = sorted(f.stem for f in (PRESET_DATA / "models").glob("*.yaml"))
    assert files == sorted(MODEL_NAMES)
    assert all(MODEL_PRESETS[name].name == name for name in MODEL_NAMES)


def test_an_unknown_architecture_is_refused_naming_the_file(tmp_path):
    from sim.config.presets import load_model_preset

    bad = tmp_path / "m.yaml"
    bad.write_text("name: m\nhf_repo: x/m\narchitecture: MysteryForCausalLM\nconfig: {}\n")
    with pytest.raises(ValueError, match=r"m.yaml: architecture 'MysteryForCausalLM' has no layout rule"):
        load_model_preset(bad)
