"""The terminal summary (sim.analysis.report)."""

from __future__ import annotations

from sim.analysis.report import collapse_groups, summary_rows

NEMOTRON = ["mamba"] * 6 + ["full_attention"]


def _summary(**extra):
    base = {
        "status": "complete",
        "clock": "time",
        "policy": "pr48425",
        "lookup_path": "reconciled",
        "connector": "offload",
        "num_blocks": 240,
        "block_sizes": [1040] * 7,
        "groups": NEMOTRON,
        "requests": {"finished": 3, "total": 3},
        "steps": 10,
        "latency_s": {"queueing": {"p50": 0.005, "p99": 0.085}},
        "throughput": {"requests_per_s": 2.0, "output_tokens_per_s": 10.0},
        "cache": {
            "hit_rate": {**{f"g{i}": 0.25 for i in range(6)}, "g6": 0.5},
            "local_rate": 0.25,
            "external_rate": 0.125,
        },
        "admissions": {"by_outcome": {"ok": 3}, "tokens_recomputed": 48, "fallbacks": 1},
        "connector_metrics": {
            "queries": 5,
            "hit_tokens": 64,
            "loads": 2,
            "bytes_loaded": 3_200_000_000,
            "stores": 4,
            "bytes_stored": 9_100_000,
            "tier_bytes": 8_000_000_000,
            "tier_capacity_bytes": 20_000_000_000,
        },
        "goodput": {"requests_per_s": 1.5},
        "crash": None,
    }
    base.update(extra)
    return base


def test_summary_has_connector_pool_queueing_and_lookup_path():
    rows = dict(summary_rows(_summary()))
    assert rows["status"] == "complete"
    assert rows["queueing p50 / p99"] == "5.0 ms / 85.0 ms"
    assert rows["throughput (req/s, tok/s)"] == "2, 10"
    assert rows["KV-cache pool"] == "240 blocks of 1040 tokens, 7 groups"
    assert rows["prefix policy (lookup path)"] == "pr48425 (reconciled)"
    assert rows["connector"] == (
        "offload: 5 queries, 64 hit tokens, 2 loads (3.2 GB), 4 stores (9.1 MB), tier 8 GB / 20 GB"
    )


def test_step_clock_and_recorded_crash():
    s = _summary(clock="steps", connector="none", admissions={"by_outcome": {"ok": 4, "crash": 1}})
    rows = dict(summary_rows(s))
    assert rows["status"] == "complete (1 crash recorded)"
    assert "throughput (req/step, tok/step)" in rows and "connector" not in rows
    assert not any("req/s," in label or "req/s)" in label for label in rows)


def test_identical_groups_are_one_row():
    rows = dict(
        summary_rows(
            _summary(evictions={"by_group": {**{f"g{i}": {"total": 233} for i in range(6)}, "g6": {"total": 418}}})
        )
    )
    assert rows["hit rate g0–g5 mamba (6 groups)"] == "25.0%"
    assert rows["hit rate g6 full_attention"] == "50.0%"
    assert not any(label.startswith("hit rate g1") for label in rows)
    assert rows["evictions per group"] == "g0–g5=233, g6=418"


def test_groups_collapse_only_when_type_value_and_order_agree():
    kinds = ["mamba", "mamba", "full_attention", "mamba"]
    got = collapse_groups({"g0": 1, "g1": 2, "g2": 2, "g3": 2}, kinds)
    assert got == [("g0", "mamba", 1), ("g1", "mamba", 2), ("g2", "full_attention", 2), ("g3", "mamba", 2)]
    assert collapse_groups({"g0": 5, "g1": 5, "x": 1}, ["mamba", "mamba"]) == [
        ("g0–g1", "mamba (2 groups)", 5),
        ("x", "", 1),
    ]
