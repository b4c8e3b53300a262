"""A synthetic profile in Vidur's CSV layout, generated from the step-time model with known parameters."""

from dataclasses import replace
from pathlib import Path

import pandas as pd

from sim.config.presets import hardware_preset
from sim.engine.timing import StepTimeModel, TimingParams, model_gemms
from sim.timing.profiles import MLP_OPS, Profile

LAYERS = 4
SHAPE = {
    "n_head": 8,
    "n_kv_head": 2,
    "n_embd": 1024,
    "n_expanded_embd": 4096,
    "vocab_size": 32000,
    "use_gated_mlp": True,
}
TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 136, 192, 200, 256, 272, 320, 512, 1024, 1040, 1088, 2048, 4096)
# 2 KV heads, 108 SMs x 2 blocks: batches above 108 take 2 (128, 200) and 3 (256) waves of decode blocks
DECODES = [(b, c) for b in (1, 4, 16, 64, 128, 200, 256) for c in (512, 2048)]
PREFILLS = [(n, c) for n in (256, 1024, 4096) for c in (0, n)]

TRUE = replace(
    TimingParams(),
    compute_efficiency=0.5,
    memory_efficiency=0.7,
    kernel_floor_s=8e-6,
    transition_k=3.0,
    gemm_row_tile=128,
    elementwise_memory_efficiency=0.4,
    small_op_floor_s=5e-6,
    attn_decode_memory_efficiency=0.6,
    attn_floor_s=3e-5,
    attn_decode_ctas_per_sm=2,
    attn_decode_cta_bandwidth=8e9,
    attn_prefill_efficiency=0.45,
    attn_context_efficiency=0.35,
    attn_prefill_token_s=8e-8,
)


def _model_of_shape():
    # The model the loader derives from SHAPE (built the same way) is what generates the times.
    frame = pd.DataFrame([{**SHAPE, "num_tokens": 1}]).set_index("num_tokens")
    return Profile(Path("."), frame, None, 1024, 8, 2, 4096, 32000, True).model(LAYERS)


def write_synthetic_profile(root: Path, params: TimingParams = TRUE, *, attention: bool = True) -> Path:
    """Write ``root/mlp.csv`` (+ ``attention.csv``) whose medians are the model's own predictions."""
    root.mkdir(parents=True, exist_ok=True)
    st = StepTimeModel(_model_of_shape(), hardware_preset("a100-80g"), params)
    qkv, o = model_gemms(st.model)["attn_proj"]
    up, down = model_gemms(st.model)["mlp"]
    rows = []
    for t in TOKENS:
        row = {**SHAPE, "num_tokens": t, "num_tensor_parallel_workers": 1}
        for op in MLP_OPS + ("emb",):
            row[f"time_stats.{op}.median"] = 0.0
        for op, g in (("attn_pre_proj", qkv), ("attn_post_proj", o), ("mlp_up_proj", up), ("mlp_down_proj", down)):
            row[f"time_stats.{op}.median"] = st.gemm_time(g, t) * 1e3
        row["time_stats.input_layernorm.median"] = st.small_ops_time(t) / LAYERS * 1e3
        rows.append(row)
    rows.append({**rows[-1], "num_tensor_parallel_workers": 2, "time_stats.mlp_up_proj.median": 1e6})  # ignored
    pd.DataFrame(rows).to_csv(root / "mlp.csv", index=False)
    if attention:
        att = []
        for b, c in DECODES:
            att.append(
                {
                    "batch_size": b,
                    "prefill_chunk_size": 0,
                    "kv_cache_size": c,
                    "is_prefill": False,
                    "time_stats.attn_kv_cache_save.median": 0.0,
                    "time_stats.attn_prefill.median": 0.0,
                    "time_stats.attn_decode.median": st.attention_decode_time(b, b * c) * 1e3,
                    "num_tensor_parallel_workers": 1,
                }
            )
        for n, c in PREFILLS:
            att.append(
                {
                    "batch_size": 1,
                    "prefill_chunk_size": n,
                    "kv_cache_size": c,
                    "is_prefill": True,
                    "time_stats.attn_kv_cache_save.median": 0.0,
                    "time_stats.attn_prefill.median": st.attention_prefill_time(n, c, n * c, n * (n + 1) / 2) * 1e3,
                    "time_stats.attn_decode.median": 0.0,
                    "num_tensor_parallel_workers": 1,
                }
            )
        pd.DataFrame(att).to_csv(root / "attention.csv", index=False)
    return root
