"""Spec derivation: grouping, hybrid page-size unification, pool size, validation."""

from __future__ import annotations

import pytest

from sim.core.kv.shapes import AttentionLayerShape, MambaLayerShape, ModelShape
from sim.core.kv.specs import (
    FullAttentionSpec,
    MambaSpec,
    SlidingWindowSpec,
    align_hybrid_block_size,
    kv_cache_config_from_groups,
    kv_cache_config_from_model,
)

ATTN = AttentionLayerShape(num_kv_heads=8, head_size=128)  # 4096 bytes per token (bf16)
# Nemotron-H 8B Mamba2 mixer: d_inner = 128 heads * 64 = 8192, n_groups 8, d_state 128, conv kernel 4.
# conv (8192 + 2*8*128, 3) in bf16; ssm (128, 64, 128) in fp32 (vLLM's NemotronH default).
NEMOTRON_MAMBA = MambaLayerShape(state_shapes=((10240, 3), (128, 64, 128)), state_dtype_bytes=(2, 4))


def _model(n_mamba: int, n_attn: int) -> ModelShape:
    ratio = n_mamba // n_attn
    layers = []
    for _ in range(n_attn):
        layers += [NEMOTRON_MAMBA] * ratio + [ATTN]
    return ModelShape("test", tuple(layers), max_model_len=8192)


def test_mamba_state_bytes_and_raised_attention_block():
    assert NEMOTRON_MAMBA.state_bytes == 10240 * 3 * 2 + 128 * 64 * 128 * 4 == 4_255_744
    # 16 * cdiv(4255744, 16 * 4096) = 16 * 65
    assert align_hybrid_block_size(16, 4096, NEMOTRON_MAMBA.state_bytes) == 1040
    cfg = kv_cache_config_from_model(_model(24, 4), num_blocks=100)
    assert cfg.block_sizes == (1040,) * 7
    assert cfg.scheduler_block_size == cfg.hash_block_size == 1040
    # Groups follow the first appearance of each spec: the model starts with Mamba layers.
    fa = cfg.groups[-1].spec
    assert isinstance(fa, FullAttentionSpec) and fa.page_size_bytes == 1040 * 4096
    assert all(g.spec == MambaSpec(1040, "align", True, 1040 * 4096) for g in cfg.groups[:-1])


def test_grouping_36_mamba_12_attention():
    cfg = kv_cache_config_from_model(_model(36, 12), num_blocks=50)
    kinds = [g.spec.kind for g in cfg.groups]
    assert kinds.count("full_attention") == 1 and kinds.count("mamba") == 3
    assert [len(g.layer_ids) for g in cfg.groups] == [12, 12, 12, 12]
    mamba_ids = [i for i, layer in enumerate(_model(36, 12).layers) if isinstance(layer, MambaLayerShape)]
    # layers[i::3] to group i (vLLM keeps pipeline stages balanced this way)
    assert cfg.groups[0].layer_ids == tuple(mamba_ids[0::3])
    assert cfg.groups[2].layer_ids == tuple(mamba_ids[2::3])


def test_num_blocks_from_memory_budget():
    cfg = kv_cache_config_from_model(_model(24, 4), kv_memory_bytes=10 * 2**30)
    assert cfg.bytes_per_block == 4 * 1040 * 4096
    assert cfg.num_blocks == 10 * 2**30 // (4 * 1040 * 4096) == 630
    with pytest.raises(ValueError, match="num_blocks or kv_memory_bytes"):
        kv_cache_config_from_model(_model(24, 4))


def test_prefix_caching_off_uses_none_mode_and_max_model_len_blocks():
    cfg = kv_cache_config_from_model(_model(24, 4), num_blocks=10, enable_prefix_caching=False)
    assert cfg.groups[0].spec.mamba_cache_mode == "none" and cfg.groups[0].spec.block_size == 8192
    assert cfg.groups[-1].spec.block_size == 1040
    with pytest.raises(ValueError, match="contradicts"):
        kv_cache_config_from_model(_model(24, 4), num_blocks=10, enable_prefix_caching=False, mamba_cache_mode="align")


def test_pure_attention_single_group():
    model = ModelShape("dense", (ATTN,) * 32, max_model_len=4096)
    cfg = kv_cache_config_from_model(model, kv_memory_bytes=2**30)
    assert len(cfg.groups) == 1 and cfg.block_sizes == (16,)
    assert cfg.num_blocks == 2**30 // (32 * 16 * 4096)


def test_explicit_groups_and_validation():
    cfg = kv_cache_config_from_groups(
        ["full_attention", {"type": "sliding_window", "window": 64}, {"type": "mamba", "prefill_checkpoints": True}],
        block_size=16,
        num_blocks=100,
        retention_interval=32,
    )
    assert [g.spec for g in cfg.groups] == [
        FullAttentionSpec(16),
        SlidingWindowSpec(16, 64),
        MambaSpec(16, "align", True),
    ]
    assert cfg.scheduler_block_size == cfg.hash_block_size == 16
    with pytest.raises(ValueError, match=r"multiple of the scheduler block size \(16\)"):
        kv_cache_config_from_groups(["full_attention", "mamba"], block_size=16, num_blocks=10, retention_interval=24)
    with pytest.raises(ValueError, match="no sliding-window or Mamba group"):
        kv_cache_config_from_groups(["full_attention"], block_size=16, num_blocks=10, retention_interval=32)
    kv_cache_config_from_groups(["full_attention"], block_size=16, num_blocks=10, retention_interval=0)
    with pytest.raises(ValueError, match=r"cache.groups\[1\]: type must be one of"):
        kv_cache_config_from_groups(["full_attention", "linear"], block_size=16, num_blocks=10)
    with pytest.raises(ValueError, match=r"cache.groups\[0\]: sliding_window needs a positive integer 'window'"):
        kv_cache_config_from_groups([{"type": "sliding_window"}], block_size=16, num_blocks=10)
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['window'\]"):
        kv_cache_config_from_groups([{"type": "mamba", "window": 3}], block_size=16, num_blocks=10)
