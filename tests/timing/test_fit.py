"""The fit recovers the parameters a synthetic profile was generated with; check reports it exactly."""

import pytest
from synthetic_profile import LAYERS, TRUE, write_synthetic_profile

from sim.config.presets import hardware_preset
from sim.engine.timing import StepTimeModel, TimingParams
from sim.timing.check import compare, summarize
from sim.timing.fit import fit_profile, override_document
from sim.timing.profiles import load_profile, profiled_steps

FITTED = (
    "compute_efficiency",
    "memory_efficiency",
    "kernel_floor_s",
    "transition_k",
    "elementwise_memory_efficiency",
    "small_op_floor_s",
    "attn_decode_memory_efficiency",
    "attn_floor_s",
    "attn_decode_cta_bandwidth",
    "attn_prefill_efficiency",
    "attn_context_efficiency",
    "attn_prefill_token_s",
)


def test_fit_recovers_known_parameters(synthetic_profile):
    profile = load_profile(synthetic_profile)
    model, hw = profile.model(LAYERS), hardware_preset("a100-80g")
    steps = profiled_steps(profile, LAYERS)
    result = fit_profile(profile, model, hw, steps, start=TimingParams())  # start far from TRUE
    assert result.params.gemm_row_tile == TRUE.gemm_row_tile
    assert result.params.attn_decode_ctas_per_sm == TRUE.attn_decode_ctas_per_sm == 2  # the start has 3
    for name in FITTED:
        assert getattr(result.params, name) == pytest.approx(getattr(TRUE, name), rel=0.03), name
    assert all(g.rms_log_error < 0.01 for g in result.groups)
    rows = compare(StepTimeModel(model, hw, result.params), steps)
    assert all(s.mape < 0.01 for s in summarize(rows))


def test_check_is_exact_on_a_profile_the_model_generated(synthetic_profile):
    profile = load_profile(synthetic_profile)
    rows = compare(
        StepTimeModel(profile.model(LAYERS), hardware_preset("a100-80g"), TRUE), profiled_steps(profile, LAYERS)
    )
    assert {r.step.regime for r in rows} == {"prefill", "decode", "mixed"}
    # the synthetic small ops carry no final norm, so the small-op term is the only (tiny) mismatch
    assert max(abs(r.error) for r in rows) < 2e-3


def test_without_attention_only_gemm_and_small_ops_are_fitted(tmp_path):
    root = write_synthetic_profile(tmp_path / "linear", attention=False)
    profile = load_profile(root)
    result = fit_profile(profile, profile.model(LAYERS), hardware_preset("a100-80g"), profiled_steps(profile, LAYERS))
    assert [g.name for g in result.groups] == ["gemm", "small_ops"]
    doc = override_document(result, hardware_preset("a100-80g"), str(root))
    assert doc["fitted_on"] == "a100-80g"
    assert "attn_floor_s" not in doc["overrides"] and doc["overrides"]["gemm_row_tile"] == 128
