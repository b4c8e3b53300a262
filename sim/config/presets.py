"""Model and hardware presets, and the KV-memory budget derived from them.

The numbers are data: ``preset_data/models/<name>.yaml`` holds a model's public Hugging Face ``config.json``
fields under their own names (``preset_data/hardware.yaml`` the GPU datasheet figures, each with its source),
and one builder turns them into presets by the architecture's layout rule (``ARCHITECTURES``). Cache-state shapes
follow vLLM 0.33's ``MambaStateShapeCalculator`` / ``MambaStateDtypeCalculator``
(``vllm/model_executor/layers/mamba/mamba_utils.py``) at tensor-parallel size 1,
no speculative tokens and the default ``mamba_cache_dtype = "auto"`` (the model
dtype, bf16):

* Mamba1 (Jamba): conv ``(d_conv - 1, d_inner)``, SSM ``(d_inner, d_state)``,
  both in the model dtype.
* Mamba2 (Nemotron-H, Granite-4.0-H, Falcon-H1): conv
  ``(d_conv - 1, d_inner + 2 * n_groups * d_state)``, SSM
  ``(n_heads, head_dim, d_state)``. The SSM dtype is the model dtype, except
  for Nemotron-H, whose ``NemotronHForCausalLMConfig`` makes it float32 when
  the HF config does not name one (vLLM ``models/config.py``).
* Gated DeltaNet (Qwen3-Next): conv ``(d_conv - 1, 2 * k_heads * k_dim +
  v_heads * v_dim)``, recurrent ``(v_heads, v_dim, k_dim)``, model dtype.

``prefill_checkpoints`` follows vLLM: ``MambaMixer2.get_kv_cache_spec`` always
declares one checkpoint block; the Qwen GDN layer only when its prefill backend
is FlashInfer, which vLLM picks on Hopper (SM 9.0) only
(``_resolve_gdn_prefill_backend``) -- see :meth:`ModelPreset.shape_for`;
Mamba1 never.

Parameter counts are computed from the same config fields (projection shapes
of each layer type, convolution weights, RMSNorm weights) and checked in the
tests against the published totals (exact for Qwen3-Next; within 1% for the
others, whose small per-layer extras such as biases are not modelled).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Mapping

import yaml

from sim.config.yamlio import did_you_mean
from sim.core.kv.shapes import AttentionLayerShape, LayerShape, MambaLayerShape, ModelShape

BF16 = 2
FP32 = 4
GiB = 1 << 30


# ---------------------------------------------------------------------------
# Per-layer parameter counts (weights only; what a forward pass reads).
# ---------------------------------------------------------------------------


def _attention_params(hidden: int, heads: int, kv_heads: int, head_dim: int, *, q_gate: bool = False) -> int:
    """q/k/v/o projections; ``q_gate`` doubles q (Qwen3-Next ``attn_output_gate``)."""
    q = hidden * heads * head_dim * (2 if q_gate else 1)
    kv = 2 * hidden * kv_heads * head_dim
    o = heads * head_dim * hidden
    return q + kv + o


def _mlp_params(hidden: int, intermediate: int, *, gated: bool) -> int:
    """Gated (SwiGLU: gate, up, down) or plain (up, down) MLP."""
    return (3 if gated else 2) * hidden * intermediate


def _mamba2_params(hidden: int, d_inner: int, n_groups: int, d_state: int, n_heads: int, d_conv: int) -> int:
    """in_proj (z, x, B, C, dt), depthwise conv, A/D/dt_bias, gated norm, out_proj."""
    conv_dim = d_inner + 2 * n_groups * d_state
    in_proj = hidden * (d_inner + conv_dim + n_heads)
    return in_proj + conv_dim * (d_conv + 1) + 3 * n_heads + d_inner + d_inner * hidden


def _mamba1_params(hidden: int, d_inner: int, d_state: int, dt_rank: int, d_conv: int) -> int:
    """in_proj (x, z), conv, x_proj (dt, B, C), dt_proj, A, D, out_proj."""
    return (
        hidden * 2 * d_inner
        + d_inner * (d_conv + 1)
        + d_inner * (dt_rank + 2 * d_state)
        + dt_rank * d_inner
        + d_inner
        + d_inner * d_state
        + d_inner
        + d_inner * hidden
    )


def _gdn_params(hidden: int, k_heads: int, v_heads: int, k_dim: int, v_dim: int, d_conv: int) -> int:
    """in_proj_qkvz, in_proj_ba, conv, A_log/dt_bias, gated norm, out_proj."""
    key, value = k_heads * k_dim, v_heads * v_dim
    conv_dim = 2 * key + value
    return (
        hidden * (2 * key + 2 * value) + hidden * 2 * v_heads + conv_dim * d_conv + 2 * v_heads + v_dim + value * hidden
    )


# ---------------------------------------------------------------------------
# Cache-state shapes (vLLM MambaStateShapeCalculator, TP = 1, no spec tokens).
# ---------------------------------------------------------------------------


def mamba1_layer(d_inner: int, d_state: int, d_conv: int, dtype_bytes: int = BF16) -> MambaLayerShape:
    return MambaLayerShape(
        state_shapes=((d_conv - 1, d_inner), (d_inner, d_state)),
        state_dtype_bytes=(dtype_bytes, dtype_bytes),
        mixer="mamba1",
        prefill_checkpoints=False,
    )


def mamba2_layer(
    d_inner: int,
    n_groups: int,
    n_heads: int,
    head_dim: int,
    d_state: int,
    d_conv: int,
    conv_dtype_bytes: int = BF16,
    ssm_dtype_bytes: int = BF16,
) -> MambaLayerShape:
    return MambaLayerShape(
        state_shapes=((d_conv - 1, d_inner + 2 * n_groups * d_state), (n_heads, head_dim, d_state)),
        state_dtype_bytes=(conv_dtype_bytes, ssm_dtype_bytes),
        mixer="mamba2",
        prefill_checkpoints=True,
    )


def gdn_layer(k_heads: int, v_heads: int, k_dim: int, v_dim: int, d_conv: int, *, checkpoints: bool) -> MambaLayerShape:
    return MambaLayerShape(
        state_shapes=((d_conv - 1, 2 * k_heads * k_dim + v_heads * v_dim), (v_heads, v_dim, k_dim)),
        state_dtype_bytes=(BF16, BF16),
        mixer="gdn",
        prefill_checkpoints=checkpoints,
    )


# ---------------------------------------------------------------------------
# Presets
# ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ModelPreset:
    """A model's cache layout plus what the step-time model needs.

    Param fields are totals over the whole model. ``dense_params`` are the
    linear weights every token multiplies (attention, Mamba/GDN, dense MLP,
    shared experts and routers); ``expert_params`` are all routed-expert
    weights, of which a token uses ``experts_per_token / num_experts``.
    Embedding and LM head are counted apart: the embedding is a row lookup,
    the LM head runs once per scheduled request.
    """

    name: str
    hf_repo: str
    shape: ModelShape
    hidden_size: int
    vocab_size: int
    num_decoder_layers: int
    num_attention_layers: int
    num_mamba_layers: int
    num_mlp_layers: int
    num_moe_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    mlp_intermediate_size: int
    moe_intermediate_size: int
    shared_expert_intermediate_size: int
    num_experts: int
    experts_per_token: int
    embedding_params: int
    lm_head_params: int
    dense_params: int
    expert_params: int
    weight_dtype_bytes: int = BF16
    mlp_gated: bool = True
    """Dense MLP is gated (SwiGLU: fused gate+up, then down); ``False`` for a plain up/down MLP."""

    @property
    def max_model_len(self) -> int:
        return self.shape.max_model_len

    @property
    def total_params(self) -> int:
        return self.embedding_params + self.lm_head_params + self.dense_params + self.expert_params

    @property
    def active_params(self) -> int:
        """Parameters one token uses (embedding row table counted whole, as model cards do)."""
        active_experts = 0
        if self.num_experts:
            active_experts = self.expert_params * self.experts_per_token // self.num_experts
        return self.embedding_params + self.lm_head_params + self.dense_params + active_experts

    @property
    def weight_bytes(self) -> int:
        return self.total_params * self.weight_dtype_bytes

    def shape_for(self, hardware: "HardwarePreset") -> ModelShape:
        """The cache shape on ``hardware``: GDN layers export prefill checkpoints on SM 9.0 only.

        vLLM picks the FlashInfer GDN prefill kernel (which can write a
        mid-chunk state) on Hopper; elsewhere Triton, and prefill is split.
        """
        if hardware.compute_capability != (9, 0):
            return self.shape
        layers = tuple(
            replace(layer, prefill_checkpoints=True)
            if isinstance(layer, MambaLayerShape) and layer.mixer == "gdn"
            else layer
            for layer in self.shape.layers
        )
        return replace(self.shape, layers=layers)


# ---------------------------------------------------------------------------
# The one builder: a model's config.json fields (sim/config/preset_data/models/*.yaml) -> ModelPreset.
# Each architecture's layout rule reads config.json's own field names; no model number lives in code.
# ---------------------------------------------------------------------------

Config = Mapping[str, Any]


def _nemotron_h(name: str, hf_repo: str, c: Config, cache: Config) -> ModelPreset:
    """``NemotronHForCausalLM``: ``hybrid_override_pattern`` lays out Mamba2 (``M``), attention (``*``) and
    MLP (``-``) blocks; the MLP is ungated (``relu2``); one RMSNorm per block plus the final one."""
    pattern = c["hybrid_override_pattern"]
    h, heads, kv, hd = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    m_heads, m_hd, groups = c["mamba_num_heads"], c["mamba_head_dim"], c["n_groups"]
    d_state, d_conv = c["ssm_state_size"], c["conv_kernel"]
    d_inner = m_heads * m_hd
    inter, vocab = c["intermediate_size"], c["vocab_size"]
    ssm_bytes = FP32 if cache.get("mamba_ssm_dtype") == "float32" else BF16
    attn = AttentionLayerShape(num_kv_heads=kv, head_size=hd)
    mamba = mamba2_layer(d_inner, groups, m_heads, m_hd, d_state, d_conv, ssm_dtype_bytes=ssm_bytes)
    layers = tuple(attn if ch == "*" else mamba for ch in pattern if ch in "*M")
    n_attn, n_mamba, n_mlp = pattern.count("*"), pattern.count("M"), pattern.count("-")
    gated = c["mlp_hidden_act"] != "relu2"
    dense = (
        n_attn * _attention_params(h, heads, kv, hd)
        + n_mamba * _mamba2_params(h, d_inner, groups, d_state, m_heads, d_conv)
        + n_mlp * _mlp_params(h, inter, gated=gated)
        + (len(pattern) + 1) * h
    )
    return ModelPreset(
        name=name,
        hf_repo=hf_repo,
        shape=ModelShape(name, layers, max_model_len=c["max_position_embeddings"]),
        hidden_size=h,
        vocab_size=vocab,
        num_decoder_layers=len(pattern),
        num_attention_layers=n_attn,
        num_mamba_layers=n_mamba,
        num_mlp_layers=n_mlp,
        num_moe_layers=0,
        num_attention_heads=heads,
        num_kv_heads=kv,
        head_dim=hd,
        mlp_intermediate_size=inter,
        moe_intermediate_size=0,
        shared_expert_intermediate_size=0,
        num_experts=0,
        experts_per_token=0,
        embedding_params=vocab * h,
        lm_head_params=0 if c["tie_word_embeddings"] else vocab * h,
        dense_params=dense,
        expert_params=0,
        mlp_gated=gated,
    )


def _jamba(name: str, hf_repo: str, c: Config, cache: Config) -> ModelPreset:
    """``JambaForCausalLM``: attention every ``attn_layer_period`` layers at ``attn_layer_offset`` (Mamba1
    elsewhere), MoE every ``expert_layer_period`` at ``expert_layer_offset`` (dense SwiGLU MLP elsewhere);
    head_dim = hidden / heads; two RMSNorms per layer plus the final one."""
    h, n, heads, kv = c["hidden_size"], c["num_hidden_layers"], c["num_attention_heads"], c["num_key_value_heads"]
    hd = h // heads
    inter, experts, topk = c["intermediate_size"], c["num_experts"], c["num_experts_per_tok"]
    d_state, d_conv, d_inner = c["mamba_d_state"], c["mamba_d_conv"], c["mamba_expand"] * h
    dt_rank, vocab = c["mamba_dt_rank"], c["vocab_size"]
    attn = AttentionLayerShape(num_kv_heads=kv, head_size=hd)
    mamba = mamba1_layer(d_inner, d_state, d_conv)
    is_attn = [i % c["attn_layer_period"] == c["attn_layer_offset"] for i in range(n)]
    is_moe = [i % c["expert_layer_period"] == c["expert_layer_offset"] for i in range(n)]
    layers = tuple(attn if a else mamba for a in is_attn)
    n_attn, n_moe = sum(is_attn), sum(is_moe)
    n_mamba, n_mlp = n - n_attn, n - n_moe
    dense = (
        n_attn * _attention_params(h, heads, kv, hd)
        + n_mamba * _mamba1_params(h, d_inner, d_state, dt_rank, d_conv)
        + n_mlp * _mlp_params(h, inter, gated=True)
        + n_moe * h * experts  # router
        + (2 * n + 1) * h
    )
    return ModelPreset(
        name=name,
        hf_repo=hf_repo,
        shape=ModelShape(name, layers, max_model_len=c["max_position_embeddings"]),
        hidden_size=h,
        vocab_size=vocab,
        num_decoder_layers=n,
        num_attention_layers=n_attn,
        num_mamba_layers=n_mamba,
        num_mlp_layers=n_mlp,
        num_moe_layers=n_moe,
        num_attention_heads=heads,
        num_kv_heads=kv,
        head_dim=hd,
        mlp_intermediate_size=inter,
        moe_intermediate_size=inter,
        shared_expert_intermediate_size=0,
        num_experts=experts,
        experts_per_token=topk,
        embedding_params=vocab * h,
        lm_head_params=0 if c["tie_word_embeddings"] else vocab * h,
        dense_params=dense,
        expert_params=n_moe * experts * _mlp_params(h, inter, gated=True),
    )


def _granite_moe_hybrid(name: str, hf_repo: str, c: Config, cache: Config) -> ModelPreset:
    """``GraniteMoeHybridForCausalLM``: ``layer_types`` lays out Mamba2 and attention; every layer has a MoE
    block (``num_local_experts`` SwiGLU experts of ``intermediate_size``) with a shared expert and a router."""
    h, heads, kv = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"]
    hd = h // heads
    m_heads, m_hd, groups = c["mamba_n_heads"], c["mamba_d_head"], c["mamba_n_groups"]
    d_state, d_conv, d_inner = c["mamba_d_state"], c["mamba_d_conv"], c["mamba_expand"] * h
    experts, topk, e_inter = c["num_local_experts"], c["num_experts_per_tok"], c["intermediate_size"]
    shared, vocab = c["shared_intermediate_size"], c["vocab_size"]
    types = list(c["layer_types"])
    n = len(types)
    attn = AttentionLayerShape(num_kv_heads=kv, head_size=hd)
    mamba = mamba2_layer(d_inner, groups, m_heads, m_hd, d_state, d_conv)
    layers = tuple(attn if t == "attention" else mamba for t in types)
    n_attn = types.count("attention")
    n_mamba = n - n_attn
    dense = (
        n_attn * _attention_params(h, heads, kv, hd)
        + n_mamba * _mamba2_params(h, d_inner, groups, d_state, m_heads, d_conv)
        + n * (_mlp_params(h, shared, gated=True) + h * experts)
        + (2 * n + 1) * h
    )
    return ModelPreset(
        name=name,
        hf_repo=hf_repo,
        shape=ModelShape(name, layers, max_model_len=c["max_position_embeddings"]),
        hidden_size=h,
        vocab_size=vocab,
        num_decoder_layers=n,
        num_attention_layers=n_attn,
        num_mamba_layers=n_mamba,
        num_mlp_layers=0,
        num_moe_layers=n,
        num_attention_heads=heads,
        num_kv_heads=kv,
        head_dim=hd,
        mlp_intermediate_size=0,
        moe_intermediate_size=e_inter,
        shared_expert_intermediate_size=shared,
        num_experts=experts,
        experts_per_token=topk,
        embedding_params=vocab * h,
        lm_head_params=0 if c["tie_word_embeddings"] else vocab * h,
        dense_params=dense,
        expert_params=n * experts * _mlp_params(h, e_inter, gated=True),
    )


def _qwen3_next(name: str, hf_repo: str, c: Config, cache: Config) -> ModelPreset:
    """``Qwen3NextForCausalLM``: full attention every ``full_attention_interval``-th layer (gated q when
    ``attn_output_gate``, with q/k norms), Gated DeltaNet elsewhere; every layer MoE (``decoder_sparse_step``
    1, no ``mlp_only_layers``) with a gated shared expert and a router."""
    if c["decoder_sparse_step"] != 1 or c["mlp_only_layers"]:
        raise ValueError(f"preset {name}: only every-layer MoE (decoder_sparse_step 1, no mlp_only_layers) is modelled")
    h, n, heads, kv, hd = (
        c["hidden_size"],
        c["num_hidden_layers"],
        c["num_attention_heads"],
        c["num_key_value_heads"],
        c["head_dim"],
    )
    k_heads, v_heads = c["linear_num_key_heads"], c["linear_num_value_heads"]
    k_dim, v_dim, d_conv = c["linear_key_head_dim"], c["linear_value_head_dim"], c["linear_conv_kernel_dim"]
    experts, topk, e_inter = c["num_experts"], c["num_experts_per_tok"], c["moe_intermediate_size"]
    shared, vocab = c["shared_expert_intermediate_size"], c["vocab_size"]
    attn = AttentionLayerShape(num_kv_heads=kv, head_size=hd)
    gdn = gdn_layer(k_heads, v_heads, k_dim, v_dim, d_conv, checkpoints=False)
    is_attn = [(i + 1) % c["full_attention_interval"] == 0 for i in range(n)]
    layers = tuple(attn if a else gdn for a in is_attn)
    n_attn = sum(is_attn)
    n_gdn = n - n_attn
    dense = (
        n_attn * _attention_params(h, heads, kv, hd, q_gate=bool(c["attn_output_gate"]))
        + n_gdn * _gdn_params(h, k_heads, v_heads, k_dim, v_dim, d_conv)
        + n * (_mlp_params(h, shared, gated=True) + h * experts + h)  # shared expert, router, shared gate
        + n_attn * 2 * hd  # q_norm, k_norm
        + (2 * n + 1) * h
    )
    return ModelPreset(
        name=name,
        hf_repo=hf_repo,
        shape=ModelShape(name, layers, max_model_len=c["max_position_embeddings"]),
        hidden_size=h,
        vocab_size=vocab,
        num_decoder_layers=n,
        num_attention_layers=n_attn,
        num_mamba_layers=n_gdn,
        num_mlp_layers=0,
        num_moe_layers=n,
        num_attention_heads=heads,
        num_kv_heads=kv,
        head_dim=hd,
        mlp_intermediate_size=0,
        moe_intermediate_size=e_inter,
        shared_expert_intermediate_size=shared,
        num_experts=experts,
        experts_per_token=topk,
        embedding_params=vocab * h,
        lm_head_params=0 if c["tie_word_embeddings"] else vocab * h,
        dense_params=dense,
        expert_params=n * experts * _mlp_params(h, e_inter, gated=True),
    )


def _falcon_h1(name: str, hf_repo: str, c: Config, cache: Config) -> ModelPreset:
    """``FalconH1ForCausalLM``: every layer runs attention and a Mamba2 mixer side by side; as in vLLM each
    contributes its own cache layer (``self_attn.attn`` and ``mamba``), so the shape has both per layer."""
    h, n, heads, kv, hd = (
        c["hidden_size"],
        c["num_hidden_layers"],
        c["num_attention_heads"],
        c["num_key_value_heads"],
        c["head_dim"],
    )
    d_inner, m_heads, m_hd, groups = c["mamba_d_ssm"], c["mamba_n_heads"], c["mamba_d_head"], c["mamba_n_groups"]
    d_state, d_conv = c["mamba_d_state"], c["mamba_d_conv"]
    inter, vocab = c["intermediate_size"], c["vocab_size"]
    attn = AttentionLayerShape(num_kv_heads=kv, head_size=hd)
    mamba = mamba2_layer(d_inner, groups, m_heads, m_hd, d_state, d_conv)
    layers: tuple[LayerShape, ...] = tuple(x for _ in range(n) for x in (attn, mamba))
    per_layer = (
        _attention_params(h, heads, kv, hd)
        + _mamba2_params(h, d_inner, groups, d_state, m_heads, d_conv)
        + _mlp_params(h, inter, gated=True)
        + 2 * h
    )
    return ModelPreset(
        name=name,
        hf_repo=hf_repo,
        shape=ModelShape(name, layers, max_model_len=c["max_position_embeddings"]),
        hidden_size=h,
        vocab_size=vocab,
        num_decoder_layers=n,
        num_attention_layers=n,
        num_mamba_layers=n,
        num_mlp_layers=n,
        num_moe_layers=0,
        num_attention_heads=heads,
        num_kv_heads=kv,
        head_dim=hd,
        mlp_intermediate_size=inter,
        moe_intermediate_size=0,
        shared_expert_intermediate_size=0,
        num_experts=0,
        experts_per_token=0,
        embedding_params=vocab * h,
        lm_head_params=0 if c["tie_word_embeddings"] else vocab * h,
        dense_params=n * per_layer + h,
        expert_params=0,
    )


def _llama(name: str, hf_repo: str, c: Config, cache: Config) -> ModelPreset:
    """``LlamaForCausalLM``: a plain transformer (see :func:`dense_transformer_preset`)."""
    if c["tie_word_embeddings"]:
        raise ValueError(f"preset {name}: a tied LM head is not modelled for LlamaForCausalLM")
    return dense_transformer_preset(
        name,
        hf_repo=hf_repo,
        hidden=c["hidden_size"],
        layers=c["num_hidden_layers"],
        heads=c["num_attention_heads"],
        kv_heads=c["num_key_value_heads"],
        intermediate=c["intermediate_size"],
        vocab=c["vocab_size"],
        max_model_len=c["max_position_embeddings"],
        gated=c["hidden_act"] == "silu",
    )


#: Layout rules per Hugging Face ``architectures`` name.
ARCHITECTURES: dict[str, Callable[[str, str, Config, Config], ModelPreset]] = {
    "NemotronHForCausalLM": _nemotron_h,
    "JambaForCausalLM": _jamba,
    "GraniteMoeHybridForCausalLM": _granite_moe_hybrid,
    "Qwen3NextForCausalLM": _qwen3_next,
    "FalconH1ForCausalLM": _falcon_h1,
    "LlamaForCausalLM": _llama,
}


def dense_transformer_preset(
    name: str,
    *,
    hf_repo: str,
    hidden: int,
    layers: int,
    heads: int,
    kv_heads: int,
    intermediate: int,
    vocab: int,
    max_model_len: int,
    gated: bool = True,
) -> ModelPreset:
    """A plain transformer (every layer full attention + MLP, untied LM head): Llama-style presets and
    the shapes of a Vidur profile (``sim.timing.profiles``)."""
    hd = hidden // heads
    attn = AttentionLayerShape(num_kv_heads=kv_heads, head_size=hd)
    per_layer = _attention_params(hidden, heads, kv_heads, hd) + _mlp_params(hidden, intermediate, gated=gated)
    return ModelPreset(
        name=name,
        hf_repo=hf_repo,
        shape=ModelShape(name, (attn,) * layers, max_model_len=max_model_len),
        hidden_size=hidden,
        vocab_size=vocab,
        num_decoder_layers=layers,
        num_attention_layers=layers,
        num_mamba_layers=0,
        num_mlp_layers=layers,
        num_moe_layers=0,
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=hd,
        mlp_intermediate_size=intermediate,
        moe_intermediate_size=0,
        shared_expert_intermediate_size=0,
        num_experts=0,
        experts_per_token=0,
        embedding_params=vocab * hidden,
        lm_head_params=vocab * hidden,
        dense_params=layers * (per_layer + 2 * hidden) + hidden,
        expert_params=0,
        mlp_gated=gated,
    )


@dataclass(frozen=True, slots=True)
class HardwarePreset:
    """One GPU: memory capacity (bytes), HBM bandwidth (bytes/s), dense bf16 tensor FLOP/s, SM count.

    ``sm_count`` (streaming multiprocessors) sizes a kernel's waves of thread
    blocks in the step-time model (the decode-attention wave term); 0 means
    unknown, and that term is off.
    """

    name: str
    memory_bytes: int
    memory_bandwidth: float
    bf16_flops: float
    compute_capability: tuple[int, int]
    source: str
    sm_count: int = 0


#: Where the preset data files live (package data).
PRESET_DATA = Path(__file__).resolve().parent / "preset_data"


def _read_yaml(path: Path) -> Any:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    with path.open(encoding="utf-8") as f:
        return yaml.load(f, Loader=loader)


def load_model_preset(path: Path) -> ModelPreset:
    """One model data file -> :class:`ModelPreset`, by its ``architecture``'s layout rule."""
    data = _read_yaml(path)
    arch = data["architecture"]
    if arch not in ARCHITECTURES:
        raise ValueError(f"{path}: architecture {arch!r} has no layout rule (known: {', '.join(ARCHITECTURES)})")
    return ARCHITECTURES[arch](data["name"], data["hf_repo"], data["config"], data.get("cache") or {})


def load_hardware_presets(path: Path) -> list[HardwarePreset]:
    """The GPU data file -> presets (capacity in ``memory_gib`` or decimal ``memory_gb``)."""
    out = []
    for item in _read_yaml(path):
        memory = item["memory_gib"] * GiB if "memory_gib" in item else item["memory_gb"] * 10**9
        out.append(
            HardwarePreset(
                item["name"],
                int(memory),
                float(item["memory_bandwidth"]),
                float(item["bf16_flops"]),
                (int(item["compute_capability"][0]), int(item["compute_capability"][1])),
                item["source"],
                int(item.get("sm_count", 0)),
            )
        )
    return out


#: The bundled models, in the order users see them (hybrids first, the pure-attention baseline last); one
#: data file each, ``preset_data/models/<name>.yaml``.
MODEL_NAMES: tuple[str, ...] = (
    "nemotron-h-8b",
    "jamba-1.5-mini",
    "granite-4.0-h-small",
    "qwen3-next-80b-a3b",
    "falcon-h1-7b",
    "llama-3.1-8b",
)

#: The bundled model presets, by name.
MODEL_PRESETS: dict[str, ModelPreset] = {
    name: load_model_preset(PRESET_DATA / "models" / f"{name}.yaml") for name in MODEL_NAMES
}

#: The bundled GPU presets, by name.
HARDWARE_PRESETS: dict[str, HardwarePreset] = {h.name: h for h in load_hardware_presets(PRESET_DATA / "hardware.yaml")}

DEFAULT_GPU_MEMORY_UTILIZATION = 0.92
"""vLLM 0.33 ``CacheConfig.gpu_memory_utilization`` default."""

NON_TORCH_OVERHEAD_BYTES = int(1.5 * GiB)
"""Our estimate of memory vLLM's profiler sees outside the weights and the
activation peak: CUDA context and cuBLAS/NCCL workspaces (~1 GiB) and the
CUDA-graph pool (~0.5 GiB)."""


def _preset(table: dict, name: str, what: str):
    try:
        return table[name]
    except KeyError:
        raise ValueError(
            f"unknown {what} preset {name!r}{did_you_mean(name, table)} (valid: {', '.join(table)})"
        ) from None


def model_preset(name: str) -> ModelPreset:
    """The named preset; ``ValueError`` with a did-you-mean and the valid names otherwise."""
    return _preset(MODEL_PRESETS, name, "model")


def hardware_preset(name: str) -> HardwarePreset:
    """The named preset; ``ValueError`` with a did-you-mean and the valid names otherwise."""
    return _preset(HARDWARE_PRESETS, name, "hardware")


def activation_peak_bytes(model: ModelPreset, max_num_batched_tokens: int, max_num_seqs: int) -> int:
    """Our estimate of the peak of vLLM's profiling forward pass.

    vLLM measures this by running one dummy batch of ``max_num_batched_tokens``
    tokens and a sampler pass over ``max_num_seqs`` rows. We estimate it as
    ``max_num_batched_tokens * (4 * hidden + 2 * widest intermediate) * 2``
    bytes (residual, normed input, and the widest projection output, bf16;
    activations of one layer are live at a time) plus ``max_num_seqs *
    vocab * 4`` bytes of float32 logits.
    """
    widest = max(
        (model.num_attention_heads + 2 * model.num_kv_heads) * model.head_dim,
        2 * model.mlp_intermediate_size,
        2 * (model.experts_per_token * model.moe_intermediate_size + model.shared_expert_intermediate_size),
        4 * model.hidden_size if model.num_mamba_layers else 0,
    )
    per_token = (4 * model.hidden_size + 2 * widest) * BF16
    return max_num_batched_tokens * per_token + max_num_seqs * model.vocab_size * FP32


def kv_memory_budget(
    model: ModelPreset,
    hardware: HardwarePreset,
    *,
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION,
    max_num_batched_tokens: int,
    max_num_seqs: int,
) -> int:
    """Bytes left for the KV cache, roughly as vLLM's ``determine_available_memory``:

    ``memory * gpu_memory_utilization - weights - activation peak - non-torch overhead``
    (see :func:`activation_peak_bytes` and :data:`NON_TORCH_OVERHEAD_BYTES`).
    Raises ``ValueError`` when nothing is left (the model does not fit).
    """
    if not 0 < gpu_memory_utilization <= 1:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
    usable = int(hardware.memory_bytes * gpu_memory_utilization)
    budget = (
        usable
        - model.weight_bytes
        - activation_peak_bytes(model, max_num_batched_tokens, max_num_seqs)
        - NON_TORCH_OVERHEAD_BYTES
    )
    if budget <= 0:
        raise ValueError(
            f"model {model.name} ({model.weight_bytes / GiB:.1f} GiB of weights) leaves no KV-cache memory on "
            f"{hardware.name} at gpu_memory_utilization {gpu_memory_utilization} "
            f"({usable / GiB:.1f} GiB usable)"
        )
    return budget
