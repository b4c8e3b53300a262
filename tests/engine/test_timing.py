"""Step-time model: the kernel roofline, each term's scaling, exact totals, and pins against public profiles."""

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from sim.config.presets import HardwarePreset, ModelPreset
from sim.core.kv.shapes import AttentionLayerShape, MambaLayerShape, ModelShape
from sim.engine.timing import (
    A100_80G,
    CALIBRATED,
    Gemm,
    StepTimeModel,
    TimingParams,
    kernel_time,
    model_gemms,
)
from sim.timing.check import compare, predict, summarize
from sim.timing.profiles import load_profile, profiled_steps

ATTN = AttentionLayerShape(num_kv_heads=1, head_size=4)  # 1 * (4 + 4) * 2 = 16 bytes per token
MAMBA = MambaLayerShape(state_shapes=((2, 3), (4, 5)), state_dtype_bytes=(2, 4))  # 12 + 80 = 92 bytes
PROFILES = Path(__file__).resolve().parents[1] / "data" / "profiles"
A100_LLAMA3 = PROFILES / "a100" / "meta-llama" / "Meta-Llama-3-8B"


def tiny(layers, *, experts=0, topk=0, expert_params=0) -> ModelPreset:
    return ModelPreset(
        name="tiny",
        hf_repo="-",
        shape=ModelShape("tiny", tuple(layers), 1024),
        hidden_size=8,
        vocab_size=50,
        num_decoder_layers=len(layers),
        num_attention_layers=sum(isinstance(layer, AttentionLayerShape) for layer in layers),
        num_mamba_layers=sum(isinstance(layer, MambaLayerShape) for layer in layers),
        num_mlp_layers=1,
        num_moe_layers=1 if experts else 0,
        num_attention_heads=2,
        num_kv_heads=1,
        head_dim=4,
        mlp_intermediate_size=16,
        moe_intermediate_size=0,
        shared_expert_intermediate_size=0,
        num_experts=experts,
        experts_per_token=topk,
        embedding_params=400,
        lm_head_params=400,
        dense_params=1000,
        expert_params=expert_params,
    )


HW = HardwarePreset(
    "toy", memory_bytes=10**9, memory_bandwidth=1e5, bf16_flops=1e6, compute_capability=(0, 0), source="test"
)
PARAMS = TimingParams(
    step_overhead_s=0.01,
    per_request_overhead_s=0.001,
    compute_efficiency=0.5,
    memory_efficiency=0.5,
    kernel_floor_s=0.0,
    transition_k=2.0,
    gemm_row_tile=1,
)


def test_kernel_time_is_a_smooth_roofline():
    assert kernel_time(3.0, 4.0, 1.0, 2.0) == 6.0  # floor + Euclidean norm
    assert kernel_time(3.0, 4.0, 0.0, 1.0) == pytest.approx(7.0)  # k = 1: the two add up
    assert kernel_time(3.0, 4.0, 0.0, 64.0) == pytest.approx(4.0, rel=1e-2)  # large k: the hard max
    assert kernel_time(3.0, 4.0, 0.0, 2.0) > max(3.0, 4.0)  # the corner is rounded, never below the max


def test_exact_gemm_term():
    st = StepTimeModel(tiny([ATTN]), HW, PARAMS)
    g = Gemm(8, 16, 1)
    # 5 rows: 2 * 5 * 128 FLOPs at 0.5e6; (128 * 2 + 5 * 24 * 2) bytes at 0.5e5
    c, m = 2 * 5 * 128 / 0.5e6, (128 * 2 + 5 * 24 * 2) / 0.5e5
    assert st.gemm_time(g, 5) == pytest.approx(np.hypot(c, m), rel=1e-12)


def test_gemm_row_tile_quantizes_compute_above_one_tile():
    """The A100 profile: up_proj over 136 rows costs about what 256 rows cost (0.271 ms vs 0.291 ms)."""
    llama = load_profile(A100_LLAMA3).model(32)
    up = model_gemms(llama)["mlp"][0]
    hw_a100 = StepTimeModel.from_presets(llama, "a100-80g")
    assert hw_a100.params.gemm_row_tile == 64
    assert hw_a100.gemm_time(up, 136) > 1.2 * hw_a100.gemm_time(up, 128)  # computes 192 rows
    assert hw_a100.gemm_time(up, 136) == pytest.approx(hw_a100.gemm_time(up, 192), rel=0.02)
    flat = StepTimeModel(llama, hw_a100.hardware, replace(A100_80G, gemm_row_tile=1))
    assert flat.gemm_time(up, 136) < 1.05 * flat.gemm_time(up, 128)


def test_breakdown_sums_to_step_time_and_splits_decode_from_prefill():
    st = StepTimeModel.from_presets("llama-3.1-8b", "a100-80g")
    batch = [(512, 0)] + [(1, 2000)] * 16
    terms = st.breakdown(batch)
    assert {"attn_proj", "mlp", "attn_decode", "attn_prefill", "small_ops", "lm_head", "cpu"} == set(terms)
    assert sum(terms.values()) == pytest.approx(st.step_time(batch), rel=1e-12)
    assert "attn_prefill" not in st.breakdown([(1, 2000)] * 16)
    assert "attn_decode" not in st.breakdown([(512, 0)])


def test_attention_grows_with_context():
    st = StepTimeModel.from_presets("llama-3.1-8b", "h100-80g")
    times = [st.step_time([(1, c)] * 64) for c in (0, 1000, 4000, 16000, 64000)]
    assert all(a < b for a, b in zip(times, times[1:]))
    prefill = [st.step_time([(2048, c)]) for c in (0, 8192, 32768)]
    assert all(a < b for a, b in zip(prefill, prefill[1:]))


def test_mamba_is_flat_in_context():
    st = StepTimeModel(tiny([MAMBA, MAMBA]), HW, PARAMS)
    assert st.step_time([(1, 0)] * 8) == st.step_time([(1, 100_000)] * 8)
    assert st.step_time([(64, 0)]) == st.step_time([(64, 500_000)])
    assert st.step_time([(1, 0)] * 16) > st.step_time([(1, 0)] * 8)  # state traffic per request


def test_hybrid_context_cost_is_attention_only():
    hybrid = StepTimeModel.from_presets("nemotron-h-8b", "h100-80g")
    dense = StepTimeModel.from_presets("llama-3.1-8b", "h100-80g")
    batch = [(1, 32000)] * 32
    # Same attention shape (32 heads, 8 KV heads, head_dim 128): 4 attention layers vs 32 -> exactly 8x less
    assert dense.breakdown(batch)["attn_decode"] == pytest.approx(8 * hybrid.breakdown(batch)["attn_decode"], rel=1e-12)
    hb = hybrid.breakdown(batch)
    assert hb["mamba_state"] == hybrid.breakdown([(1, 0)] * 32)["mamba_state"]


def test_moe_experts_touched():
    fast = HardwarePreset("fast-math", 10**9, 1e5, 1e30, (0, 0), "test")  # compute ~free: the term is its memory
    st = StepTimeModel(tiny([ATTN], experts=8, topk=2, expert_params=8000), fast, PARAMS)
    one = st.breakdown([(1, 0)])["moe"]
    assert one == pytest.approx(8000 * 2 * (2 / 8) / 0.5e5, rel=1e-9)  # one token reads its 2 of 8 experts
    many = st.breakdown([(1, 0)] * 1000)["moe"]
    assert many == pytest.approx(8000 * 2 / 0.5e5, rel=1e-9)  # every expert touched


def test_empty_batch_costs_nothing():
    st = StepTimeModel.from_presets("nemotron-h-8b", "h100-80g")
    assert st.step_time([]) == 0.0 and st.breakdown([]) == {}


def test_overrides_and_calibrated_presets():
    base = StepTimeModel.from_presets("nemotron-h-8b", "h100-80g")
    assert base.params == CALIBRATED["h100-80g"]
    assert StepTimeModel.from_presets("llama-3.1-8b", "a100-80g").params == A100_80G
    assert StepTimeModel.from_presets("llama-3.1-8b", "l40s").params == TimingParams()
    faster = StepTimeModel.from_presets(
        "nemotron-h-8b",
        "h100-80g",
        {"memory_bandwidth": 2 * 3.35e12, "step_overhead_s": 0.0, "compute_efficiency": None},
    )
    assert faster.hardware.memory_bandwidth == 6.7e12
    assert faster.params.compute_efficiency == base.params.compute_efficiency
    assert faster.step_time([(1, 100)]) < base.step_time([(1, 100)])
    with pytest.raises(ValueError, match=r"unknown step-time override 'overhead'.*valid: memory_bytes"):
        StepTimeModel.from_presets("nemotron-h-8b", "h100-80g", {"overhead": 1})
    with pytest.raises(ValueError, match="memory_efficiency must be in"):
        StepTimeModel.from_presets("nemotron-h-8b", "h100-80g", {"memory_efficiency": 1.5})
    with pytest.raises(ValueError, match="gemm_row_tile must be an integer"):
        TimingParams(gemm_row_tile=0)


def test_totals_match_arrays_bit_for_bit():
    """The engine's per-step path (integer totals, decodes split out) equals the NumPy path exactly."""
    st = StepTimeModel(tiny([ATTN, MAMBA], experts=8, topk=2, expert_params=300), HW, PARAMS)
    rng = np.random.default_rng(3)
    for _ in range(200):
        k = int(rng.integers(1, 200))
        n = rng.choice([1, 1, 1, 1040, 8192], size=k)
        c = rng.integers(0, 131072, size=k)
        d = n == 1
        totals = (k, int(n.sum()), int(c.sum()), int((n * c).sum()), int((n * (n + 1)).sum()))
        got = st.step_time_totals(*totals, decode_requests=int(d.sum()), decode_context=int(c[d].sum()))
        assert got == st.step_time_arrays(n.astype(float), c.astype(float))
        # the loop's form: decodes in aggregate, prefill chunks as (n, c) pairs
        chunks = [(int(a), int(b)) for a, b in zip(n[~d], c[~d])]
        assert st.step_time_of_batch(int(d.sum()), int(c[d].sum()), chunks) == got
    assert st.step_time_totals(0, 0, 0, 0, 0) == 0.0
    assert st.step_time_of_batch(0, 0, []) == 0.0


def _reference_step_time(st: StepTimeModel, r, t, ctx, nc, nn1, dr, dctx) -> float:
    """The per-step sum in its original order, from the public per-term pieces (no memo involved)."""
    terms = st._terms(r, t, ctx, nc, nn1, dr, dctx)
    total = 0.0
    for gemms in model_gemms(st.model).values():
        for g in gemms:
            total += g.count * st.gemm_time(g, t)
    total += terms.get("moe", 0.0)
    total += terms.get("mamba_state", 0.0)
    total += terms.get("attn_decode", 0.0) + terms.get("attn_prefill", 0.0)
    total += terms["small_ops"]
    total += terms["lm_head"]
    p = st.params
    return p.step_overhead_s + p.per_request_overhead_s * r + total


def test_memoized_step_time_is_bit_identical_to_the_unmemoized_sum():
    """The per-token and per-request memos of the engine's path change no bit, whatever was asked before:
    the same token total recurs with other request counts and contexts, and the same request count with
    other token totals."""
    st = StepTimeModel(tiny([ATTN, MAMBA], experts=8, topk=2, expert_params=300), HW, PARAMS)
    rng = np.random.default_rng(7)
    for _ in range(400):
        dr = int(rng.integers(0, 6))
        chunks = [
            (int(n), int(c))
            for n, c in zip(rng.integers(2, 9, size=int(rng.integers(0, 3))), rng.integers(0, 50, size=3))
        ]
        r = dr + len(chunks)
        if r == 0:
            continue
        dctx = int(rng.integers(0, 100)) * dr
        t = dr + sum(n for n, _ in chunks)
        ctx = dctx + sum(c for _, c in chunks)
        nc = dctx + sum(n * c for n, c in chunks)
        nn1 = 2 * dr + sum(n * (n + 1) for n, _ in chunks)
        got = st.step_time_totals(r, t, ctx, nc, nn1, decode_requests=dr, decode_context=dctx)
        assert got == _reference_step_time(st, r, t, ctx, nc, nn1, dr, dctx), (r, t, dr)
    # small token totals recur: the memo was exercised, not bypassed
    assert len(st._token_memo) < 400 and len(st._request_memo) <= 12


def test_step_time_memos_stay_bounded():
    class SmallMemo(StepTimeModel):
        _MEMO_LIMIT = 4

    st = SmallMemo(tiny([ATTN]), HW, PARAMS)
    plain = StepTimeModel(tiny([ATTN]), HW, PARAMS)
    for t in range(1, 30):
        assert st.step_time_totals(t, t, 10 * t, 10 * t, 2 * t, decode_requests=t, decode_context=10 * t) == (
            plain.step_time_totals(t, t, 10 * t, 10 * t, 2 * t, decode_requests=t, decode_context=10 * t)
        )
        assert len(st._token_memo) <= 4 and len(st._request_memo) <= 4


# --------------------------------------------------------------------------- against the public A100 profile

# (step label, profiled ms from the extract, predicted ms with the A100 preset, error bound)
PINNED = (
    ("decode b=1 at 1024", 10.627, 10.5604, 0.01),
    ("decode b=40 at 4096", 24.261, 23.5627, 0.03),  # the last batch of one wave (320 of 324 blocks)
    ("decode b=48 at 4096", 31.173, 29.1862, 0.07),  # two waves: was -13.2% with a plain roofline
    ("decode b=64 at 4096", 33.382, 33.0918, 0.01),
    ("decode b=136 at 4096", 62.554, 61.9184, 0.015),  # four waves
    ("decode b=256 at 1024", 40.047, 42.4351, 0.065),
    ("prefill 2048 on 0", 152.889, 152.2169, 0.01),
    ("prefill 4096 on 8192", 406.289, 416.3051, 0.03),
    ("mixed 1024 + b=64 at 1024", 91.395, 86.4354, 0.06),
)

# (KV length, batch b, profiled ms per layer at b and b + 1, predicted ms at b and b + 1): FlashInfer's
# decode kernel where a new wave of thread blocks starts (8 KV heads x b blocks vs 324 A100 slots).
WAVE_EDGES = (
    (4096, 40, 0.408, 0.508, 0.4069, 0.5596),
    (4096, 81, 0.796, 0.884, 0.8045, 0.9526),
    (4096, 121, 1.168, 1.229, 1.1973, 1.3452),
    (1024, 40, 0.114, 0.146, 0.1163, 0.1545),
)


@pytest.fixture(scope="module")
def a100_rows():
    profile = load_profile(A100_LLAMA3)
    st = StepTimeModel.from_presets(profile.model(32), "a100-80g")
    return st, compare(st, profiled_steps(profile, 32))


def test_pinned_steps_against_the_a100_extract(a100_rows):
    st, rows = a100_rows
    by_label = {r.step.label: r for r in rows}
    for label, profiled_ms, predicted_ms, bound in PINNED:
        row = by_label[label]
        assert row.profiled_s * 1e3 == pytest.approx(profiled_ms, abs=5e-4)
        assert row.predicted_s * 1e3 == pytest.approx(predicted_ms, abs=5e-4)
        assert row.predicted_s == predict(st, row.step)
        assert abs(row.error) <= bound, (label, row.error)


def test_a100_preset_meets_the_calibration_bounds(a100_rows):
    _, rows = a100_rows
    summary = {s.regime: s for s in summarize(rows)}
    assert summary["prefill"].mape <= 0.05 and summary["decode"].mape <= 0.05 and summary["mixed"].mape <= 0.05
    assert summary["decode"].steps == 44
    assert max(abs(r.error) for r in rows if r.step.regime == "decode") <= 0.08  # every decode step


def _profiled_decode_ms(b: int, kv: int) -> float:
    att = load_profile(A100_LLAMA3).attention
    assert att is not None
    row = att[~att["is_prefill"] & (att["batch_size"] == b) & (att["kv_cache_size"] == kv)]
    return float(row["time_stats.attn_decode.median"].iloc[0])


def test_decode_kernel_steps_up_where_a_wave_starts(a100_rows):
    """Batch 40 -> 41 at 4096 context: FlashInfer's kernel 0.408 -> 0.508 ms (+25%); the model steps up too."""
    st, _ = a100_rows
    for kv, b, prof_b, prof_next, pred_b, pred_next in WAVE_EDGES:
        assert _profiled_decode_ms(b, kv) == pytest.approx(prof_b) and _profiled_decode_ms(b + 1, kv) == prof_next
        got_b, got_next = (st.attention_decode_time(x, x * kv) * 1e3 for x in (b, b + 1))
        assert (got_b, got_next) == (pytest.approx(pred_b, abs=5e-5), pytest.approx(pred_next, abs=5e-5))
        # the kernel alone (the step at b + 1 has no linear-op rows; the kernel is ~2/3 of it at 4096)
        assert abs(got_b / prof_b - 1) < 0.03 and abs(got_next / prof_next - 1) < 0.11
        # a roofline would add one request's KV (+1-2.5%); the new wave adds one block's own streaming time
        assert got_next / got_b > 1.1 and prof_next / prof_b > 1.05
    # inside a wave, one more request costs about its KV
    assert st.attention_decode_time(40, 40 * 4096) / st.attention_decode_time(39, 39 * 4096) < 1.03


def test_decode_waves_are_whole_waves_plus_a_tail():
    """Toy GPU: 2 SMs x 2 blocks = 4 slots, 1 KV head (one block per request)."""
    hw = HardwarePreset("waves", 10**9, 1e5, 1e6, (0, 0), "test", sm_count=2)
    params = replace(PARAMS, attn_floor_s=0.0, attn_decode_ctas_per_sm=2, attn_decode_cta_bandwidth=4e4)
    st = StepTimeModel(tiny([ATTN]), hw, params)
    plain = StepTimeModel(tiny([ATTN]), hw, replace(params, attn_decode_ctas_per_sm=0))
    no_sms = StepTimeModel(tiny([ATTN]), replace(hw, sm_count=0), params)

    def t(model: StepTimeModel, b: int) -> float:
        return model.attention_decode_time(b, b * 100)

    for b in (1, 2, 3, 4):  # up to one wave FlashInfer splits the KV to fill the GPU: the plain roofline
        assert t(st, b) == t(plain, b)
    full = t(plain, 4)
    alone = 16 * 100 / 4e4  # one block's 100 tokens x 16 bytes at its own bandwidth
    assert t(st, 5) == pytest.approx(full + kernel_time(alone, t(plain, 1), 0.0, 2.0), rel=1e-12)
    assert t(st, 8) == pytest.approx(2 * full, rel=1e-12) and t(st, 12) == pytest.approx(3 * full, rel=1e-12)
    assert t(st, 5) < t(st, 6) < t(st, 7) <= t(st, 8) < t(st, 9)
    assert t(st, 5) > 1.2 * t(plain, 5)  # the roofline adds a fifth of a wave; the tail adds ~half of one
    assert all(t(no_sms, b) == t(plain, b) for b in (1, 5, 9))
    with pytest.raises(ValueError, match="attn_decode_ctas_per_sm must be an integer >= 0"):
        replace(params, attn_decode_ctas_per_sm=-1)
    with pytest.raises(ValueError, match="attn_decode_cta_bandwidth must be > 0"):
        replace(params, attn_decode_cta_bandwidth=0.0)


# --------------------------------------------------------------------------- sliding-window layers

SWA = AttentionLayerShape(num_kv_heads=1, head_size=4, window=64)


def test_sliding_window_decode_reads_at_most_the_window():
    swa, full = StepTimeModel(tiny([SWA]), HW, PARAMS), StepTimeModel(tiny([ATTN]), HW, PARAMS)
    batch = [(1, 1000), (1, 30), (1, 5000)]
    capped = [(1, 64), (1, 30), (1, 64)]
    assert swa.breakdown(batch)["attn_decode"] == full.breakdown(capped)["attn_decode"]
    assert swa.step_time([(1, 64)] * 8) == swa.step_time([(1, 100_000)] * 8)  # flat beyond the window
    assert swa.step_time([(1, 10)] * 8) < swa.step_time([(1, 64)] * 8)
    hybrid = StepTimeModel(tiny([ATTN, SWA]), HW, PARAMS)  # one layer of each: the terms add up per layer
    assert hybrid.breakdown(batch)["attn_decode"] == pytest.approx(
        full.breakdown(batch)["attn_decode"] + full.breakdown(capped)["attn_decode"], rel=1e-12
    )


def test_sliding_window_prefill_counts_pairs_inside_the_window():
    swa = StepTimeModel(tiny([SWA]), HW, PARAMS)
    kvb = SWA.bytes_per_token
    # 100 new tokens on no context: query j attends min(j, 64) keys -> 64*65/2 + 36*64 = 4384 causal pairs
    assert swa.breakdown([(100, 0)])["attn_prefill"] == swa.prefill_kernel_time(kvb, 100, 0, 0, 4384)
    # on 500 cached tokens: 64 keys per query (6400 pairs), 4384 of them among the new tokens; 64 cached read
    assert swa.breakdown([(100, 500)])["attn_prefill"] == swa.prefill_kernel_time(kvb, 100, 64, 6400 - 4384, 4384)
    # short chunks inside the window cost what full attention does
    full = StepTimeModel(tiny([ATTN]), HW, PARAMS)
    assert swa.breakdown([(20, 30)])["attn_prefill"] == full.breakdown([(20, 30)])["attn_prefill"]
    assert StepTimeModel(tiny([SWA]), HW, PARAMS).prefill_flops(100) == pytest.approx(
        StepTimeModel(tiny([ATTN]), HW, PARAMS).prefill_flops(100) - 4 * 2 * 4 * (5050 - 4384)
    )


def test_sliding_window_from_totals_caps_each_total_at_count_times_window():
    st = StepTimeModel(tiny([ATTN, SWA]), HW, PARAMS)
    uncapped = StepTimeModel(tiny([ATTN, ATTN]), HW, PARAMS)

    def from_totals(batch):
        n = np.array([b[0] for b in batch], dtype=float)
        c = np.array([b[1] for b in batch], dtype=float)
        d = n == 1
        return st.step_time_totals(
            len(n),
            n.sum(),
            c.sum(),
            (n * c).sum(),
            (n * (n + 1)).sum(),
            decode_requests=int(d.sum()),
            decode_context=float(c[d].sum()),
        )

    beyond = [(1, 500), (1, 9000), (1, 64)]  # every decode context at or beyond the window: exact
    assert from_totals(beyond) == pytest.approx(st.step_time(beyond), rel=1e-12)
    mixed = [(1, 10), (1, 9000), (30, 0), (200, 300)]
    assert st.step_time(mixed) < from_totals(mixed) < uncapped.step_time(mixed)
    windowed = st.window_totals(np.array([b[0] for b in mixed], float), np.array([b[1] for b in mixed], float))
    # decodes 10 + 64; chunks read 0 + 64 cached; 200 queries x 64 keys, 2080 + 136*64 of them causal, + 465
    assert windowed == {64: (74.0, 64.0, 64.0 * 200 - (2080 + 136 * 64), 465.0 + 2080 + 136 * 64)}
