"""The terminal summary and the compare table (sim.analysis.report)."""

from __future__ import annotations

from sim.analysis.report import compare_rows, summary_rows

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


def test_compare_has_one_column_per_group_type_and_the_new_columns():
    header, rows = compare_rows({"a": _summary(), "b": _summary(crash={"reason": "AssertionError: x"}, clock="steps")})
    assert header == [
        "run",
        "policy",
        "status",
        "finished",
        "TTFT p50",
        "TTFT p99",
        "hit FA",
        "hit Mamba",
        "local",
        "external",
        "fallbacks",
        "tokens lost",
        "conn loaded",
        "conn stored",
        "goodput",
        "outcomes",
        "crash",
    ]
    a = dict(zip(header, rows[0]))
    assert (a["hit FA"], a["hit Mamba"], a["local"], a["external"]) == ("50.0%", "25.0%", "25.0%", "12.5%")
    assert (a["tokens lost"], a["conn loaded"], a["conn stored"], a["goodput"]) == ("48", "3.2 GB", "9.1 MB", "1.5/s")
    b = dict(zip(header, rows[1]))
    assert (b["goodput"], b["crash"]) == ("1.5/step", "AssertionError: x")
