"""Model and hardware presets, and the KV-memory budget derived from them.

Every model number below comes from the model's public Hugging Face
``config.json``; the comment next to it names the field. Cache-state shapes
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


def _nemotron_h_8b() -> ModelPreset:
    """nvidia/Nemotron-H-8B-Base-8K, ``NemotronHForCausalLM``.

    config.json: hidden_size 4096; num_hidden_layers 52;
    hybrid_override_pattern "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-"
    (M = Mamba2 mixer, * = attention, - = MLP: 24 / 4 / 24);
    num_attention_heads 32; num_key_value_heads 8; head_dim 128;
    mamba_num_heads 128; mamba_head_dim 64 (d_inner = 8192); n_groups 8;
    ssm_state_size 128; conv_kernel 4; intermediate_size 21504 with
    mlp_hidden_act relu2 (ungated); vocab_size 131072; tie_word_embeddings
    false; max_position_embeddings 8192. SSM state float32 (vLLM's NemotronH
    default ``mamba_ssm_cache_dtype``).
    """
    pattern = "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-"
    h, heads, kv, hd = 4096, 32, 8, 128
    m_heads, m_hd, groups, d_state, d_conv = 128, 64, 8, 128, 4
    d_inner = m_heads * m_hd
    inter, vocab = 21504, 131072
    attn = AttentionLayerShape(num_kv_heads=kv, head_size=hd)
    mamba = mamba2_layer(d_inner, groups, m_heads, m_hd, d_state, d_conv, ssm_dtype_bytes=FP32)
    layers = tuple(attn if c == "*" else mamba for c in pattern if c in "*M")
    n_attn, n_mamba, n_mlp = pattern.count("*"), pattern.count("M"), pattern.count("-")
    dense = (
        n_attn * _attention_params(h, heads, kv, hd)
        + n_mamba * _mamba2_params(h, d_inner, groups, d_state, m_heads, d_conv)
        + n_mlp * _mlp_params(h, inter, gated=False)
        + (len(pattern) + 1) * h  # one RMSNorm per block, final norm
    )
    return ModelPreset(
        name="nemotron-h-8b",
        hf_repo="nvidia/Nemotron-H-8B-Base-8K",
        shape=ModelShape("nemotron-h-8b", layers, max_model_len=8192),
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
        lm_head_params=vocab * h,
        dense_params=dense,
        expert_params=0,
        mlp_gated=False,
    )


def _jamba_15_mini() -> ModelPreset:
    """ai21labs/AI21-Jamba-1.5-Mini, ``JambaForCausalLM`` (Mamba1 + MoE).

    config.json: hidden_size 4096; num_hidden_layers 32; attn_layer_period 8,
    attn_layer_offset 4 (attention at 4, 12, 20, 28; Mamba1 elsewhere);
    expert_layer_period 2, expert_layer_offset 1 (MoE at odd layers, dense
    MLP at even); num_attention_heads 32; num_key_value_heads 8 (head_dim =
    4096 / 32 = 128); intermediate_size 14336 (SwiGLU, experts and dense);
    num_experts 16; num_experts_per_tok 2; mamba_d_state 16; mamba_d_conv 4;
    mamba_expand 2 (d_inner 8192); mamba_dt_rank 256; vocab_size 65536;
    tie_word_embeddings false; max_position_embeddings 262144.
    """
    h, n, heads, kv = 4096, 32, 32, 8
    hd = h // heads
    inter, experts, topk = 14336, 16, 2
    d_state, d_conv, d_inner, dt_rank, vocab = 16, 4, 2 * h, 256, 65536
    attn = AttentionLayerShape(num_kv_heads=kv, head_size=hd)
    mamba = mamba1_layer(d_inner, d_state, d_conv)
    is_attn = [i % 8 == 4 for i in range(n)]
    is_moe = [i % 2 == 1 for i in range(n)]
    layers = tuple(attn if a else mamba for a in is_attn)
    n_attn, n_moe = sum(is_attn), sum(is_moe)
    n_mamba, n_mlp = n - n_attn, n - n_moe
    expert_one = _mlp_params(h, inter, gated=True)
    dense = (
        n_attn * _attention_params(h, heads, kv, hd)
        + n_mamba * _mamba1_params(h, d_inner, d_state, dt_rank, d_conv)
        + n_mlp * _mlp_params(h, inter, gated=True)
        + n_moe * h * experts  # router
        + (2 * n + 1) * h  # two RMSNorms per layer, final norm
    )
    return ModelPreset(
        name="jamba-1.5-mini",
        hf_repo="ai21labs/AI21-Jamba-1.5-Mini",
        shape=ModelShape("jamba-1.5-mini", layers, max_model_len=262144),
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
        lm_head_params=vocab * h,
        dense_params=dense,
        expert_params=n_moe * experts * expert_one,
    )


def _granite_40_h_small() -> ModelPreset:
    """ibm-granite/granite-4.0-h-small, ``GraniteMoeHybridForCausalLM`` (Mamba2 + MoE).

    config.json: hidden_size 4096; num_hidden_layers 40; layer_types: 36
    "mamba", 4 "attention" (at 5, 15, 25, 35); num_attention_heads 32;
    num_key_value_heads 8 (head_dim 128); mamba_n_heads 128; mamba_d_head 64;
    mamba_n_groups 1; mamba_d_state 128; mamba_d_conv 4; mamba_expand 2
    (d_inner 8192); every layer has a MoE block: num_local_experts 72,
    num_experts_per_tok 10, intermediate_size 768 (per expert, SwiGLU),
    shared_intermediate_size 1536; vocab_size 100352; tie_word_embeddings
    true; max_position_embeddings 131072.
    """
    h, n, heads, kv, hd = 4096, 40, 32, 8, 128
    m_heads, m_hd, groups, d_state, d_conv = 128, 64, 1, 128, 4
    d_inner = 2 * h
    experts, topk, e_inter, shared, vocab = 72, 10, 768, 1536, 100352
    attn_at = {5, 15, 25, 35}
    attn = AttentionLayerShape(num_kv_heads=kv, head_size=hd)
    mamba = mamba2_layer(d_inner, groups, m_heads, m_hd, d_state, d_conv)
    layers = tuple(attn if i in attn_at else mamba for i in range(n))
    n_attn = len(attn_at)
    n_mamba = n - n_attn
    dense = (
        n_attn * _attention_params(h, heads, kv, hd)
        + n_mamba * _mamba2_params(h, d_inner, groups, d_state, m_heads, d_conv)
        + n * (_mlp_params(h, shared, gated=True) + h * experts)
        + (2 * n + 1) * h  # two RMSNorms per layer, final norm
    )
    return ModelPreset(
        name="granite-4.0-h-small",
        hf_repo="ibm-granite/granite-4.0-h-small",
        shape=ModelShape("granite-4.0-h-small", layers, max_model_len=131072),
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
        lm_head_params=0,
        dense_params=dense,
        expert_params=n * experts * _mlp_params(h, e_inter, gated=True),
    )


def _qwen3_next_80b_a3b() -> ModelPreset:
    """Qwen/Qwen3-Next-80B-A3B-Instruct, ``Qwen3NextForCausalLM`` (GDN + gated attention, MoE).

    config.json: hidden_size 2048; num_hidden_layers 48; full_attention_interval
    4 (layers 3, 7, ..., 47 full attention; the other 36 Gated DeltaNet);
    num_attention_heads 16; num_key_value_heads 2; head_dim 256;
    attn_output_gate true; linear_num_key_heads 16; linear_num_value_heads 32;
    linear_key_head_dim 128; linear_value_head_dim 128; linear_conv_kernel_dim
    4; num_experts 512; num_experts_per_tok 10; moe_intermediate_size 512;
    shared_expert_intermediate_size 512 (with a sigmoid shared-expert gate);
    decoder_sparse_step 1, mlp_only_layers [] (every layer MoE); vocab_size
    151936; tie_word_embeddings false; max_position_embeddings 262144.
    """
    h, n, heads, kv, hd = 2048, 48, 16, 2, 256
    k_heads, v_heads, k_dim, v_dim, d_conv = 16, 32, 128, 128, 4
    experts, topk, e_inter, shared, vocab = 512, 10, 512, 512, 151936
    attn = AttentionLayerShape(num_kv_heads=kv, head_size=hd)
    gdn = gdn_layer(k_heads, v_heads, k_dim, v_dim, d_conv, checkpoints=False)
    is_attn = [(i + 1) % 4 == 0 for i in range(n)]
    layers = tuple(attn if a else gdn for a in is_attn)
    n_attn = sum(is_attn)
    n_gdn = n - n_attn
    dense = (
        n_attn * _attention_params(h, heads, kv, hd, q_gate=True)
        + n_gdn * _gdn_params(h, k_heads, v_heads, k_dim, v_dim, d_conv)
        + n * (_mlp_params(h, shared, gated=True) + h * experts + h)  # shared expert, router, shared gate
        + n_attn * 2 * hd  # q_norm, k_norm
        + (2 * n + 1) * h  # two RMSNorms per layer, final norm
    )
    return ModelPreset(
        name="qwen3-next-80b-a3b",
        hf_repo="Qwen/Qwen3-Next-80B-A3B-Instruct",
        shape=ModelShape("qwen3-next-80b-a3b", layers, max_model_len=262144),
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
        lm_head_params=vocab * h,
        dense_params=dense,
        expert_params=n * experts * _mlp_params(h, e_inter, gated=True),
    )


def _falcon_h1_7b() -> ModelPreset:
    """tiiuae/Falcon-H1-7B-Instruct, ``FalconH1ForCausalLM`` (parallel attention + Mamba2).

    Every decoder layer runs attention and a Mamba2 mixer side by side; as in
    vLLM, each contributes its own cache layer (``self_attn.attn`` and
    ``mamba``), so the shape has 44 attention + 44 Mamba layers.
    config.json: hidden_size 3072; num_hidden_layers 44; num_attention_heads
    12; num_key_value_heads 2; head_dim 128; mamba_d_ssm 3072 (d_inner);
    mamba_n_heads 24; mamba_d_head 128; mamba_n_groups 1; mamba_d_state 256;
    mamba_d_conv 4; intermediate_size 12288 (SwiGLU); vocab_size 130048;
    tie_word_embeddings false; max_position_embeddings 262144.
    """
    h, n, heads, kv, hd = 3072, 44, 12, 2, 128
    d_inner, m_heads, m_hd, groups, d_state, d_conv = 3072, 24, 128, 1, 256, 4
    inter, vocab = 12288, 130048
    attn = AttentionLayerShape(num_kv_heads=kv, head_size=hd)
    mamba = mamba2_layer(d_inner, groups, m_heads, m_hd, d_state, d_conv)
    layers: tuple[LayerShape, ...] = tuple(x for _ in range(n) for x in (attn, mamba))
    dense = (
        n
        * (
            _attention_params(h, heads, kv, hd)
            + _mamba2_params(h, d_inner, groups, d_state, m_heads, d_conv)
            + _mlp_params(h, inter, gated=True)
            + 2 * h  # two RMSNorms per layer
        )
        + h
    )  # final norm
    return ModelPreset(
        name="falcon-h1-7b",
        hf_repo="tiiuae/Falcon-H1-7B-Instruct",
        shape=ModelShape("falcon-h1-7b", layers, max_model_len=262144),
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
        lm_head_params=vocab * h,
        dense_params=dense,
        expert_params=0,
    )


def _llama_31_8b() -> ModelPreset:
    """meta-llama/Llama-3.1-8B, ``LlamaForCausalLM`` (plain transformer).

    config.json: hidden_size 4096; num_hidden_layers 32; num_attention_heads
    32; num_key_value_heads 8 (head_dim 128); intermediate_size 14336
    (SwiGLU); vocab_size 128256; tie_word_embeddings false;
    max_position_embeddings 131072.
    """
    return dense_transformer_preset(
        "llama-3.1-8b",
        hf_repo="meta-llama/Llama-3.1-8B",
        hidden=4096,
        layers=32,
        heads=32,
        kv_heads=8,
        intermediate=14336,
        vocab=128256,
        max_model_len=131072,
    )


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


MODEL_PRESETS: dict[str, ModelPreset] = {
    p.name: p
    for p in (
        _nemotron_h_8b(),
        _jamba_15_mini(),
        _granite_40_h_small(),
        _qwen3_next_80b_a3b(),
        _falcon_h1_7b(),
        _llama_31_8b(),
    )
}


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


HARDWARE_PRESETS: dict[str, HardwarePreset] = {
    h.name: h
    for h in (
        # NVIDIA A100 datasheet, SXM4 80GB: 80 GB HBM2e, 2,039 GB/s, BF16 tensor 312 TFLOPS dense;
        # 108 SMs (NVIDIA A100 Tensor Core GPU Architecture whitepaper).
        HardwarePreset("a100-80g", 80 * GiB, 2.039e12, 312e12, (8, 0), "NVIDIA A100 80GB SXM datasheet", 108),
        # NVIDIA H100 datasheet, SXM5: 80 GB HBM3, 3.35 TB/s, BF16 1,979 TFLOPS with sparsity = 989.5 dense;
        # 132 SMs (NVIDIA H100 Tensor Core GPU Architecture whitepaper, SXM5).
        HardwarePreset("h100-80g", 80 * GiB, 3.35e12, 989.5e12, (9, 0), "NVIDIA H100 SXM datasheet", 132),
        # NVIDIA H200 datasheet, SXM: 141 GB HBM3e, 4.8 TB/s, BF16 1,979 TFLOPS with sparsity = 989.5 dense;
        # the H100 SXM5 die, 132 SMs.
        HardwarePreset("h200", 141 * 10**9, 4.8e12, 989.5e12, (9, 0), "NVIDIA H200 SXM datasheet", 132),
        # NVIDIA L40S datasheet: 48 GB GDDR6, 864 GB/s, BF16 tensor 362.05 TFLOPS dense (733 sparse); 142 SMs.
        HardwarePreset("l40s", 48 * GiB, 864e9, 362.05e12, (8, 9), "NVIDIA L40S datasheet", 142),
    )
}

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
