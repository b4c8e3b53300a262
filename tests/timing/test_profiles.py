"""Loading Vidur-format profiles and building whole steps from their rows."""

from pathlib import Path

import pandas as pd
import pytest
from synthetic_profile import LAYERS, write_synthetic_profile

from sim.timing.profiles import ProfileError, load_profile, profiled_steps

PROFILES = Path(__file__).resolve().parents[1] / "data" / "profiles"
A100 = PROFILES / "a100" / "meta-llama" / "Meta-Llama-3-8B"
H100 = PROFILES / "h100" / "meta-llama" / "Llama-2-7b-hf"


def test_the_a100_extract_loads_with_llama3_shapes():
    p = load_profile(A100)
    assert (p.hidden, p.heads, p.kv_heads, p.intermediate, p.vocab, p.gated) == (4096, 32, 8, 14336, 128256, True)
    m = p.model(32)
    # Llama-3-8B: 6.98e9 parameters outside embedding and LM head
    assert m.dense_params == pytest.approx(6.98e9, rel=0.01)
    assert p.attention is not None and len(p.attention) == 74


def test_step_sums_follow_vidur():
    p = load_profile(A100)
    steps = {s.label: s for s in profiled_steps(p, 32)}
    d = steps["decode b=1 at 1024"]
    # 32 x (0.033 + 0.025 qkv/o, 0.142 + 0.076 up/down, 0.005+0.004+0.005+0.011+0.002+0.002 small,
    #       0.025 attention, 0.002 KV save) + 0.003 embedding
    assert d.seconds * 1e3 == pytest.approx(32 * (0.058 + 0.218 + 0.029 + 0.025 + 0.002) + 0.003, abs=1e-9)
    assert d.batch == [(1, 1024)]
    assert steps["prefill 4096 on 8192"].batch == [(4096, 8192)]
    m = steps["mixed 1024 + b=64 at 1024"]
    assert m.regime == "mixed" and m.batch[0] == (1024, 0) and len(m.batch) == 65
    assert {s.regime for s in steps.values()} == {"prefill", "decode", "mixed"}


def test_prefill_kv_save_is_left_out_unless_asked():
    p = load_profile(A100)
    without = {s.label: s.seconds for s in profiled_steps(p, 32)}
    with_save = {s.label: s.seconds for s in profiled_steps(p, 32, include_prefill_kv_save=True)}
    # 2048-token prefill: 32 layers x 1.093 ms of profiled KV save
    assert with_save["prefill 2048 on 0"] - without["prefill 2048 on 0"] == pytest.approx(32 * 1.093e-3)
    assert with_save["decode b=8 at 1024"] == without["decode b=8 at 1024"]


def test_linear_only_without_attention_csv():
    p = load_profile(H100)
    assert p.attention is None and (p.intermediate, p.vocab) == (11008, 32768)  # Vidur pads the vocabulary
    steps = profiled_steps(p, 32)
    assert all(set(s.parts) == {"attn_proj", "mlp", "small_ops"} for s in steps)
    assert {s.regime for s in steps} == {"prefill", "decode"}


def test_tensor_parallel_rows_are_ignored(synthetic_profile):
    p = load_profile(synthetic_profile)
    assert p.mlp.loc[4096, "time_stats.mlp_up_proj.median"] < 1e3  # the TP-2 row (1e6 ms) is not used


def test_bad_profiles_name_the_file(tmp_path):
    with pytest.raises(ProfileError, match="not a directory"):
        load_profile(tmp_path / "missing")
    with pytest.raises(ProfileError, match="no mlp.csv"):
        load_profile(tmp_path)
    pd.DataFrame({"num_tokens": [1]}).to_csv(tmp_path / "mlp.csv", index=False)
    with pytest.raises(ProfileError, match=r"mlp.csv: missing column\(s\) n_head"):
        load_profile(tmp_path)


def test_an_attention_csv_without_kv_cache_save_loads(tmp_path):
    """Vidur's FlashAttention-backend profiles have no attn_kv_cache_save column: it counts as 0."""
    root = write_synthetic_profile(tmp_path / "fa")
    att = pd.read_csv(root / "attention.csv")
    att.drop(columns=["time_stats.attn_kv_cache_save.median"]).to_csv(root / "attention.csv", index=False)
    p = load_profile(root)
    assert p.attention is not None and (p.attention["time_stats.attn_kv_cache_save.median"] == 0.0).all()
    decode = [s for s in profiled_steps(p, LAYERS) if s.regime == "decode"]
    assert decode and all(s.parts["attn_decode"] > 0 for s in decode)
