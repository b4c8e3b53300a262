"""Per-operation roofline step-time model for ``clock: time`` (docs/design.md §5).

One engine step runs one forward pass over every scheduled request. The GPU
runs its kernels one after another, so the step's GPU time is the **sum** of
per-operation terms, each with its own efficiencies:

* **GEMMs** (attention q/k/v and output projections, MLP up/down, MoE experts,
  Mamba/GDN in/out projections, LM head). A GEMM over ``T`` token rows with
  ``W`` weights costs ``2 T W`` FLOPs and streams its weights plus the
  activations in and out. Routed experts are read as far as the step's tokens
  touch them: ``E * (1 - (1 - k/E) ** T)`` of ``E`` experts per MoE layer.
* **Attention**, decode and prefill as two kernels (vLLM v1 runs FlashInfer's
  decode and prefill wrappers separately). Decode streams the KV of every
  decode request's context (memory-bound) in **waves** of thread blocks (see
  :meth:`StepTimeModel.attention_decode_time`); prefill costs ``4 * heads *
  head_dim`` FLOPs per (query, key) pair, with the causal pairs of the new
  tokens (``n (n + 1) / 2``) and the pairs against the cached context (``n *
  c``) at their own efficiencies, plus a per-query-token cost (tile
  prologue/epilogue). A sliding-window layer attends at most ``window`` keys
  per query: its decode reads ``min(c, window)`` cached tokens and its prefill
  pairs are counted inside the window.
* **Mamba / GDN state**: each request reads and writes its recurrent state once
  per layer per step (the decode ``selective_state_update`` is memory-bound);
  prefill tokens cost ``6 * state elements`` FLOPs each (decay, rank-1 update,
  readout). Flat in context.
* **Small ops** per layer (RMSNorms, rotary embedding, KV-cache write, the
  MLP activation, residual adds, conv1d and gated norm of Mamba layers, the
  embedding lookup and the final norm): memory-bound elementwise kernels.

Each kernel costs ``floor + (c ** k + m ** k) ** (1 / k)``: ``c`` its compute
time at its achieved FLOP/s, ``m`` its memory time at its achieved bandwidth,
``k`` (``transition_k``) how sharp the compute/memory corner is (a p-norm:
``k -> inf`` is a hard max, ``k = 2`` rounds the corner), and ``floor`` a
per-kernel latency (launch, tail effects, low occupancy at small batch). The
floors are why a small-batch decode step costs what it does: about nine small
kernels per layer, not one hidden fixed overhead. On top of the GPU time come
the CPU-side ``step_overhead_s`` and ``per_request_overhead_s``.

The model never reads a clock; it is a pure function of the batch, and only of
its totals, split between decode requests (one new token on ``c`` context
tokens) and prefill chunks, so the engine feeds it integer totals gathered in
one pass (:meth:`StepTimeModel.step_time_totals`). Calibrated constants per GPU
(and their sources) are in :data:`CALIBRATED`; ``hybridsim timing check`` and
``hybridsim timing fit`` hold the model against a profile in Vidur's CSV format
(``sim.timing``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any, ClassVar

import numpy as np

from sim.config.presets import (
    HardwarePreset,
    ModelPreset,
    hardware_preset,
    model_preset,
)
from sim.core.kv.shapes import AttentionLayerShape, MambaLayerShape

#: Activation element size (bf16) for activation traffic.
ACT_BYTES = 2

#: One sliding window's batch totals: ``(decode_context, prefill_context,
#: prefill_context_pairs, prefill_causal_pairs)`` inside the window
#: (:meth:`StepTimeModel.window_totals`).
WindowTotals = tuple[float, float, float, float]

_FRACTIONS = (
    "compute_efficiency",
    "memory_efficiency",
    "attn_prefill_efficiency",
    "attn_context_efficiency",
    "attn_decode_memory_efficiency",
    "elementwise_memory_efficiency",
    "state_memory_efficiency",
)
_INTEGERS = ("gemm_row_tile", "attn_decode_ctas_per_sm")


@dataclass(frozen=True, slots=True)
class TimingParams:
    """Tunable constants of the step-time model (fitted by ``hybridsim timing fit``).

    Efficiencies are achieved fractions of the datasheet FLOP/s
    (``bf16_flops``) or bandwidth (``memory_bandwidth``); floors are seconds
    per kernel. ``compute_efficiency`` / ``memory_efficiency`` /
    ``kernel_floor_s`` are the GEMMs'; ``transition_k`` is shared by every
    kernel. ``gemm_row_tile``: a GEMM over more token rows than one tile
    computes whole tiles (cuBLAS's wave quantization: on the A100 profile 136
    rows cost what 256 do); 1 turns it off. ``attn_decode_ctas_per_sm`` /
    ``attn_decode_cta_bandwidth``: the decode-attention kernel's resident
    thread blocks per SM and the bytes/s one block streams when it runs alone
    (:meth:`StepTimeModel.attention_decode_time`); 0 blocks per SM turns the
    wave term off (a plain roofline). ``step_overhead_s`` / ``per_request_overhead_s`` are CPU time
    outside the GPU kernels (scheduling, input preparation, sampling
    bookkeeping) that a kernel profile cannot see: they are 0 / 5 µs unless
    you measure your own; vLLM v1 overlaps much of its CPU work with the GPU.
    The defaults are the A100 calibration (:data:`A100_80G`; its docstring
    gives the Mamba state anchor).
    """

    step_overhead_s: float = 0.0
    per_request_overhead_s: float = 5e-6
    compute_efficiency: float = 0.7073
    memory_efficiency: float = 0.8136
    kernel_floor_s: float = 4.697e-6
    transition_k: float = 2.029
    gemm_row_tile: int = 64
    attn_prefill_efficiency: float = 0.5622
    attn_context_efficiency: float = 0.5518
    attn_prefill_token_s: float = 3.842e-8
    attn_decode_memory_efficiency: float = 0.8502
    attn_floor_s: float = 1.891e-5
    attn_decode_ctas_per_sm: int = 3
    attn_decode_cta_bandwidth: float = 1.419e10
    elementwise_memory_efficiency: float = 0.5732
    small_op_floor_s: float = 3.777e-6
    state_memory_efficiency: float = 0.8056
    state_floor_s: float = 5e-6

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name in _FRACTIONS:
                if not 0 < v <= 1:
                    raise ValueError(f"{f.name} must be in (0, 1], got {v}")
            elif f.name == "transition_k":
                if not 1 <= v <= 64:
                    raise ValueError(f"transition_k must be in [1, 64], got {v}")
            elif f.name in _INTEGERS:
                low = 1 if f.name == "gemm_row_tile" else 0
                if not (isinstance(v, int) and v >= low):
                    raise ValueError(f"{f.name} must be an integer >= {low}, got {v!r}")
            elif f.name == "attn_decode_cta_bandwidth":
                if not v > 0:
                    raise ValueError(f"attn_decode_cta_bandwidth must be > 0, got {v}")
            elif v < 0:
                raise ValueError(f"{f.name} must be >= 0, got {v}")


A100_80G = TimingParams(
    compute_efficiency=0.7073,
    memory_efficiency=0.8136,
    kernel_floor_s=4.697e-6,
    transition_k=2.029,
    gemm_row_tile=64,
    elementwise_memory_efficiency=0.5732,
    small_op_floor_s=3.777e-6,
    attn_decode_memory_efficiency=0.8502,
    attn_floor_s=1.891e-5,
    attn_decode_ctas_per_sm=3,
    attn_decode_cta_bandwidth=1.419e10,
    attn_prefill_efficiency=0.5622,
    attn_context_efficiency=0.5518,
    attn_prefill_token_s=3.842e-8,
    state_memory_efficiency=0.8056,
    state_floor_s=5e-6,
)
"""A100-SXM4-80GB, fitted with ``hybridsim timing fit`` on Vidur's public profiles (MIT):

* GEMMs and small ops: ``microsoft/vidur`` @ 7d47513363ec447a741ac5e47241580b47724fbf,
  ``data/profiling/compute/a100/meta-llama/Meta-Llama-3-8B/mlp.csv`` (all 451 TP-1 token counts).
* attention (FlashInfer): the same profile's ``attention.csv``, absent from the
  stored snapshot of Vidur (over 4 MiB), read from the fork
  ``sw5sh/cs378-assignment3`` @ 7ac2fe9fb6cea9d4630659a10c5cccfc9fbdd776 (same
  path, 9,155,341 bytes, the size a Git LFS pointer to it records in the fork
  ``Nisarg-M-Patel/llm-fair-scheduling``); the 74 rows we read are the extract in
  ``tests/data/profiles/a100/meta-llama/Meta-Llama-3-8B/attention.csv``. The decode
  parameters (``attn_decode_*``, ``attn_floor_s``) are fitted on its 53 decode rows,
  the wave term included: the fit picks 3 blocks per SM (324 slots: FlashInfer's
  kernel steps at batch 41, 82, 122 with 8 KV heads); kernel MAPE 7.4% -> 5.1%, every
  decode step within 8% (docs/timing.md).
* Mamba state terms: FlashInfer's ``selective_state_update`` microbenchmark
  (flashinfer PR #4616 on Blackwell: 0.0468 / 0.0873 / 0.1674 ms at batch 64 /
  128 / 256 for the ``benchmarks/samples/sample_testlist.txt`` shape, 64 heads x
  128 x 128 bf16 state, and 5.1 µs at batch 1) is, with a 5 µs floor, 0.80-0.83
  of the 8 TB/s HBM: ``state_floor_s = 5e-6`` and ``state_memory_efficiency =
  0.8056`` agree with it. vLLM PR #48018
  (ReplaySSM) confirms the regime on H100 (halving the state traffic speeds the
  kernel up 1.4-1.8x at batch 32-512; latency-bound at batch 1-8). Quality: a
  fraction-of-bandwidth transfer from another GPU generation, for one kernel;
  vLLM's default Triton kernel can be slower (PR #48018: default vs tuned
  configs differ by up to 1.4x on H100 fp16); the prefill scan FLOPs have no
  anchor.

Extracts and their licence: ``tests/data/profiles/README.md``.
"""

H100_80G = replace(
    A100_80G,
    compute_efficiency=0.7861,
    memory_efficiency=0.8935,
    kernel_floor_s=4.556e-6,
    transition_k=1.422,
    gemm_row_tile=64,
    elementwise_memory_efficiency=0.7336,
    small_op_floor_s=2.256e-6,
    attn_decode_memory_efficiency=0.4669,
    attn_floor_s=1.798e-5,
    attn_decode_ctas_per_sm=2,
    attn_decode_cta_bandwidth=1.447e10,
)
"""H100-SXM-80GB, fitted with ``hybridsim timing fit`` on public profiles:

* GEMMs and small ops: ``microsoft/vidur`` @ 7d47513363ec447a741ac5e47241580b47724fbf,
  ``data/profiling/compute/h100/meta-llama/Llama-2-7b-hf/mlp.csv`` (all TP-1 rows).
  That profile's ``attention.csv`` cannot be read (Vidur's snapshot lacks it; the one
  fork carrying the path, ``Nisarg-M-Patel/llm-fair-scheduling``, holds a Git LFS pointer).
* decode attention (``attn_decode_*``, ``attn_floor_s``): 49 decode rows (TP 1, KV
  length 32 / 576 / 3200 / 3264, batch 1-128) of
  ``data/profiling/compute/h100/meta-llama/Meta-Llama-3.1-405B/attention.csv`` in the
  fork ``adi-anirudh/vidur_hbf_hbm_backend`` @ a336807ca19bee36d2f77124b35887db661b6df1
  (Vidur's profiler, ``AttentionBackend.FLASH_ATTENTION``, 128 query / 8 KV heads of
  128: the same KV per token as Llama-3-8B). The fit picks 2 blocks per SM by itself
  (264 slots: the kernel steps at batch 34, 67, 100). Decode-kernel MAPE 35.6% with
  the A100 fractions, 5.7% fitted (KV >= 576; the KV-32 rows are latency-bound, 10.0%
  over all 49). Not checked in (that file states no licence of its own, and the fork
  does not say whether it comes from Vidur). Caveats: that profiler's FlashAttention
  kernel at a 16:1 query/KV head ratio; vLLM 0.33's FlashAttention backend runs FA3 on
  Hopper, which no public profile covers; 0.47 of HBM is what the profiled kernel reached.
* prefill attention and the Mamba terms keep the A100 fractions (of the H100's own
  peak and bandwidth): unvalidated on H100.
"""

#: Calibrated constants per hardware preset name; other presets use :class:`TimingParams`' defaults.
CALIBRATED: dict[str, TimingParams] = {"a100-80g": A100_80G, "h100-80g": H100_80G}

HARDWARE_OVERRIDE_KEYS = ("memory_bytes", "memory_bandwidth", "bf16_flops", "sm_count")
TIMING_OVERRIDE_KEYS = tuple(f.name for f in fields(TimingParams))


def _split_overrides(overrides: Mapping[str, Any] | None) -> tuple[dict[str, Any], dict[str, Any]]:
    hw: dict[str, Any] = {}
    timing: dict[str, Any] = {}
    for key, value in (overrides or {}).items():
        if value is None:
            continue
        if key in HARDWARE_OVERRIDE_KEYS:
            hw[key] = value
        elif key in TIMING_OVERRIDE_KEYS:
            timing[key] = value
        else:
            valid = ", ".join(HARDWARE_OVERRIDE_KEYS + TIMING_OVERRIDE_KEYS)
            raise ValueError(f"unknown step-time override {key!r} (valid: {valid})")
    for key in ("memory_bandwidth", "bf16_flops"):
        if key in hw and hw[key] <= 0:
            raise ValueError(f"{key} must be > 0, got {hw[key]}")
    return hw, timing


def kernel_time(compute_s: float, memory_s: float, floor_s: float, k: float) -> float:
    """One kernel: ``floor + (c^k + m^k)^(1/k)``, a smooth roofline (``k = 2`` is a Euclidean norm)."""
    if k == 2.0:
        return floor_s + math.sqrt(compute_s * compute_s + memory_s * memory_s)
    return floor_s + (compute_s**k + memory_s**k) ** (1.0 / k)


@dataclass(frozen=True, slots=True)
class Gemm:
    """One weight matrix applied to every token row: ``din x dout`` weights, ``count`` per step."""

    din: int
    dout: int
    count: int

    @property
    def weights(self) -> int:
        return self.din * self.dout


def model_gemms(model: ModelPreset) -> dict[str, tuple[Gemm, ...]]:
    """The model's GEMMs per term: ``attn_proj``, ``mlp``, ``shared_expert``, ``mixer_proj``.

    Attention: q/k/v fused and output projection; MLP: gate+up fused (or up)
    and down; Mamba/GDN mixers: what is left of ``dense_params`` after
    attention, MLP, shared experts, routers and norms, split 2:1 between the
    in- and out-projection (their ratio in Mamba2 at expand 2). The LM head and
    routed experts are handled apart.
    """
    h, hd = model.hidden_size, model.head_dim
    la, lm, lmoe, lmix = model.num_attention_layers, model.num_mlp_layers, model.num_moe_layers, model.num_mamba_layers
    qkv = Gemm(h, (model.num_attention_heads + 2 * model.num_kv_heads) * hd, la)
    o = Gemm(model.num_attention_heads * hd, h, la)
    inter = model.mlp_intermediate_size
    up_width = 2 * inter if model.mlp_gated else inter
    up, down = Gemm(h, up_width, lm), Gemm(inter, h, lm)
    shared = model.shared_expert_intermediate_size
    shared_up, shared_down = Gemm(h, 2 * shared, lmoe), Gemm(shared, h, lmoe)
    router = Gemm(h, model.num_experts, lmoe)
    out: dict[str, tuple[Gemm, ...]] = {"attn_proj": (qkv, o) if la else (), "mlp": (up, down) if lm and inter else ()}
    out["shared_expert"] = tuple(g for g in (shared_up, shared_down, router) if g.count and g.weights)
    norms = (2 * model.num_decoder_layers + 1) * h
    known = sum(g.weights * g.count for gs in out.values() for g in gs) + norms
    mixer = max(0, model.dense_params - known)
    if lmix and mixer:
        per_layer = mixer // lmix
        out["mixer_proj"] = (
            Gemm(h, max(1, (2 * per_layer) // (3 * h)), lmix),
            Gemm(max(1, per_layer // (3 * h)), h, lmix),
        )
    else:
        out["mixer_proj"] = ()
    return out


class StepTimeModel:
    """Seconds per engine step as a function of the scheduled batch (see module docstring)."""

    __slots__ = (
        "_attn_classes",
        "_attn_floor",
        "_ctx_c",
        "_cta_inv_bw",
        "_dec_c",
        "_dec_inv_bw",
        "_pre_c",
        "_pre_inv_bw",
        "_attn_layers",
        "_bw",
        "_decode_slots",
        "_expert_pick",
        "_expert_weights",
        "_expert_width",
        "_gemm_consts",
        "_gemms",
        "_inv_k",
        "_k",
        "_kv_bytes",
        "_lm_consts",
        "_lm_head",
        "_mamba_layers",
        "_moe_layers",
        "_num_experts",
        "_pair_flops",
        "_peak",
        "_q_bytes",
        "_small_bytes_per_token",
        "_small_kernels",
        "_small_step_bytes_per_token",
        "_state_bytes",
        "_state_flops",
        "_tile",
        "_token_memo",
        "_request_memo",
        "_windows",
        "hardware",
        "model",
        "params",
    )

    def __init__(self, model: ModelPreset, hardware: HardwarePreset, params: TimingParams = TimingParams()):
        self.model = model
        self.hardware = hardware
        self.params = params
        self._peak = hardware.bf16_flops
        self._bw = hardware.memory_bandwidth
        self._k = params.transition_k
        gemms = model_gemms(model)
        self._gemms = tuple((name, tuple(g for g in gs)) for name, gs in gemms.items() if gs)
        # Logits: hidden x vocab, also when tied to the embedding (``lm_head_params == 0``).
        self._lm_head = Gemm(model.hidden_size, model.vocab_size, 1) if model.vocab_size else None
        attn = [layer for layer in model.shape.layers if isinstance(layer, AttentionLayerShape)]
        mamba = [layer for layer in model.shape.layers if isinstance(layer, MambaLayerShape)]
        self._attn_layers = len(attn)
        kinds: dict[tuple[int | None, int, int], int] = {}
        for layer in attn:
            key = (layer.window, layer.bytes_per_token, layer.num_kv_heads)
            kinds[key] = kinds.get(key, 0) + 1
        #: ``(layers, window or None, KV bytes per token, KV heads)`` per kind of attention layer.
        self._attn_classes = tuple((n, w, float(b), heads) for (w, b, heads), n in kinds.items())
        self._windows = tuple(sorted({w for _, w, _, _ in self._attn_classes if w is not None}))
        self._decode_slots = hardware.sm_count * params.attn_decode_ctas_per_sm
        self._pair_flops = 4.0 * model.num_attention_heads * model.head_dim
        self._kv_bytes = float(sum(layer.bytes_per_token for layer in attn) / len(attn)) if attn else 0.0
        self._q_bytes = 2.0 * model.num_attention_heads * model.head_dim * ACT_BYTES  # q in, o out
        # attention kernels' rates: s per FLOP, s per byte
        self._dec_c = self._pair_flops / (self._peak * params.attn_prefill_efficiency)
        self._dec_inv_bw = 1.0 / (self._bw * params.attn_decode_memory_efficiency)
        self._cta_inv_bw = 1.0 / params.attn_decode_cta_bandwidth
        self._pre_c = self._dec_c
        self._ctx_c = self._pair_flops / (self._peak * params.attn_context_efficiency)
        self._pre_inv_bw = 1.0 / (self._bw * params.memory_efficiency)
        self._attn_floor = params.attn_floor_s
        self._inv_k = 1.0 / params.transition_k
        self._moe_layers = model.num_moe_layers
        self._num_experts = model.num_experts
        self._expert_pick = (1.0 - model.experts_per_token / model.num_experts) if model.num_experts else 0.0
        per_layer_experts = model.expert_params / model.num_moe_layers if model.num_moe_layers else 0.0
        self._expert_weights = per_layer_experts
        # Expert GEMM rows: each token multiplies k of E experts; width of one expert's up+down.
        self._expert_width = (model.experts_per_token / model.num_experts) if model.num_experts else 0.0
        self._mamba_layers = len(mamba)
        self._state_bytes = float(sum(layer.state_bytes for layer in mamba) / len(mamba)) if mamba else 0.0
        self._state_flops = (
            6.0 * sum(max(math.prod(s) for s in layer.state_shapes) for layer in mamba) / len(mamba) if mamba else 0.0
        )
        h = model.hidden_size
        inter = model.mlp_intermediate_size
        act_in = (2 if model.mlp_gated else 1) * inter
        kvb = self._kv_bytes
        # Per-layer small kernels and their bytes per token (read + write, bf16).
        norm = 2 * h * ACT_BYTES
        add = 3 * h * ACT_BYTES
        rope = 2 * (model.num_attention_heads + model.num_kv_heads) * model.head_dim * ACT_BYTES
        attn_block = (4, norm + rope + 2 * kvb + add)  # norm, rope, KV write, add
        mlp_block = (3, norm + (act_in + inter) * ACT_BYTES + add)  # norm, activation, add
        moe_block = (3, norm + 3 * model.moe_intermediate_size * model.experts_per_token * ACT_BYTES + add)
        mixer_width = sum(g.dout for g in gemms["mixer_proj"][:1])
        mamba_block = (4, norm + 3 * mixer_width * ACT_BYTES + add)  # norm, conv1d, gated norm, add
        blocks = (
            (self._attn_layers, attn_block),
            (model.num_mlp_layers, mlp_block),
            (model.num_moe_layers, moe_block),
            (self._mamba_layers, mamba_block),
        )
        self._small_kernels = float(sum(n * b[0] for n, b in blocks)) + 2.0  # + embedding lookup, final norm
        self._small_bytes_per_token = float(sum(n * b[1] for n, b in blocks))
        self._small_step_bytes_per_token = float((2 + 2) * h * ACT_BYTES)  # embedding row out, final norm r/w
        self._tile = params.gemm_row_tile
        self._gemm_consts = tuple(
            (name, tuple((g.count,) + self._gemm_coefficients(g) for g in gs)) for name, gs in self._gemms
        )
        self._lm_consts = self._gemm_coefficients(self._lm_head) if self._lm_head is not None else None
        #: ``t -> (GEMMs + MoE seconds, small-op seconds)`` and ``r -> LM-head seconds`` of
        #: :meth:`_gpu_seconds`: pure functions of one total, computed once per distinct value.
        self._token_memo: dict[float, tuple[float, float]] = {}
        self._request_memo: dict[int, float] = {}

    def _gemm_coefficients(self, gemm: Gemm) -> tuple[float, float, float]:
        """``(compute s per computed row, memory s fixed, memory s per row)`` of one GEMM kernel."""
        p = self.params
        rate, bw = self._peak * p.compute_efficiency, self._bw * p.memory_efficiency
        return (
            2.0 * gemm.weights / rate,
            gemm.weights * self.model.weight_dtype_bytes / bw,
            (gemm.din + gemm.dout) * ACT_BYTES / bw,
        )

    @classmethod
    def from_presets(
        cls,
        model: str | ModelPreset,
        hardware: str | HardwarePreset,
        overrides: Mapping[str, Any] | None = None,
    ) -> StepTimeModel:
        """Build from preset names (or preset objects) and YAML overrides.

        The timing constants start from the hardware's calibration in
        :data:`CALIBRATED` (else the defaults); ``overrides`` may set the
        hardware numbers (``memory_bytes``, ``memory_bandwidth``,
        ``bf16_flops``) and any :class:`TimingParams` field; ``None`` values
        mean "keep the preset's".
        """
        m = model_preset(model) if isinstance(model, str) else model
        hw = hardware_preset(hardware) if isinstance(hardware, str) else hardware
        hw_over, timing_over = _split_overrides(overrides)
        base = CALIBRATED.get(hw.name, TimingParams())
        if hw_over:
            hw = replace(hw, **hw_over)
        return cls(m, hw, replace(base, **timing_over) if timing_over else base)

    # ------------------------------------------------------------------ public entry points

    def step_time(self, batch: Sequence[tuple[int, int]] | np.ndarray) -> float:
        """Seconds for one step over ``batch``: ``(num_new_tokens, num_context_tokens)`` per request.

        A request with one new token is a decode; any other is a prefill chunk.
        An empty batch costs nothing (the engine runs no forward pass).
        """
        if len(batch) == 0:
            return 0.0
        arr = np.asarray(batch, dtype=np.float64)
        return self.step_time_arrays(arr[:, 0], arr[:, 1])

    def step_time_arrays(self, new_tokens: np.ndarray, context_tokens: np.ndarray) -> float:
        """As :meth:`step_time`, with the two columns given as arrays."""
        if len(new_tokens) == 0:
            return 0.0
        r, t, ctx, nc, nn1, dr, dctx = _totals(new_tokens, context_tokens)
        windowed = self.window_totals(new_tokens, context_tokens) if self._windows else None
        return self.step_time_totals(r, t, ctx, nc, nn1, decode_requests=dr, decode_context=dctx, windowed=windowed)

    def step_time_of_batch(
        self, decode_requests: int, decode_context: int, prefill_chunks: Sequence[tuple[int, int]]
    ) -> float:
        """:meth:`step_time_totals` of a step given as its decodes in aggregate (``decode_requests`` of
        them, ``decode_context`` context tokens in all) and its prefill chunks ``(n, c)``.

        A decode brings ``n = 1`` token on ``c`` context tokens, so it adds ``c``
        to ``sum n*c`` and 2 to ``sum n*(n+1)``.
        """
        total_new = decode_requests
        total_ctx = new_ctx = decode_context
        new_new1 = 2 * decode_requests
        for n, c in prefill_chunks:
            total_new += n
            total_ctx += c
            new_ctx += n * c
            new_new1 += n * (n + 1)
        return self.step_time_totals(
            decode_requests + len(prefill_chunks),
            total_new,
            total_ctx,
            new_ctx,
            new_new1,
            decode_requests=decode_requests,
            decode_context=decode_context,
        )

    def decode_run(self, requests: int, context: int, start: float, until: float, limit: int) -> list[float]:
        """Durations of consecutive decode-only steps of ``requests`` decodes, the first over ``context``
        context tokens in all and each next one over ``requests`` more: the steps that start before ``until``
        (the first at ``start``, each at the previous one's end, ``start + d`` in float), at most ``limit``.
        Each is :meth:`step_time_of_batch` ``(requests, context, ())`` bit for bit; the terms that do not
        depend on the context are summed once, in :meth:`_gpu_seconds`'s order."""
        out: list[float] = []
        t = start
        if not requests or self._windows or (self._attn_layers and len(self._attn_classes) != 1):
            while len(out) < limit and t < until:
                d = self.step_time_of_batch(requests, context, ())
                out.append(d)
                t += d
                context += requests
            return out
        p = self.params
        base = p.step_overhead_s + p.per_request_overhead_s * requests
        memo = self._token_memo.get(requests)
        gemms, small = memo if memo is not None else self._token_terms(requests)
        head = 0.0
        if self._lm_consts is not None:
            lm = self._request_memo.get(requests)
            head = lm if lm is not None else self._lm_head_time(requests)
        fixed = gemms
        if self._mamba_layers:
            fixed += self._state_time(requests, requests)
        attention = bool(self._attn_layers)
        if attention:
            count, _, kv_bytes, heads = self._attn_classes[0]
            kernel = self.decode_kernel_time
        while len(out) < limit and t < until:
            total = fixed
            if attention:
                total += count * kernel(kv_bytes, heads, requests, context) + 0.0
            total += small
            if self._lm_consts is not None:
                total += head
            d = base + total
            out.append(d)
            t += d
            context += requests
        return out

    def step_time_totals(
        self,
        num_requests: int,
        new_tokens: float,
        context_tokens: float,
        new_times_context: float,
        new_times_new_plus_one: float,
        *,
        decode_requests: int = 0,
        decode_context: float = 0,
        windowed: Mapping[int, WindowTotals] | None = None,
    ) -> float:
        """As :meth:`step_time`, from the batch's integer totals (no arrays).

        ``new_tokens = sum n_i``, ``context_tokens = sum c_i``,
        ``new_times_context = sum n_i * c_i`` and ``new_times_new_plus_one =
        sum n_i * (n_i + 1)`` over all requests; ``decode_requests`` of them are
        decodes (``n_i = 1``) with ``decode_context = sum c_i`` over those. A
        caller that does not split them gets every request costed as a prefill
        chunk. Equal to :meth:`step_time` bit for bit while the totals stay
        below 2**53 (float64 sums of integers are exact there).

        Sliding-window layers need the totals inside each window
        (``windowed[w]``, :meth:`window_totals`). Without them each total is
        capped from the plain totals at ``count x window`` (decode context at
        ``decodes x window``, prefill KV read at ``chunks x window``, prefill
        pairs at ``prefill tokens x window``, of which the causal pairs first):
        never above the uncapped cost, never below the exact decode and pair
        totals, and exact for decodes whose contexts are all on one side of the
        window. :meth:`step_time` and :meth:`breakdown` always pass them.
        """
        if num_requests == 0:
            return 0.0
        p = self.params
        return (
            p.step_overhead_s
            + p.per_request_overhead_s * num_requests
            + self._gpu_seconds(
                num_requests,
                new_tokens,
                context_tokens,
                new_times_context,
                new_times_new_plus_one,
                decode_requests,
                decode_context,
                windowed,
            )
        )

    def window_totals(self, new_tokens: np.ndarray, context_tokens: np.ndarray) -> dict[int, WindowTotals]:
        """Per window of the model's sliding-window layers, the batch's totals inside it.

        A query at position ``p`` (0-based) of a window-``w`` layer attends
        ``min(p + 1, w)`` keys. Per window: ``decode_context = sum min(c, w)``
        over decodes; over prefill chunks, ``context = sum min(c, w)`` (cached
        KV read), the query/key pairs against cached tokens, and the causal
        pairs among the chunk's own tokens (``sum min(j, w)``, j = 1..n).
        """
        n = np.asarray(new_tokens, dtype=np.float64)
        c = np.asarray(context_tokens, dtype=np.float64)
        decode = n == 1.0
        pn, pc = n[~decode], c[~decode]
        out: dict[int, WindowTotals] = {}
        for w in self._windows:
            causal = _window_pairs(pn, w)
            total = _window_pairs(pc + pn, w) - _window_pairs(pc, w)
            out[w] = (
                float(np.minimum(c[decode], w).sum()),
                float(np.minimum(pc, w).sum()),
                float((total - causal).sum()),
                float(causal.sum()),
            )
        return out

    def prefill_flops(self, num_tokens: int) -> float:
        """FLOPs of prefilling ``num_tokens`` prompt tokens from an empty context (one sampled token).

        The same terms the step time sums: every GEMM on every token row, the
        routed experts' active share, causal attention pairs ``n(n+1)/2`` per
        attention layer, the Mamba/GDN state update per token, and the LM head
        once (a sliding-window layer's pairs inside its window). What-if eviction policies (``marconi``) weigh a cached entry by it.
        """
        n = float(num_tokens)
        gemms = sum(2.0 * g.weights * g.count for _, gs in self._gemms for g in gs) * n
        experts = 2.0 * n * self._expert_weights * self._expert_width * self._moe_layers
        attention = self._pair_flops * sum(
            count * (n * (n + 1.0) / 2.0 if w is None else float(_window_pairs(np.array([n]), w)[0]))
            for count, w, _, _ in self._attn_classes
        )
        states = self._state_flops * self._mamba_layers * n
        head = 2.0 * self._lm_head.weights if self._lm_head is not None else 0.0
        return gemms + experts + attention + states + head

    def breakdown(self, batch: Sequence[tuple[int, int]]) -> dict[str, float]:
        """Seconds per term of one step over ``batch`` (GPU terms, plus ``cpu``); they sum to :meth:`step_time`."""
        if len(batch) == 0:
            return {}
        arr = np.asarray(batch, dtype=np.float64)
        totals = _totals(arr[:, 0], arr[:, 1])
        windowed = self.window_totals(arr[:, 0], arr[:, 1]) if self._windows else None
        terms = self._terms(*totals, windowed=windowed)
        terms["cpu"] = self.params.step_overhead_s + self.params.per_request_overhead_s * totals[0]
        return terms

    # ------------------------------------------------------------------ the terms

    def gemm_time(self, gemm: Gemm, rows: float) -> float:
        """One GEMM kernel over ``rows`` token rows (weights in the model dtype, bf16 activations)."""
        fc, m0, m1 = self._gemm_coefficients(gemm)
        return self._gemm(fc, m0, m1, rows)

    def _gemm(self, fc: float, m0: float, m1: float, rows: float) -> float:
        tile = self._tile
        computed = rows if rows <= tile else math.ceil(rows / tile) * tile
        return kernel_time(fc * computed, m0 + m1 * rows, self.params.kernel_floor_s, self._k)

    def _first_attention_kind(self) -> tuple[float, int]:
        if self._attn_classes:
            _, _, kv_bytes, heads = self._attn_classes[0]
            return kv_bytes, heads
        return self._kv_bytes, max(1, self.model.num_kv_heads)

    def attention_decode_time(self, requests: float, context: float) -> float:
        """One attention layer's decode kernel: ``requests`` decodes over ``context`` cached tokens in all.

        The layer is the model's first kind of attention layer (the only one
        in a uniform model). See :meth:`decode_kernel_time`.
        """
        return self.decode_kernel_time(*self._first_attention_kind(), requests, context)

    def decode_kernel_time(self, kv_bytes: float, kv_heads: int, requests: float, context: float) -> float:
        """One decode-attention kernel over ``requests`` decodes reading ``context`` cached tokens in all.

        Roofline: ``4 h d`` FLOPs per (query, key) and the KV of every context
        token (``kv_bytes`` per token), plus the new token's K/V and q/o.
        **Waves**: the kernel runs one thread block (CTA) per (request, KV
        head), and ``slots = sm_count x attn_decode_ctas_per_sm`` of them are
        resident at once. With fewer blocks than slots, FlashInfer splits each
        request's KV into chunks so that the blocks fill the GPU once (split-KV,
        then a merge): one full wave, the plain roofline. With more, it does
        not split: the kernel takes ``ceil(blocks / slots)`` waves. A full wave
        is the roofline of ``slots`` blocks; the last wave's ``n`` blocks take
        at least what one block takes alone, its KV share at
        ``attn_decode_cta_bandwidth`` (one block's memory-level parallelism
        cannot use the whole HBM), cornered with the bandwidth share of ``n``
        blocks by the same p-norm, and at most a full wave. So the time steps
        up where a wave starts (on the A100, 108 SMs x 3 blocks = 324 slots: 8
        KV heads step at batch 41, 82, 122), and contexts are taken at their
        mean (the model sees the batch's totals). ``attn_decode_ctas_per_sm =
        0`` or ``sm_count = 0`` leaves the plain roofline.
        """
        k, inv_k = self._k, self._inv_k
        c = (context + requests) * self._dec_c
        m = (kv_bytes * (context + 2.0 * requests) + self._q_bytes * requests) * self._dec_inv_bw
        # the p-norm is homogeneous: a wave of a share of the blocks costs that share of the whole roofline
        whole = math.sqrt(c * c + m * m) if k == 2.0 else (c**k + m**k) ** inv_k
        blocks = requests * kv_heads
        slots = self._decode_slots
        if blocks <= slots or not slots:
            return self._attn_floor + whole
        waves = math.ceil(blocks / slots)
        full = whole * slots / blocks
        share = whole * (blocks - (waves - 1) * slots) / blocks
        alone = kv_bytes * context / blocks * self._cta_inv_bw
        tail = math.sqrt(alone * alone + share * share) if k == 2.0 else (alone**k + share**k) ** inv_k
        return self._attn_floor + (waves - 1) * full + (full if tail > full else tail)

    def attention_prefill_time(self, tokens: float, context: float, context_pairs: float, causal_pairs: float) -> float:
        """One attention layer's prefill kernel over chunks with these totals (pairs as in the module docstring).

        The layer is the model's first kind of attention layer (see :meth:`prefill_kernel_time`).
        """
        return self.prefill_kernel_time(self._first_attention_kind()[0], tokens, context, context_pairs, causal_pairs)

    def prefill_kernel_time(
        self, kv_bytes: float, tokens: float, context: float, context_pairs: float, causal_pairs: float
    ) -> float:
        """One prefill-attention kernel with ``kv_bytes`` of KV per token (pairs as in the module docstring)."""
        c = causal_pairs * self._pre_c + context_pairs * self._ctx_c + self.params.attn_prefill_token_s * tokens
        m = (kv_bytes * (context + 2.0 * tokens) + self._q_bytes * tokens) * self._pre_inv_bw
        return kernel_time(c, m, self._attn_floor, self._k)

    def _attention(
        self,
        r: int,
        t: float,
        ctx: float,
        nc: float,
        nn1: float,
        dr: int,
        dctx: float,
        windowed: Mapping[int, WindowTotals] | None,
    ) -> tuple[float, float]:
        """Seconds of every attention layer's decode and prefill kernels (per kind of layer)."""
        pr, pt = r - dr, t - dr
        pctx, pnc, pcausal = ctx - dctx, nc - dctx, (nn1 - 2.0 * dr) * 0.5
        if not self._windows and len(self._attn_classes) == 1:  # the engine's usual case: one kind of layer
            count, _, kv_bytes, heads = self._attn_classes[0]
            return (
                count * self.decode_kernel_time(kv_bytes, heads, dr, dctx) if dr else 0.0,
                count * self.prefill_kernel_time(kv_bytes, pt, pctx, pnc, pcausal) if pr else 0.0,
            )
        decode = prefill = 0.0
        for count, window, kv_bytes, heads in self._attn_classes:
            if window is None:
                d_ctx, p_ctx, p_nc, p_causal = dctx, pctx, pnc, pcausal
            elif windowed is not None:
                d_ctx, p_ctx, p_nc, p_causal = windowed[window]
            else:
                d_ctx, p_ctx, p_nc, p_causal = _window_bound(window, dr, dctx, pr, pt, pctx, pnc, pcausal)
            if dr:
                decode += count * self.decode_kernel_time(kv_bytes, heads, dr, d_ctx)
            if pr:
                prefill += count * self.prefill_kernel_time(kv_bytes, pt, p_ctx, p_nc, p_causal)
        return decode, prefill

    def _moe_time(self, t: float) -> float:
        """Every MoE layer's routed experts: FLOPs of the active experts, bytes of the experts touched."""
        p = self.params
        touched = self._num_experts * (1.0 - self._expert_pick**t)
        c = 2.0 * t * self._expert_weights * self._expert_width / (self._peak * p.compute_efficiency)
        m = (
            self._expert_weights
            / self._num_experts
            * touched
            * self.model.weight_dtype_bytes
            / (self._bw * p.memory_efficiency)
        )
        return self._moe_layers * kernel_time(c, m, 2.0 * p.kernel_floor_s, self._k)

    def _state_time(self, r: int, t: float) -> float:
        """Every Mamba/GDN layer's state kernel: per-token FLOPs, state read + written per request."""
        p = self.params
        c = self._state_flops * t / (self._peak * p.attn_prefill_efficiency)
        m = 2.0 * self._state_bytes * r / (self._bw * p.state_memory_efficiency)
        return self._mamba_layers * kernel_time(c, m, p.state_floor_s, self._k)

    def small_ops_time(self, tokens: float) -> float:
        """Every small elementwise kernel of the step (per-layer ones, embedding, final norm)."""
        p = self.params
        nbytes = (self._small_bytes_per_token + self._small_step_bytes_per_token) * tokens
        return p.small_op_floor_s * self._small_kernels + nbytes / (self._bw * p.elementwise_memory_efficiency)

    def _gpu_seconds(
        self,
        r: int,
        t: float,
        ctx: float,
        nc: float,
        nn1: float,
        dr: int,
        dctx: float,
        windowed: Mapping[int, WindowTotals] | None = None,
    ) -> float:
        """The sum of :meth:`_terms` without building the dict (the engine's once-per-step path).

        Same expressions as :meth:`_terms`, GEMM loop inlined; equal to the sum of
        the breakdown up to float rounding of the summation order. The terms that
        depend on ``t`` alone (GEMMs, routed experts, small ops) or on ``r`` alone
        (LM head) are memoized per value (:meth:`_token_terms`, :meth:`_lm_head_time`),
        and the running sum adds them in the same order as without the memo, so
        the result is bit for bit the same.
        """
        memo = self._token_memo.get(t)
        gemms, small = memo if memo is not None else self._token_terms(t)
        total = gemms
        if self._mamba_layers:
            total += self._state_time(r, t)
        if self._attn_layers:
            decode, prefill = self._attention(r, t, ctx, nc, nn1, dr, dctx, windowed)
            total += decode + prefill
        total += small
        if self._lm_consts is not None:
            lm = self._request_memo.get(r)
            total += lm if lm is not None else self._lm_head_time(r)
        return total

    #: Entries kept per memo; past it a memo starts over (the engine sees at most
    #: ``max_num_batched_tokens`` distinct token totals, far fewer in practice).
    _MEMO_LIMIT: ClassVar[int] = 1 << 16

    def _token_terms(self, t: float) -> tuple[float, float]:
        """``(GEMMs + routed experts, small ops)`` seconds over ``t`` token rows, memoized.

        The first is the running sum ``0.0 + gemm_1 + ... + gemm_n (+ moe)`` in
        :meth:`_gpu_seconds`'s original order.
        """
        k, inv_k, floor = self._k, self._inv_k, self.params.kernel_floor_s
        tile = self._tile
        computed = t if t <= tile else math.ceil(t / tile) * tile
        total = 0.0
        for _, consts in self._gemm_consts:
            for count, fc, m0, m1 in consts:
                c, m = fc * computed, m0 + m1 * t
                total += count * (floor + (math.sqrt(c * c + m * m) if k == 2.0 else (c**k + m**k) ** inv_k))
        if self._moe_layers:
            total += self._moe_time(t)
        terms = (total, self.small_ops_time(t))
        memo = self._token_memo
        if len(memo) >= self._MEMO_LIMIT:
            memo.clear()
        memo[t] = terms
        return terms

    def _lm_head_time(self, r: int) -> float:
        """The LM head's GEMM over ``r`` rows (one logits row per request), memoized."""
        assert self._lm_consts is not None
        seconds = self._gemm(*self._lm_consts, r)
        memo = self._request_memo
        if len(memo) >= self._MEMO_LIMIT:
            memo.clear()
        memo[r] = seconds
        return seconds

    def _terms(
        self,
        r: int,
        t: float,
        ctx: float,
        nc: float,
        nn1: float,
        dr: int = 0,
        dctx: float = 0,
        *,
        windowed: Mapping[int, WindowTotals] | None = None,
    ) -> dict[str, float]:
        """GPU seconds per term from the batch totals (see :meth:`step_time_totals`)."""
        terms: dict[str, float] = {}
        gemm = self._gemm
        for name, consts in self._gemm_consts:
            terms[name] = sum(count * gemm(fc, m0, m1, t) for count, fc, m0, m1 in consts)
        if self._moe_layers:
            terms["moe"] = self._moe_time(t)
        if self._attn_layers:
            decode, prefill = self._attention(r, t, ctx, nc, nn1, dr, dctx, windowed)
            if dr:
                terms["attn_decode"] = decode
            if r - dr:
                terms["attn_prefill"] = prefill
        if self._mamba_layers:
            terms["mamba_state"] = self._state_time(r, t)
        terms["small_ops"] = self.small_ops_time(t)
        if self._lm_consts is not None:
            terms["lm_head"] = gemm(*self._lm_consts, r)  # vLLM computes one logits row per request
        return terms


def _window_pairs(positions: np.ndarray, window: int) -> np.ndarray:
    """``sum_{q=1..m} min(q, window)`` for each ``m`` in ``positions`` (keys the first ``m`` queries attend)."""
    m = np.asarray(positions, dtype=np.float64)
    w = float(window)
    return np.where(m <= w, m * (m + 1.0) * 0.5, w * (w + 1.0) * 0.5 + (m - w) * w)


def _window_bound(
    window: int, dr: int, dctx: float, pr: int, pt: float, pctx: float, pnc: float, pcausal: float
) -> WindowTotals:
    """Window totals from the plain totals, each capped at ``count x window`` (see step_time_totals)."""
    causal = min(pcausal, pt * window)
    pairs = min(pnc + pcausal, pt * window)
    return (min(dctx, dr * window), min(pctx, pr * window), max(0.0, pairs - causal), causal)


def _totals(new_tokens: np.ndarray, context_tokens: np.ndarray) -> tuple[int, float, float, float, float, int, float]:
    """The batch totals :meth:`StepTimeModel.step_time_totals` takes, decode requests split out."""
    n = np.asarray(new_tokens, dtype=np.float64)
    c = np.asarray(context_tokens, dtype=np.float64)
    decode = n == 1.0
    return (
        len(n),
        float(n.sum()),
        float(c.sum()),
        float(n @ c),
        float(n @ (n + 1.0)),
        int(decode.sum()),
        float(c[decode].sum()),
    )
