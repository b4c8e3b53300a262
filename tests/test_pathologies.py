"""Hybrid prefix-caching pathologies users hit (scenarios/pathologies/, docs/pathologies.md), run end to end.

Each scenario is run as written and with the ``--set`` overrides its header names as the fix or the
contrast; every hit length, hit rate and eviction count below is what docs/pathologies.md quotes.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sim.api import run_scenario
from sim.config import load_scenario

pytestmark = pytest.mark.slow  # end-to-end: runs whole scenarios (make test-fast skips it)

ROOT = Path(__file__).resolve().parents[1]
PATHOLOGIES = ROOT / "scenarios" / "pathologies"


def _run(name: str, *overrides: str):
    return run_scenario(load_scenario(PATHOLOGIES / name, list(overrides)))


def _hits(result) -> dict[str, tuple[int, ...]]:
    """Per request (first admission): the per-group hits, then the local tokens the admission used."""
    adm = result.admissions
    first = adm[adm["outcome"] != "not_admitted"].drop_duplicates("request_id")
    cols = [c for c in adm.columns if c.startswith("hit_g")] + ["local_tokens"]
    return {row[0]: tuple(int(v) for v in row[1:]) for row in first[["request_id", *cols]].itertuples(index=False)}


def _all_ok(result) -> None:
    assert result.summary["crash"] is None
    assert set(result.requests["outcome"]) == {"ok"}


# ------------------------------------------------------------------ #40696
NEMOTRON_GROUPS = 7  # 6 Mamba groups + 1 full-attention group, all at block 1040


@pytest.mark.parametrize(
    "overrides, block_sizes, expected",
    [
        # Nemotron-H 8B as written: the attention block is padded to 1040 tokens; 800 shared tokens never hit.
        ((), [1040] * NEMOTRON_GROUPS, {"u0": 0, "u1": 0, "u2": 0, "u3": 0, "v0": 0, "v1": 1040}),
        # A plain transformer, block 16: every sibling reuses the whole shared prefix.
        (("model.preset=llama-3.1-8b",), [16], {"u0": 0, "u1": 800, "u2": 800, "u3": 800, "v0": 0, "v1": 1200}),
    ],
)
def test_40696_short_prompts_never_hit_a_padded_block(overrides, block_sizes, expected):
    result = _run("short-prompts-padded-block.yaml", *overrides)
    _all_ok(result)
    assert result.summary["block_sizes"] == block_sizes
    hits = _hits(result)
    # Every group agrees with the admitted hit: the misses are block granularity, not divergence.
    assert hits == {rid: (n,) * (len(block_sizes) + 1) for rid, n in expected.items()}
    assert result.summary["requests"]["local_hit_tokens"] == sum(expected.values())


def test_40696_hybrid_at_block_16_hits_once_the_junction_is_written():
    result = _run("short-prompts-padded-block.yaml", "cache.groups=[full_attention, mamba]")
    _all_ok(result)
    assert result.summary["block_sizes"] == [16, 16]
    # (FA hit, Mamba hit, local): u1 and v1 see the full-attention prefix, but no Mamba state at it yet.
    assert _hits(result) == {
        "u0": (0, 0, 0),
        "u1": (800, 0, 0),
        "u2": (800, 800, 800),
        "u3": (800, 800, 800),
        "v0": (0, 0, 0),
        "v1": (1200, 0, 0),
    }


# ------------------------------------------------------------------ #42317
#: (overrides, hit of s0..s4) on qwen3-next-80b-a3b (block 544): shared prefix 4000 -> 3808, prompt 5000 -> 4896.
ALIGN_CASES = [
    ((), [0, 0, 3808, 3808, 4896]),
    (("scheduler.max_num_batched_tokens=544", "cache.retention_interval=null"), [0, 3808, 3808, 3808, 4896]),
    (("scheduler.max_num_batched_tokens=544",), [0, 0, 3808, 3808, 4896]),
    (("scheduler.max_num_batched_tokens=544", "cache.retention_interval=2176"), [0, 2176, 3808, 3808, 4896]),
]


@pytest.mark.parametrize("overrides, expected", ALIGN_CASES)
def test_42317_align_mode_first_sibling_misses(overrides, expected):
    result = _run("align-mode-sibling-miss.yaml", *overrides)
    _all_ok(result)
    assert result.summary["block_sizes"] == [544] * 4
    assert result.summary["groups"] == ["mamba", "mamba", "mamba", "full_attention"]
    hits = _hits(result)
    assert [hits[f"s{i}"][-1] for i in range(5)] == expected
    # Full attention (g3) always sees the shared prefix; only the GDN state decides the hit.
    assert [hits[f"s{i}"][3] for i in range(5)] == [0, 3808, 3808, 3808, 4896]
    for i in range(5):
        assert hits[f"s{i}"][:3] == (expected[i],) * 3


def test_42317_first_sibling_hit_is_reported_as_fa_deeper_divergence():
    result = _run("align-mode-sibling-miss.yaml")
    assert result.summary["admissions"]["divergences"] == {"mamba_deeper": 0, "fa_deeper": 1}


# ------------------------------------------------------------------ vllm-ascend #16270
@pytest.mark.parametrize(
    "overrides, sizes, expected, stored",
    [
        # LCM 4096: nothing under 4096 tokens is even cached, so the 2112-token d0 leaves no entry.
        ((), [128, 4096], {"d0": 0, "d1": 0, "d2": 0, "e0": 0, "e1": 4096}, {("e0", 0): 32, ("e0", 1): 1}),
        # LCM 512: d0 caches its 2048-token document (16 FA blocks + the one SWA block its window needs).
        (
            ("cache.groups.1.block_size=512",),
            [128, 512],
            {"d0": 0, "d1": 2048, "d2": 2048, "e0": 0, "e1": 4608},
            {("d0", 0): 16, ("d0", 1): 1, ("e0", 0): 36, ("e0", 1): 1},
        ),
    ],
)
def test_16270_hits_are_aligned_down_to_the_scheduler_block(overrides, sizes, expected, stored):
    result = _run("lcm-block-alignment.yaml", *overrides)
    _all_ok(result)
    assert result.summary["block_sizes"] == sizes
    assert _hits(result) == {rid: (n, n, n) for rid, n in expected.items()}
    ev = result.kv_events
    assert set(ev["kind"]) == {"stored"}
    assert ev.groupby(["request_id", "group"]).size().to_dict() == stored


def test_16270_model_with_unified_block_sizes_caches_at_the_lcm(tmp_path):
    """Full attention at block 16 and a sliding window whose page is 4x smaller (block 64 after
    page unification): hash block 16, LCM 64. ``b`` shares 100 tokens; full attention matches
    96, aligned down to 64, where the window's single cached block (block 0) serves the hit."""
    scenario = tmp_path / "lcm.yaml"
    scenario.write_text(
        "name: lcm\nclock: steps\n"
        "model:\n  layers:\n"
        "    - {type: full_attention, num_kv_heads: 8, head_size: 128, count: 2}\n"
        "    - {type: sliding_window, num_kv_heads: 2, head_size: 128, window: 128, count: 2}\n"
        "cache: {num_blocks: 100}\n"
        "scheduler: {max_num_seqs: 4, max_num_batched_tokens: 8192, max_model_len: 8192}\n"
        "workload: {requests: [\n"
        "  {id: a, at: 0, prompt: [{content: s, tokens: 100}, {content: qa, tokens: 10}], max_tokens: 2},\n"
        "  {id: b, at: 5, prompt: [{content: s, tokens: 100}, {content: qb, tokens: 10}], max_tokens: 2}]}\n"
        "outputs: {plots: false}\n"
    )
    result = run_scenario(load_scenario(scenario))
    _all_ok(result)
    assert result.summary["block_sizes"] == [16, 64]
    assert _hits(result) == {"a": (0, 0, 0), "b": (64, 64, 64)}
    ev = result.kv_events
    assert ev.groupby(["request_id", "group"]).size().to_dict() == {("a", 0): 4, ("a", 1): 1}


# ------------------------------------------------------------------ #45845
#: retention -> (FA hit rate, Mamba hit rate, local hit tokens, FA evictions, per-Mamba-group evictions, total)
RETENTION = {
    "null": (0.5063, 0.3930, 299520, 318, [355, 355, 355, 355, 354, 354], 2446),
    "4160": (0.5677, 0.4189, 319280, 297, [202] * 6, 1509),
    "0": (0.6277, 0.4722, 359840, 262, [144, 144, 143, 143, 143, 143], 1122),
}


@pytest.fixture(scope="module")
def retention_runs():
    return {r: _run("dense-mamba-snapshots.yaml", f"cache.retention_interval={r}") for r in RETENTION}


def test_45845_dense_snapshots_crowd_out_attention(retention_runs):
    for retention, (fa_rate, mamba_rate, local, fa_ev, mamba_ev, total_ev) in RETENTION.items():
        s = retention_runs[retention].summary
        assert s["crash"] is None and s["requests"]["by_outcome"] == {"ok": 144}, retention
        assert s["requests"]["prompt_tokens"] == 762118
        rates = s["cache"]["hit_rate"]
        assert round(rates["g6"], 4) == fa_rate, retention
        assert [round(rates[f"g{g}"], 4) for g in range(6)] == [mamba_rate] * 6, retention
        assert s["requests"]["local_hit_tokens"] == local, retention
        ev = s["evictions"]["by_group"]
        assert ev["g6"]["total"] == fa_ev, retention
        assert [ev[f"g{g}"]["total"] for g in range(6)] == mamba_ev, retention
        assert s["evictions"]["total"] == total_ev, retention


def test_45845_ordering_null_worst_then_interval_then_zero(retention_runs):
    s = {r: retention_runs[r].summary for r in ("null", "4160", "0")}
    fa = [s[r]["cache"]["hit_rate"]["g6"] for r in s]
    fa_evictions = [s[r]["evictions"]["by_group"]["g6"]["total"] for r in s]
    mamba_evictions = [s[r]["evictions"]["by_group"]["g0"]["total"] for r in s]
    assert fa == sorted(fa) and len(set(fa)) == 3
    assert fa_evictions == sorted(fa_evictions, reverse=True) and len(set(fa_evictions)) == 3
    assert mamba_evictions == sorted(mamba_evictions, reverse=True) and len(set(mamba_evictions)) == 3


# ------------------------------------------------------------------ #50454
def _admission(result, request_id: str, kind: str = "first"):
    adm = result.admissions
    return adm[(adm["request_id"] == request_id) & (adm["kind"] == kind)].iloc[0]


@pytest.mark.parametrize(
    "overrides, local, external, outcome",
    [
        # vLLM 0.33/0.34's rule: reconcile to 16, the tier loads 16..64 (FA chunks + the Mamba state at 64).
        ((), 16, 48, "ok"),
        # What-if, the 0.25.1 max-of-hits rule: 64 claimed locally, nothing stored past it, FA 32..64 unbacked.
        (("scheduler.prefix_policy=max_per_group",), 64, 0, "corrupt"),
    ],
)
def test_50454_offload_after_diverged_eviction(overrides, local, external, outcome):
    result = _run("offload-eviction-assert.yaml", *overrides)
    assert result.summary["crash"] is None
    r = _admission(result, "r")
    assert (int(r["hit_g0"]), int(r["hit_g1"])) == (32, 64)
    assert (int(r["local_tokens"]), int(r["external_tokens"]), r["outcome"]) == (local, external, outcome)
    others = result.admissions[result.admissions["request_id"] != "r"]
    assert set(others["outcome"]) == {"ok"}


def _verify(name: str, vllm: str, *overrides: str):
    from sim.verify.run import VerifyStatus, verify_scenario

    verdict = verify_scenario(load_scenario(PATHOLOGIES / name, [f"vllm_version={vllm}", *overrides]), quiet=True)
    assert verdict.status is VerifyStatus.IDENTICAL, verdict.difference and verdict.difference.describe()


def test_50454_stand_in_verifies_against_the_installed_vllm(vllm):
    """The scripted connector holding the tier's 80 tokens: 0.33 and 0.34 decide as hybridsim."""
    _verify("offload-eviction-assert.yaml", vllm, "connector={type: scripted, holds: {r: 80}}")


# ------------------------------------------------------------------ #45407 / LMCache #3655
NOT_VERIFIED = "AssertionError: External KV connector is not verified yet"


def _rows(result) -> list[tuple]:
    cols = ["request_id", "kind", "step", "local_tokens", "external_tokens", "outcome", "num_computed_tokens"]
    return [tuple(row) for row in result.admissions[cols].itertuples(index=False)]


def test_45407_tier_hit_after_the_gpu_cache_lost_the_prefix_is_taken():
    """vLLM 0.23+ (0.33/0.34): the tier's answer loads asynchronously, the split waits for it, every request ok."""
    result = _run("external-kv-not-verified.yaml")
    _all_ok(result)
    assert _rows(result) == [
        ("a0", "first", 0, 0, 0, "ok", 0),
        ("a1", "first", 10, 1632, 0, "ok", 1632),  # GPU prefix cache hit; the tier adds nothing
        ("b", "first", 25, 0, 1632, "ok", 1632),  # after the reset: the tier's 3 chunks, async
        ("b", "after_async_load", 26, 0, 0, "ok", 1632),
    ]


@pytest.mark.parametrize("load_async", ["false", "true"])
def test_45407_stand_in_verifies_against_the_installed_vllm(vllm, load_async):
    """0.33 and 0.34 take external tokens in the split (sync) and skip it for an async load: identical."""
    connector = f"connector={{type: scripted, holds: {{b: 1632}}, load_async: {load_async}}}"
    _verify("external-kv-not-verified.yaml", vllm, connector)


@pytest.mark.parametrize(
    "connector",
    [
        (),
        ("connector={type: scripted, holds: {b: 1632}}",),
        ("connector={type: scripted, holds: {b: 1632}, load_async: true}",),
    ],
)
def test_45407_vllm_0_22_1_split_assertion_kills_the_engine_at_the_first_external_hit(connector):
    """The what-if 0.22.1 rule: a0 and a1 are served (no external tokens), b's tier hit crashes the engine,
    with the offload tier and with the scripted stand-ins of the verify runs (sync and async)."""
    result = _run("external-kv-not-verified.yaml", *connector, "scheduler.assert_no_external_kv_in_mamba_split=true")
    assert result.summary["crash"] == {"step": 25, "time_s": 25.0, "request_id": "b", "reason": NOT_VERIFIED}
    assert _rows(result) == [
        ("a0", "first", 0, 0, 0, "ok", 0),
        ("a1", "first", 10, 1632, 0, "ok", 1632),
        ("b", "first", 25, 0, 1632, "crash", 0),
    ]


# ------------------------------------------------------------------ Dynamo #12197
PD_NEMOTRON_MAMBA_GROUPS = 6  # nemotron-h-8b: groups g0..g5 are Mamba, g6 full attention (block 1040)


@pytest.mark.parametrize(
    "overrides, local, external, fa_pulled",
    [
        # NIXL declares divergent hybrid hits: the decode reuses its attention prefix, the pull ships the state.
        ((), (0, 2080, 3120), (3199, 1119, 379), 4 + 2 + 1),
        # A connector without the capability: no decode-side reuse, each request pulls its whole prefill.
        (("scheduler.prefix_policy=reconciled",), (0, 0, 0), (3199, 3199, 3499), 4 + 4 + 4),
    ],
)
def test_12197_decode_prefix_hit_against_a_nixl_pull(overrides, local, external, fa_pulled):
    result = _run("pd-decode-prefix-hit.yaml", *overrides)
    _all_ok(result)
    first = result.admissions[result.admissions["kind"] == "first"]
    assert list(first["request_id"]) == ["t1", "s1", "t2"]
    # The decode's own cache: the attention blocks t1 pulled (2 shared with s1, all 3 full ones with t2); no
    # Mamba state at a block boundary (the pulled state sits at prompt - 1).
    assert [int(v) for v in first["hit_g6"]] == [0, 2080, 3120]
    assert all(int(v) == 0 for g in range(PD_NEMOTRON_MAMBA_GROUPS) for v in first[f"hit_g{g}"])
    assert tuple(int(v) for v in first["local_tokens"]) == local
    assert tuple(int(v) for v in first["external_tokens"]) == external
    metrics = result.summary["connector_metrics"]
    # One state slot per Mamba group and load (NIXL pairs only the state-bearing slot), the attention tail.
    assert metrics["blocks_pulled"] == [3] * PD_NEMOTRON_MAMBA_GROUPS + [fa_pulled]
    assert (metrics["loads"], metrics["refilled_local_tokens"]) == (3, 0)


@pytest.mark.parametrize(
    "connector",
    [
        "{type: scripted, matched_tokens: {t1: 3199, s1: 1119, t2: 379}, load_async: true, "
        "supports_divergent_local_hybrid_hits: true}",
        "{type: scripted, matched_tokens: {t1: 3199, s1: 3199, t2: 3499}, load_async: true}",
    ],
)
def test_12197_stand_in_verifies_against_the_installed_vllm(vllm, connector):
    """NIXL's answers, asynchronously, with t1 arriving when the proxy hands it over (step 1)."""
    _verify("pd-decode-prefix-hit.yaml", vllm, f"connector={connector}", "workload.requests.0.at=1")


@pytest.mark.parametrize("what_if", [False, True])
def test_45407_shared_tier_hit_on_a_second_instance(what_if):
    """Instance 0 fills the shared tier; instance 1's first request hits it. 0.22.1's rule crashes instance 1."""
    overrides = ["scheduler.assert_no_external_kv_in_mamba_split=true"] if what_if else []
    result = _run("external-kv-not-verified-cluster.yaml", *overrides)
    cols = ["instance", "request_id", "kind", "step", "local_tokens", "external_tokens", "outcome"]
    rows = [tuple(row) for row in result.admissions[cols].itertuples(index=False)]
    if what_if:
        assert result.summary["crash"] == {
            "step": 10,
            "time_s": 10.0,
            "request_id": "b",
            "reason": NOT_VERIFIED,
            "instance": 1,
        }
        assert rows == [(0, "a0", "first", 0, 0, 0, "ok"), (1, "b", "first", 10, 0, 1632, "crash")]
        return
    _all_ok(result)
    assert sorted(rows) == [
        (0, "a0", "first", 0, 0, 0, "ok"),
        (0, "a1", "first", 20, 1632, 0, "ok"),
        (1, "b", "after_async_load", 11, 0, 0, "ok"),
        (1, "b", "first", 10, 0, 1632, "ok"),
    ]
