"""Roofline step-time model for ``clock: time`` (DESIGN.md §5).

One engine step runs one forward pass over every scheduled request. Its
duration is

    step_overhead_s + per_request_overhead_s * R
        + max(FLOPs / (bf16_flops * compute_efficiency),
              bytes / (memory_bandwidth * memory_efficiency))

over the step's work, for R scheduled requests, request i bringing ``n_i``
new tokens on top of ``c_i`` tokens of context (``T = sum n_i``):

* weights: every dense weight (and the LM head) is read once per step;
  routed experts are read as far as the step's tokens touch them, in
  expectation ``E * (1 - (1 - k/E) ** T)`` of ``E`` experts when each token
  picks ``k`` uniformly (per MoE layer). FLOPs: ``2 * T * active linear
  params`` plus ``2 * R * vocab * hidden`` for the LM head (vLLM computes one
  logits row per scheduled request).
* attention (grows with context): per attention layer, request i reads
  ``c_i + n_i`` tokens of KV and writes ``n_i``; causal score and value
  products cost ``4 * heads * head_dim`` FLOPs per (query, key) pair, and
  there are ``n_i * c_i + n_i * (n_i + 1) / 2`` pairs.
* Mamba / SSM / GDN (flat in context): each request reads and writes its
  recurrent state once per layer per step; each token costs
  ``6 * state elements`` FLOPs (decay, rank-1 update, readout).

Activation traffic and kernel launch details are folded into the efficiency
factors and the fixed overhead. The model never reads a clock; it is a pure
function of the batch, and only of its totals (``sum n_i``, ``sum c_i``,
``sum n_i * c_i``, ``sum n_i * (n_i + 1)``), so the engine feeds it integer
totals gathered in one pass (:meth:`StepTimeModel.step_time_totals`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Any, Mapping, Sequence

import numpy as np

from sim.config.presets import (
    HardwarePreset,
    ModelPreset,
    hardware_preset,
    model_preset,
)
from sim.kv.shapes import AttentionLayerShape, MambaLayerShape


@dataclass(frozen=True, slots=True)
class TimingParams:
    """Tunable constants of the step-time model (our estimates, to calibrate).

    ``step_overhead_s``: scheduler, input preparation and launch cost per step
    (vLLM v1 with CUDA graphs spends on the order of a millisecond here).
    ``per_request_overhead_s``: per scheduled request bookkeeping.
    ``compute_efficiency`` / ``memory_efficiency``: achieved fraction of the
    datasheet FLOP/s and bandwidth.
    """

    step_overhead_s: float = 1.5e-3
    per_request_overhead_s: float = 5e-6
    compute_efficiency: float = 0.6
    memory_efficiency: float = 0.8

    def __post_init__(self) -> None:
        for name in ("step_overhead_s", "per_request_overhead_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        for name in ("compute_efficiency", "memory_efficiency"):
            v = getattr(self, name)
            if not 0 < v <= 1:
                raise ValueError(f"{name} must be in (0, 1], got {v}")


HARDWARE_OVERRIDE_KEYS = ("memory_bytes", "memory_bandwidth", "bf16_flops")
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


class StepTimeModel:
    """Seconds per engine step as a function of the scheduled batch (see module docstring)."""

    __slots__ = (
        "model", "hardware", "params",
        "_flops_per_token", "_flops_per_request", "_flops_per_pair",
        "_bytes_fixed", "_expert_bytes", "_expert_pick", "_num_experts",
        "_bytes_per_kv_token", "_bytes_per_request",
        "_compute_rate", "_memory_rate",
    )

    def __init__(self, model: ModelPreset, hardware: HardwarePreset, params: TimingParams = TimingParams()):
        self.model = model
        self.hardware = hardware
        self.params = params
        wb = model.weight_dtype_bytes
        attn = [l for l in model.shape.layers if isinstance(l, AttentionLayerShape)]
        mamba = [l for l in model.shape.layers if isinstance(l, MambaLayerShape)]
        active_experts: float = 0
        if model.num_experts:
            active_experts = model.expert_params * model.experts_per_token / model.num_experts
        # The largest tensor of a recurrent state is the one the per-token update sweeps.
        state_elems = sum(max(math.prod(s) for s in layer.state_shapes) for layer in mamba)
        self._flops_per_token = 2.0 * (model.dense_params + active_experts) + 6.0 * state_elems
        self._flops_per_request = 2.0 * model.lm_head_params
        self._flops_per_pair = 4.0 * model.num_attention_heads * model.head_dim * len(attn)
        self._bytes_fixed = float((model.dense_params + model.lm_head_params) * wb)
        self._expert_bytes = float(model.expert_params * wb)
        self._num_experts = model.num_experts
        self._expert_pick = (1.0 - model.experts_per_token / model.num_experts) if model.num_experts else 0.0
        self._bytes_per_kv_token = float(sum(l.bytes_per_token for l in attn))
        self._bytes_per_request = 2.0 * sum(l.state_bytes for l in mamba)
        self._compute_rate = hardware.bf16_flops * params.compute_efficiency
        self._memory_rate = hardware.memory_bandwidth * params.memory_efficiency

    @classmethod
    def from_presets(
        cls,
        model: str | ModelPreset,
        hardware: str | HardwarePreset,
        overrides: Mapping[str, Any] | None = None,
    ) -> "StepTimeModel":
        """Build from preset names (or preset objects) and YAML overrides.

        ``overrides`` may set the hardware numbers (``memory_bytes``,
        ``memory_bandwidth``, ``bf16_flops``) and any :class:`TimingParams`
        field; ``None`` values mean "keep the preset's".
        """
        m = model_preset(model) if isinstance(model, str) else model
        hw = hardware_preset(hardware) if isinstance(hardware, str) else hardware
        hw_over, timing_over = _split_overrides(overrides)
        if hw_over:
            hw = replace(hw, **hw_over)
        return cls(m, hw, TimingParams(**timing_over))

    def step_time(self, batch: Sequence[tuple[int, int]] | np.ndarray) -> float:
        """Seconds for one step over ``batch``: ``(num_new_tokens, num_context_tokens)`` per request.

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
        flops, mem, r = self._work(new_tokens, context_tokens)
        return self._seconds(flops, mem, r)

    def work(self, batch: Sequence[tuple[int, int]] | np.ndarray) -> tuple[float, float]:
        """``(FLOPs, bytes)`` of one step over ``batch``, for inspection and tests."""
        if len(batch) == 0:
            return 0.0, 0.0
        arr = np.asarray(batch, dtype=np.float64)
        flops, mem, _ = self._work(arr[:, 0], arr[:, 1])
        return flops, mem

    def step_time_totals(self, num_requests: int, new_tokens: int, context_tokens: int,
                         new_times_context: int, new_times_new_plus_one: int) -> float:
        """As :meth:`step_time`, from the batch's integer totals (no arrays).

        ``new_tokens = sum n_i``, ``context_tokens = sum c_i``,
        ``new_times_context = sum n_i * c_i`` and ``new_times_new_plus_one =
        sum n_i * (n_i + 1)``. Equal to :meth:`step_time` bit for bit while the
        totals stay below 2**53 (float64 sums of integers are exact there).
        """
        if num_requests == 0:
            return 0.0
        flops, mem = self._work_totals(
            num_requests, float(new_tokens), float(context_tokens), float(new_times_context),
            float(new_times_new_plus_one),
        )
        return self._seconds(flops, mem, num_requests)

    def _seconds(self, flops: float, mem: float, num_requests: int) -> float:
        """The roofline: fixed and per-request overhead plus the slower of compute and memory."""
        p = self.params
        return (p.step_overhead_s + p.per_request_overhead_s * num_requests
                + max(flops / self._compute_rate, mem / self._memory_rate))

    def _work(self, new_tokens: np.ndarray, context_tokens: np.ndarray) -> tuple[float, float, int]:
        n = np.asarray(new_tokens, dtype=np.float64)
        c = np.asarray(context_tokens, dtype=np.float64)
        r = len(n)
        flops, mem = self._work_totals(r, float(n.sum()), float(c.sum()), float(n @ c), float(n @ (n + 1.0)))
        return flops, mem, r

    def _work_totals(self, r: int, t: float, ctx: float, nc: float, nn1: float) -> tuple[float, float]:
        """``(FLOPs, bytes)`` from the batch totals (see :meth:`step_time_totals`)."""
        pairs = nc + nn1 * 0.5
        flops = self._flops_per_token * t + self._flops_per_request * r + self._flops_per_pair * pairs
        expert_bytes = self._expert_bytes * (1.0 - self._expert_pick**t) if self._num_experts else 0.0
        kv_tokens = ctx + 2.0 * t  # read context and new tokens, write new tokens
        mem = self._bytes_fixed + expert_bytes + self._bytes_per_kv_token * kv_tokens + self._bytes_per_request * r
        return flops, mem
