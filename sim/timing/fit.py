"""Fit the step-time model's efficiencies and floors to a profile (a bounded coordinate search, then SciPy least squares).

Each group of :class:`~sim.engine.timing.TimingParams` is fitted to the
profile rows of the kernels it prices, in this order (later groups keep the
earlier ones fixed):

1. GEMMs (``compute_efficiency``, ``memory_efficiency``, ``kernel_floor_s``,
   ``transition_k``, ``gemm_row_tile``): the four projections of ``mlp.csv``
   (``attn_pre_proj``, ``attn_post_proj``, ``mlp_up_proj``, ``mlp_down_proj``)
   at every token count.
2. Small ops (``elementwise_memory_efficiency``, ``small_op_floor_s``): the
   small-op part of every profiled step.
3. Attention decode (``attn_decode_memory_efficiency``, ``attn_floor_s``,
   ``attn_decode_ctas_per_sm``, ``attn_decode_cta_bandwidth``): the decode
   rows of ``attention.csv`` (the blocks per SM among a few integers, with
   the hardware's ``sm_count``).
4. Attention prefill (``attn_prefill_efficiency``, ``attn_context_efficiency``,
   ``attn_prefill_token_s``): its prefill rows.

The objective is the (weighted) mean squared log ratio of predicted to profiled time
(relative error, symmetric). The search is coordinate descent: each parameter
in turn tries a geometric fan of values around the current one inside its
bounds (discrete parameters try every candidate), keeps the best, and the fan
narrows every sweep; then bounded least squares (``scipy.optimize.least_squares``)
polishes the continuous parameters, whose coordinate-wise search stalls where
two of them trade off. Deterministic; the Mamba terms are not fitted (a Vidur
profile has no Mamba layer).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np

from sim.config.presets import HardwarePreset, ModelPreset
from sim.engine.timing import Gemm, StepTimeModel, TimingParams, model_gemms
from sim.timing.profiles import Profile, ProfiledStep, _col

#: ``(lower, upper)`` bounds of each fitted continuous parameter.
BOUNDS: dict[str, tuple[float, float]] = {
    "compute_efficiency": (0.05, 1.0),
    "memory_efficiency": (0.05, 1.0),
    "kernel_floor_s": (1e-8, 1e-4),
    "transition_k": (1.0, 8.0),
    "elementwise_memory_efficiency": (0.02, 1.0),
    "small_op_floor_s": (1e-8, 1e-4),
    "attn_decode_memory_efficiency": (0.05, 1.0),
    "attn_floor_s": (1e-8, 2e-4),
    "attn_decode_cta_bandwidth": (1e8, 1e12),
    "attn_prefill_efficiency": (0.05, 1.0),
    "attn_context_efficiency": (0.05, 1.0),
    "attn_prefill_token_s": (1e-12, 1e-6),
}
#: Candidate values of discrete parameters.
CHOICES: dict[str, tuple[int, ...]] = {
    "gemm_row_tile": (1, 64, 128, 256),
    "attn_decode_ctas_per_sm": (0, 1, 2, 3, 4, 6, 8),
}

GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("gemm", ("compute_efficiency", "memory_efficiency", "kernel_floor_s", "transition_k", "gemm_row_tile")),
    ("small_ops", ("elementwise_memory_efficiency", "small_op_floor_s")),
    (
        "attn_decode",
        ("attn_decode_ctas_per_sm", "attn_decode_memory_efficiency", "attn_floor_s", "attn_decode_cta_bandwidth"),
    ),
    ("attn_prefill", ("attn_prefill_efficiency", "attn_context_efficiency", "attn_prefill_token_s")),
)

#: One observation: the profiled seconds, how to predict it from a model, and its weight.
Observation = tuple[float, Callable[[StepTimeModel], float], float]


def _gemm_term(g: Gemm, t: float) -> Callable[[StepTimeModel], float]:
    """The model's time for GEMM ``g`` over ``t`` rows."""
    return lambda st: st.gemm_time(g, t)


def _small_ops_term(t: float) -> Callable[[StepTimeModel], float]:
    """The model's small-ops time for ``t`` tokens."""
    return lambda st: st.small_ops_time(t)


def _prefill_term(n: float, c: float) -> Callable[[StepTimeModel], float]:
    """The model's attention time for one ``n``-token prefill chunk after ``c`` context tokens."""
    return lambda st: st.attention_prefill_time(n, c, n * c, n * (n + 1) / 2)


def _decode_term(b: float, c: float) -> Callable[[StepTimeModel], float]:
    """The model's attention time for ``b`` decodes of ``c`` context tokens each."""
    return lambda st: st.attention_decode_time(b, b * c)


def _replaced(params: TimingParams, changes: Mapping[str, Any]) -> TimingParams:
    """``dataclasses.replace`` with field names chosen at run time (``replace`` checks them)."""
    return replace(params, **changes)


@dataclass(frozen=True)
class GroupFit:
    name: str
    observations: int
    rms_log_error: float


@dataclass(frozen=True)
class FitResult:
    params: TimingParams
    groups: tuple[GroupFit, ...]

    def fitted_names(self) -> list[str]:
        names = dict(GROUPS)
        return [n for g in self.groups for n in names[g.name]]


def _gemm_observations(profile: Profile, model: ModelPreset) -> list[Observation]:
    """The four projections at every token count, each power-of-two band of token counts weighted equally.

    (Vidur's token grid is dense at large counts; unweighted, prefill-sized
    GEMMs would outvote the decode-sized ones.)
    """
    qkv, o = model_gemms(model)["attn_proj"]
    up, down = model_gemms(model)["mlp"]
    bands: dict[int, int] = {}
    for tokens in profile.mlp.index:
        bands[int(math.log2(int(tokens)))] = bands.get(int(math.log2(int(tokens))), 0) + 1
    out: list[Observation] = []
    for tokens, row in profile.mlp.iterrows():
        t = float(tokens)
        w = 1.0 / bands[int(math.log2(int(tokens)))]
        for op, g in (("attn_pre_proj", qkv), ("attn_post_proj", o), ("mlp_up_proj", up), ("mlp_down_proj", down)):
            out.append((float(row[_col(op)]) * 1e-3, _gemm_term(g, t), w))
    return out


def _small_observations(steps: Sequence[ProfiledStep]) -> list[Observation]:
    seen: dict[tuple[int, float], Observation] = {}
    for s in steps:
        t = float(sum(n for n, _ in s.batch))
        key = (int(t), s.parts["small_ops"])
        seen.setdefault(key, (s.parts["small_ops"], _small_ops_term(t), 1.0))
    return list(seen.values())


def _attention_observations(profile: Profile) -> tuple[list[Observation], list[Observation]]:
    decode: list[Observation] = []
    prefill: list[Observation] = []
    if profile.attention is None:
        return decode, prefill
    for _, row in profile.attention.iterrows():
        b, n, c = float(row["batch_size"]), float(row["prefill_chunk_size"]), float(row["kv_cache_size"])
        if row["is_prefill"] and b == 1 and n > 0:
            prefill.append((float(row[_col("attn_prefill")]) * 1e-3, _prefill_term(n, c), 1.0))
        elif not row["is_prefill"] and c > 0:
            decode.append((float(row[_col("attn_decode")]) * 1e-3, _decode_term(b, c), 1.0))
    return decode, prefill


def _objective(model: ModelPreset, hardware: HardwarePreset, params: TimingParams, obs: Sequence[Observation]) -> float:
    st = StepTimeModel(model, hardware, params)
    total = weights = 0.0
    for seconds, predict, w in obs:
        if seconds <= 0:
            continue
        total += w * math.log(predict(st) / seconds) ** 2
        weights += w
    return total / weights if weights else 0.0


def _residuals(
    model: ModelPreset, hardware: HardwarePreset, params: TimingParams, obs: Sequence[Observation]
) -> np.ndarray:
    st = StepTimeModel(model, hardware, params)
    return np.array([math.sqrt(w) * math.log(predict(st) / seconds) for seconds, predict, w in obs if seconds > 0])


def _refine(
    model: ModelPreset,
    hardware: HardwarePreset,
    params: TimingParams,
    names: Sequence[str],
    obs: Sequence[Observation],
    max_evaluations: int = 200,
) -> TimingParams:
    """Polish the continuous ``names`` by bounded nonlinear least squares on the log residuals, in
    log-parameter space within :data:`BOUNDS` (``scipy.optimize.least_squares``, trust-region reflective,
    numerical Jacobian). Deterministic: no random start."""
    from scipy.optimize import least_squares

    cont = [n for n in names if n not in CHOICES]
    if not cont:
        return params
    lo = np.log([BOUNDS[n][0] for n in cont])
    hi = np.log([BOUNDS[n][1] for n in cont])

    def at(x: np.ndarray) -> TimingParams:
        return _replaced(params, {n: float(math.exp(v)) for n, v in zip(cont, np.clip(x, lo, hi))})

    x0 = np.clip(np.log([getattr(params, n) for n in cont]), lo, hi)
    fit = least_squares(
        lambda x: _residuals(model, hardware, at(x), obs), x0, bounds=(lo, hi), method="trf", max_nfev=max_evaluations
    )
    polished = at(fit.x)
    # Keep the search's answer if the polish did not improve on it (it never should, but a flat start can).
    if _objective(model, hardware, polished, obs) <= _objective(model, hardware, params, obs):
        return polished
    return params


def _search(
    model: ModelPreset,
    hardware: HardwarePreset,
    params: TimingParams,
    names: Sequence[str],
    obs: Sequence[Observation],
    sweeps: int = 14,
) -> TimingParams:
    best = _objective(model, hardware, params, obs)
    spread = 2.0
    for _ in range(sweeps):
        for name in names:
            current = getattr(params, name)
            if name in CHOICES:
                candidates: list[float] = list(CHOICES[name])
            else:
                lo, hi = BOUNDS[name]
                base = min(max(current, lo), hi)
                candidates = [min(hi, max(lo, base * spread ** (i / 4))) for i in range(-4, 5)]
            for value in candidates:
                trial = _replaced(params, {name: value})
                score = _objective(model, hardware, trial, obs)
                if score < best:
                    best, params = score, trial
        spread = 1.0 + (spread - 1.0) * 0.6
    return params


def fit_profile(
    profile: Profile,
    model: ModelPreset,
    hardware: HardwarePreset,
    steps: Sequence[ProfiledStep],
    start: TimingParams = TimingParams(),
) -> FitResult:
    """Fit every group the profile has rows for (attention groups need ``attention.csv``)."""
    decode, prefill = _attention_observations(profile)
    data = {
        "gemm": _gemm_observations(profile, model),
        "small_ops": _small_observations(steps),
        "attn_decode": decode,
        "attn_prefill": prefill,
    }
    params = start
    groups = []
    for name, names in GROUPS:
        obs = data[name]
        if not obs:
            continue
        params = _refine(model, hardware, _search(model, hardware, params, names, obs), names, obs)
        groups.append(GroupFit(name, len(obs), math.sqrt(_objective(model, hardware, params, obs))))
    return FitResult(params, tuple(groups))


def override_document(result: FitResult, hardware: HardwarePreset, source: str) -> dict:
    """The YAML mapping ``hardware.overrides_path`` reads: the fitted fields, rounded to 4 significant digits."""
    by_name = {f.name for f in fields(TimingParams)}
    overrides: dict[str, float | int] = {}
    for name in result.fitted_names():
        assert name in by_name
        value = getattr(result.params, name)
        overrides[name] = value if isinstance(value, int) else float(f"{value:.4g}")
    return {"fitted_on": hardware.name, "source": source, "overrides": overrides}
