"""Step-time model: context growth for attention, flat for Mamba, an exact hand-computed batch."""


import numpy as np
import pytest

from sim.config.presets import HardwarePreset, ModelPreset
from sim.engine.timing import StepTimeModel, TimingParams
from sim.kv.shapes import AttentionLayerShape, MambaLayerShape, ModelShape

ATTN = AttentionLayerShape(num_kv_heads=1, head_size=4)  # 1 * (4 + 4) * 2 = 16 bytes per token
MAMBA = MambaLayerShape(state_shapes=((2, 3), (4, 5)), state_dtype_bytes=(2, 4))  # 12 + 80 = 92 bytes


def tiny(layers, *, experts=0, topk=0, expert_params=0) -> ModelPreset:
    return ModelPreset(
        name="tiny", hf_repo="-", shape=ModelShape("tiny", tuple(layers), 1024),
        hidden_size=8, vocab_size=50, num_decoder_layers=len(layers),
        num_attention_layers=sum(isinstance(l, AttentionLayerShape) for l in layers),
        num_mamba_layers=sum(isinstance(l, MambaLayerShape) for l in layers),
        num_mlp_layers=1, num_moe_layers=1 if experts else 0,
        num_attention_heads=2, num_kv_heads=1, head_dim=4,
        mlp_intermediate_size=16, moe_intermediate_size=0, shared_expert_intermediate_size=0,
        num_experts=experts, experts_per_token=topk,
        embedding_params=400, lm_head_params=100, dense_params=1000, expert_params=expert_params,
    )


HW = HardwarePreset("toy", memory_bytes=10**9, memory_bandwidth=1e5, bf16_flops=1e6, compute_capability=(0, 0), source="test")
PARAMS = TimingParams(step_overhead_s=0.01, per_request_overhead_s=0.001, compute_efficiency=0.5, memory_efficiency=0.5)


def test_exact_hand_computed_batch():
    st = StepTimeModel(tiny([ATTN, MAMBA]), HW, PARAMS)
    batch = [(3, 5), (1, 10)]
    # T = 4 tokens, R = 2 requests, (query, key) pairs = 3*5 + 3*4/2 + 1*10 + 1*2/2 = 32
    # FLOPs = (2*1000 + 6*20) * 4 + 2*100 * 2 + (4 * 2 heads * 4 dim * 1 layer) * 32 = 9904
    # bytes = (1000 + 100) * 2 + 16 * (15 context + 2 * 4 new) + 2 * 92 * 2 = 2936
    assert st.work(batch) == (9904.0, 2936.0)
    compute, memory = 9904 / (1e6 * 0.5), 2936 / (1e5 * 0.5)
    assert memory > compute
    assert st.step_time(batch) == pytest.approx(0.01 + 2 * 0.001 + memory, rel=1e-12)
    assert st.step_time_arrays(np.array([3, 1]), np.array([5, 10])) == st.step_time(batch)


def test_compute_bound_batch_uses_flops():
    st = StepTimeModel(tiny([ATTN]), HW, PARAMS)
    batch = [(200, 0)]
    flops, mem = st.work(batch)
    assert flops / 0.5e6 > mem / 0.5e5
    assert st.step_time(batch) == pytest.approx(0.01 + 0.001 + flops / 0.5e6)


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


def test_hybrid_context_cost_is_attention_only():
    hybrid = StepTimeModel.from_presets("nemotron-h-8b", "h100-80g")
    dense = StepTimeModel.from_presets("llama-3.1-8b", "h100-80g")
    grow = lambda st: st.work([(1, 32000)] * 32)[1] - st.work([(1, 0)] * 32)[1]  # noqa: E731
    # KV bytes read grow with 4 attention layers vs 32: exactly 8x less
    assert grow(dense) == pytest.approx(8 * grow(hybrid))


def test_moe_experts_touched():
    st = StepTimeModel(tiny([ATTN], experts=8, topk=2, expert_params=8000), HW, PARAMS)
    base = StepTimeModel(tiny([ATTN]), HW, PARAMS)
    one = st.work([(1, 0)])[1] - base.work([(1, 0)])[1]
    assert one == pytest.approx(8000 * 2 * (2 / 8))  # one token reads its 2 of 8 experts
    many = st.work([(1, 0)] * 1000)[1] - base.work([(1, 0)] * 1000)[1]
    assert many == pytest.approx(8000 * 2, rel=1e-9)  # every expert touched


def test_empty_batch_costs_nothing():
    st = StepTimeModel.from_presets("nemotron-h-8b", "h100-80g")
    assert st.step_time([]) == 0.0


def test_overrides():
    base = StepTimeModel.from_presets("nemotron-h-8b", "h100-80g")
    faster = StepTimeModel.from_presets(
        "nemotron-h-8b", "h100-80g", {"memory_bandwidth": 2 * 3.35e12, "step_overhead_s": 0.0, "compute_efficiency": None}
    )
    assert faster.hardware.memory_bandwidth == 6.7e12
    assert faster.params.step_overhead_s == 0.0 and faster.params.compute_efficiency == base.params.compute_efficiency
    assert faster.step_time([(1, 100)]) < base.step_time([(1, 100)])
    with pytest.raises(ValueError, match=r"unknown step-time override 'overhead'.*valid: memory_bytes"):
        StepTimeModel.from_presets("nemotron-h-8b", "h100-80g", {"overhead": 1})
    with pytest.raises(ValueError, match="memory_efficiency must be in"):
        StepTimeModel.from_presets("nemotron-h-8b", "h100-80g", {"memory_efficiency": 1.5})


def test_totals_match_arrays_bit_for_bit():
    """The engine's per-step path (integer totals, no arrays) equals the NumPy path exactly."""
    st = StepTimeModel(tiny([ATTN, MAMBA], experts=8, topk=2, expert_params=300), HW, PARAMS)
    rng = np.random.default_rng(3)
    for _ in range(200):
        k = int(rng.integers(1, 200))
        n = rng.choice([1, 1, 1, 1040, 8192], size=k)
        c = rng.integers(0, 131072, size=k)
        totals = (k, int(n.sum()), int(c.sum()), int((n * c).sum()), int((n * (n + 1)).sum()))
        assert st.step_time_totals(*totals) == st.step_time_arrays(n.astype(float), c.astype(float))
    assert st.step_time_totals(0, 0, 0, 0, 0) == 0.0
