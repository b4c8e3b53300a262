import json
import math

import numpy as np
import pandas as pd
import pytest

from sim.core.kv.hashing import RequestBlockHasher
from sim.results.metrics import divergence_counts, first_admissions, request_metrics, run_summary
from sim.trace.bundle import dumps_summary
from sim.trace.tables import empty_table

KINDS = ["full_attention", "mamba"]


def approx(x):
    return pytest.approx(x, rel=1e-12, abs=1e-12)


def test_per_request_latencies(tables):
    m = request_metrics(tables["requests"]).set_index("request_id")
    assert m.loc["r0", ["ttft_s", "tpot_s", "e2e_s", "queueing_s"]].tolist() == approx([1.0, 0.5, 3.0, 0.5])
    assert m.loc["r1", "tpot_s"] == approx(0.3) and m.loc["r1", "itl_mean_s"] == approx(0.3)
    assert math.isnan(m.loc["r2", "tpot_s"])  # one output token: no TPOT
    assert m["finished"].tolist() == [True, True, True, False]


def test_run_summary_latency_and_throughput(tables):
    s = run_summary(tables, group_kinds=KINDS)
    lat = s["latency_s"]
    # TTFT over finished r0, r1, r2 = [1.0, 0.5, 2.0]: linear-interpolated percentiles
    assert lat["ttft"] == approx({"mean": 3.5 / 3, "p50": 1.0, "p90": 1.8, "p95": 1.9, "p99": 1.98})
    assert lat["tpot"] == approx({"mean": 0.4, "p50": 0.4, "p90": 0.48, "p95": 0.49, "p99": 0.498})
    assert lat["e2e"] == approx({"mean": 6.1 / 3, "p50": 2.0, "p90": 2.8, "p95": 2.9, "p99": 2.98})
    assert lat["queueing"]["p50"] == approx(0.0)
    assert lat["itl"]["mean"] == approx((2.0 + 0.6) / 6)  # token-weighted, unlike tpot.mean
    assert s["throughput"] == approx({"duration_s": 4.0, "requests_per_s": 0.75, "output_tokens_per_s": 2.25})
    assert s["requests"] == {
        "total": 4,
        "finished": 3,
        "failed": 1,
        "by_outcome": {"corrupt": 1, "failed": 1, "ok": 2},
        "preemptions": 1,
        "local_hit_tokens": 104,
        "external_hit_tokens": 32,
        "prompt_tokens": 200,
        "output_tokens": 9,
    }


def test_goodput_excludes_corrupt_and_slo_misses(tables):
    assert run_summary(tables, group_kinds=KINDS)["goodput"]["requests"] == 2  # r2 corrupt
    g = run_summary(tables, group_kinds=KINDS, slo_ttft_s=0.8)["goodput"]
    assert (g["requests"], g["requests_per_s"], g["slo_ttft_s"]) == (1, 0.25, 0.8)
    assert run_summary(tables, group_kinds=KINDS, slo_tpot_s=0.4)["goodput"]["requests"] == 1
    with pytest.raises(ValueError, match="slo_tpot_s must be a positive"):
        run_summary(tables, group_kinds=KINDS, slo_tpot_s=0)


def test_hit_rates_divergences_and_admission_counts(tables):
    first = first_admissions(tables["admissions"])
    assert first[["step", "request_id"]].values.tolist() == [[0, "r0"], [2, "r1"], [3, "r2"], [6, "r3"]]
    s = run_summary(tables, group_kinds=KINDS)
    cache = s["cache"]
    assert cache["prompt_tokens"] == 200 and cache["first_admissions"] == 4
    assert cache["hit_rate"] == approx({"g0": 136 / 200, "g1": 112 / 200})
    assert (cache["local_rate"], cache["external_rate"]) == approx((104 / 200, 32 / 200))
    assert cache["full_attention_hit_rate"] == approx(136 / 200)  # the FA group alone (g0)
    assert run_summary(tables, group_kinds=["mamba", "mamba"])["cache"]["full_attention_hit_rate"] is None
    a = s["admissions"]
    # mamba deeper: r0@0 (64<96), r0@5 (0<96); FA deeper: r1@2 (48>16), r2 (16>0), r3 (8>0)
    assert a["divergences"] == {"mamba_deeper": 2, "fa_deeper": 3}
    assert (a["attempts"], a["admitted"], a["fallbacks"], a["hit_diverged"], a["tokens_recomputed"]) == (6, 5, 1, 1, 32)
    assert a["by_outcome"] == {"corrupt": 1, "crash": 1, "not_admitted": 1, "ok": 3}
    assert a["by_policy"] == {"max_per_group": {"corrupt": 1, "crash": 1}, "reconciled": {"not_admitted": 1, "ok": 3}}
    assert a["crash_reasons"] == {"AssertionError: num_new_tokens > 0": 1}
    # no full-attention group: divergence undefined, reported as zero
    assert divergence_counts(tables["admissions"], ["mamba", "mamba"]) == {"mamba_deeper": 0, "fa_deeper": 0}


def test_evictions_and_crash(tables):
    crash = {"step": 6, "time_s": 3.0, "request_id": "r3", "reason": "AssertionError: num_new_tokens > 0"}
    s = run_summary(tables, group_kinds=KINDS, crash=crash)
    assert s["evictions"] == {
        "total": 3,
        "by_group": {
            "g0": {"total": 2, "by_cause": {"evict_lru": 2}},
            "g1": {"total": 1, "by_cause": {"evict_forced": 1}},
        },
    }
    assert s["crash"] == crash and s["groups"] == KINDS and s["num_steps"] == 7
    assert json.loads(dumps_summary(s)) == s  # JSON-able, no NaN
    assert run_summary(tables, group_kinds=KINDS)["crash"] is None


def test_empty_run_and_bad_group_kinds(tables):
    empty = {n: empty_table(n, 2) for n in tables}
    s = run_summary(empty, group_kinds=KINDS)
    assert s["latency_s"]["ttft"] == {"mean": None, "p50": None, "p90": None, "p95": None, "p99": None}
    assert s["throughput"]["requests_per_s"] is None and s["cache"]["hit_rate"] == {"g0": None, "g1": None}
    assert json.loads(dumps_summary(s)) == s
    with pytest.raises(ValueError, match="group_kinds has 1 entries"):
        run_summary(tables, group_kinds=["full_attention"])


def test_ideal_hit_rate_and_missed_reuse(tables):
    from sim.core.request import Request
    from sim.core.tokens import StreamSegment
    from sim.results.metrics import add_ideal_hit_rate

    def req(rid, at, tokens):
        r = Request(rid, [StreamSegment("doc", 0, tokens)], 1, arrival_time=at)
        r.set_block_hasher(RequestBlockHasher(16))
        return r

    s = run_summary(tables, group_kinds=KINDS)
    # Arrival order b (48 tokens: nothing before it), a (64: hits b's 3 blocks, capped at (64-1)//16 = 3).
    add_ideal_hit_rate(s, tables, [req("a", 1.0, 64), req("b", 0.0, 48)], 16)
    assert s["cache"]["ideal_hit_tokens"] == 48
    assert s["cache"]["ideal_hit_rate"] == approx(48 / 200)  # over the run's prompt tokens
    assert s["cache"]["missed_reuse_tokens"] == 0  # first admissions reused 104 + 32 > 48
    # b 160 tokens (10 blocks), a 200: a hits all 10 -> 160 ideal, 24 more than the 136 reused.
    add_ideal_hit_rate(s, tables, [req("b", 0.0, 160), req("a", 1.0, 200)], 16)
    assert (s["cache"]["ideal_hit_tokens"], s["cache"]["missed_reuse_tokens"]) == (160, 24)


def test_ideal_split_with_mamba_groups(tables):
    from sim.core.policy.checkpoint import EveryBlockPolicy
    from sim.core.request import Request
    from sim.core.tokens import StreamSegment
    from sim.results.metrics import MambaPlacementLimits, add_ideal_hit_rate

    def req(rid, at, *parts):
        return Request(rid, [StreamSegment(c, 0, n) for c, n in parts], 1, arrival_time=at)

    # a: S(40) D(50); b: S(40) E(30). FA: b hits S's 2 blocks (32 tokens). vLLM: a left a state at 80 only,
    # so no state at 32: the whole ideal is placement loss. every_block saves at 16, 32, 48, 64: b hits 32.
    reqs = [req("a", 0.0, ("S", 40), ("D", 50)), req("b", 1.0, ("S", 40), ("E", 30))]
    s = run_summary(tables, group_kinds=KINDS)
    add_ideal_hit_rate(s, tables, reqs, 16, MambaPlacementLimits(None, 0))
    cache = s["cache"]
    assert cache["ideal_hit_tokens"] == 32 and cache["ideal_vllm_placement_hit_tokens"] == 0
    assert cache["placement_loss_rate"] == approx(32 / 200) == approx(cache["ideal_hit_rate"])
    assert cache["ideal_placement_hit_rate"] == 0
    add_ideal_hit_rate(s, tables, reqs, 16, MambaPlacementLimits(EveryBlockPolicy(), 0))
    assert s["cache"]["ideal_placement_hit_rate"] == approx(32 / 200)
    assert s["cache"]["ideal_vllm_placement_hit_rate"] == 0


def _pandas_reference(tables, group_kinds):
    """The admission, cache and eviction counts by their pandas definitions (frame filters and groupbys)."""

    def counts(values):
        return {str(k): int(n) for k, n in sorted(values.value_counts().items())}

    adm, kv = tables["admissions"], tables["kv_events"]
    admitted = adm[adm["outcome"] != "not_admitted"]
    first = admitted.drop_duplicates("request_id", keep="first")
    fa = [f"hit_g{i}" for i, k in enumerate(group_kinds) if k == "full_attention"]
    other = [f"hit_g{i}" for i, k in enumerate(group_kinds) if k != "full_attention"]
    if not fa or not other or admitted.empty:
        divergences = {"mamba_deeper": 0, "fa_deeper": 0}
    else:
        fa_hit = admitted[fa].min(axis=1)
        divergences = {
            "mamba_deeper": int((fa_hit < admitted[other].max(axis=1)).sum()),
            "fa_deeper": int((fa_hit > admitted[other].min(axis=1)).sum()),
        }
    removed = kv[kv["kind"] == "removed"]
    by_group = {}
    for g in range(len(group_kinds)):
        of_group = removed[removed["group"] == g]
        by_group[f"g{g}"] = {"total": int(len(of_group)), "by_cause": counts(of_group["cause"])}
    return {
        "first": first[["step", "request_id", "hit_g0", "hit_g1"]].values.tolist(),
        "admitted": int(len(admitted)),
        "by_outcome": counts(adm["outcome"]),
        "by_policy": {
            str(p): counts(rows["outcome"]) for p, rows in sorted(adm.groupby("policy"), key=lambda x: str(x[0]))
        },
        "divergences": divergences,
        "evictions": {"total": int(len(removed)), "by_group": by_group},
        "full_attention_hit_rate": (
            float(first[fa].min(axis=1).sum()) / float(first["prompt_tokens"].sum())
            if fa and first["prompt_tokens"].sum() > 0
            else None
        ),
    }


@pytest.mark.parametrize("kinds", [KINDS, ["full_attention", "full_attention"], ["mamba", "full_attention"]])
def test_counts_equal_the_pandas_definitions_on_random_tables(tables, kinds):
    """Random resamplings of the hand tables: the column-wise counts equal frame filters and groupbys."""
    import numpy as np

    from sim.trace.tables import normalize_table

    rng = np.random.default_rng(5)
    for _ in range(40):
        t = dict(tables)
        adm = (
            tables["admissions"].sample(int(rng.integers(0, 30)), replace=True, random_state=rng).reset_index(drop=True)
        )
        adm["request_id"] = [f"r{i}" for i in rng.integers(0, 6, len(adm))]
        adm["outcome"] = rng.choice(["ok", "not_admitted", "crash", "corrupt", "recompute"], len(adm))
        adm["policy"] = rng.choice(["reconciled", "max_per_group", "pr48425"], len(adm))
        adm["hit_g0"] = rng.integers(0, 5, len(adm)) * 16
        adm["hit_g1"] = rng.integers(0, 5, len(adm)) * 16
        kv = tables["kv_events"].sample(int(rng.integers(0, 60)), replace=True, random_state=rng).reset_index(drop=True)
        kv["seq"] = range(len(kv))
        kv["kind"] = rng.choice(["stored", "removed"], len(kv))
        kv["group"] = rng.integers(0, 2, len(kv))
        kv["cause"] = rng.choice(["evict_lru", "evict_forced", "cache", "free"], len(kv))
        t["admissions"] = normalize_table("admissions", adm)
        t["kv_events"] = normalize_table("kv_events", kv)
        want = _pandas_reference(t, kinds)
        s = run_summary(t, group_kinds=kinds)
        a = s["admissions"]
        got = {
            "first": first_admissions(t["admissions"])[["step", "request_id", "hit_g0", "hit_g1"]].values.tolist(),
            "admitted": a["admitted"],
            "by_outcome": a["by_outcome"],
            "by_policy": a["by_policy"],
            "divergences": a["divergences"],
            "evictions": s["evictions"],
            "full_attention_hit_rate": s["cache"]["full_attention_hit_rate"],
        }
        assert got == want
        assert list(got["by_policy"]) == list(want["by_policy"])  # the same key order in summary.json
        # A run's summary reads kv_events as the recorder packed it (never made an Arrow table): same counts.
        assert _summary_of_packed(t, kinds)["evictions"] == want["evictions"]


def _summary_of_packed(t, kinds):
    from sim.core.kv.block_pool import KVEvent
    from sim.trace.recorder import KVEventTable
    from sim.trace.schema import TABLE_NAMES, ArrowTables, arrow_table, hex_to_hash
    from tests.support.kv import event_log

    kv = t["kv_events"]
    events = KVEventTable()
    if len(kv):
        rows = zip(kv["kind"], kv["group"], kv["block_id"], kv["block_hash"], kv["request_id"], kv["cause"])
        log = event_log(*[KVEvent(k, int(g), int(b), hex_to_hash(h) or 0, r, c) for k, g, b, h, r, c in rows])
        events.append_log(log, 0, 0.0)
    arrow = {
        name: arrow_table(name, {c: t[name][c].tolist() for c in t[name].columns})
        for name in TABLE_NAMES
        if name != "kv_events"
    }
    tables = ArrowTables(arrow, kv_events=events)
    summary = run_summary(tables, group_kinds=kinds)
    assert tables.recorded_kv_events is events  # the summary did not make it an Arrow table
    return summary


def _pandas_request_reference(req, slo_ttft_s, slo_tpot_s):
    """The request, latency, throughput and goodput sections by their pandas definitions (Series ops on
    :func:`request_metrics`' frame, pandas' ``sum`` / ``min`` / ``max``), to compare bit for bit."""

    def dist(values):
        v = values.dropna().to_numpy(dtype=float)
        if len(v) == 0:
            return {"mean": None, "p50": None, "p90": None, "p95": None, "p99": None}
        return {"mean": float(v.mean()), **{f"p{p}": float(np.percentile(v, p)) for p in (50, 90, 95, 99)}}

    def ratio(num, den):
        return float(num) / float(den) if den > 0 else None

    per_req = request_metrics(req)
    done = per_req[per_req["finished"]]
    span = (req.loc[per_req["finished"], "finished_s"].max() - req["arrival_s"].min()) if len(done) else np.nan
    duration = float(span) if pd.notna(span) and span > 0 else None
    decode_time = (done["tpot_s"] * (done["output_tokens"] - 1)).sum()
    decode_gaps = (done["output_tokens"] - 1).where(done["output_tokens"] > 1).sum()
    good = done[done["outcome"] != "corrupt"]
    if slo_ttft_s is not None:
        good = good[good["ttft_s"] <= slo_ttft_s]
    if slo_tpot_s is not None:
        good = good[good["tpot_s"].isna() | (good["tpot_s"] <= slo_tpot_s)]
    return {
        "requests": {
            "total": len(req),
            "finished": len(done),
            "failed": len(req) - len(done),
            "by_outcome": {str(k): int(n) for k, n in sorted(req["outcome"].value_counts().items())},
            **{c: int(req[c].sum()) for c in ("preemptions", "local_hit_tokens", "external_hit_tokens")},
            "prompt_tokens": int(req["prompt_tokens"].sum()),
            "output_tokens": int(req["output_tokens"].sum()),
        },
        "latency_s": {
            "ttft": dist(done["ttft_s"]),
            "tpot": dist(done["tpot_s"]),
            "e2e": dist(done["e2e_s"]),
            "queueing": dist(done["queueing_s"]),
            "itl": {"mean": ratio(decode_time, decode_gaps) if decode_gaps > 0 else None},
        },
        "throughput": {
            "duration_s": duration,
            "requests_per_s": ratio(len(done), duration) if duration else None,
            "output_tokens_per_s": ratio(done["output_tokens"].sum(), duration) if duration else None,
        },
        "goodput": {
            "slo_ttft_s": slo_ttft_s,
            "slo_tpot_s": slo_tpot_s,
            "requests": len(good),
            "requests_per_s": ratio(len(good), duration) if duration else None,
        },
    }


def _random_requests(rng, n):
    """``n`` requests with random times (NaN for a missing one), token counts (0, 1 and more) and outcomes."""
    from sim.trace.tables import normalize_table

    def times(p_missing):
        t = rng.exponential(2.0, n) * rng.choice([1.0, 1e-3, 1e3], n)
        return np.where(rng.random(n) < p_missing, np.nan, t)

    arrival = times(0.05)
    return normalize_table(
        "requests",
        pd.DataFrame(
            {
                "request_id": [f"r{i}" for i in rng.integers(0, max(n, 1), n)],
                "arrival_s": arrival,
                "first_scheduled_s": arrival + times(0.2),
                "first_token_s": arrival + times(0.2),
                "finished_s": arrival + times(0.3),
                "prompt_tokens": rng.integers(0, 5000, n),
                "output_tokens": rng.choice([0, 1, 2, 17, 400], n),
                "local_hit_tokens": rng.integers(0, 100, n),
                "external_hit_tokens": rng.integers(0, 100, n),
                "preemptions": rng.integers(0, 3, n),
                "outcome": rng.choice(["ok", "recompute", "corrupt", "crash", "failed", "unfinished", ""], n),
            }
        ),
    )


@pytest.mark.parametrize("slo", [(None, None), (0.5, None), (None, 0.01), (3.0, 0.2)])
def test_request_sections_equal_the_pandas_definitions_bit_for_bit(tables, slo):
    """Random requests tables (empty, one row, NaN times, single-token requests, all failed): the
    NumPy summary equals the pandas definitions exactly (``==`` on every float, not approx)."""
    rng = np.random.default_rng(11)
    sizes = [0, 1, 1, 2, 3] + [int(x) for x in rng.integers(4, 400, 40)]
    for n in sizes:
        t = dict(tables)
        t["requests"] = _random_requests(rng, n)
        s = run_summary(t, group_kinds=KINDS, slo_ttft_s=slo[0], slo_tpot_s=slo[1])
        want = _pandas_request_reference(t["requests"], *slo)
        got = {k: s[k] for k in want}
        assert json.dumps(got, sort_keys=True) == json.dumps(want, sort_keys=True), n
        assert got == want, n


def test_summary_of_empty_tables_has_no_statistics():
    t = {name: empty_table(name, 2) for name in ("kv_events", "admissions", "requests", "schedule", "steps")}
    s = run_summary(t, group_kinds=KINDS)
    assert s["latency_s"]["ttft"] == {"mean": None, "p50": None, "p90": None, "p95": None, "p99": None}
    assert s["latency_s"]["itl"] == {"mean": None}
    assert s["throughput"] == {"duration_s": None, "requests_per_s": None, "output_tokens_per_s": None}
    assert s["cache"]["hit_rate"] == {"g0": None, "g1": None} and s["cache"]["full_attention_hit_rate"] is None
    assert s["admissions"]["by_outcome"] == {} and s["evictions"] == {
        "total": 0,
        "by_group": {"g0": {"total": 0, "by_cause": {}}, "g1": {"total": 0, "by_cause": {}}},
    }


def _float_bits(value):
    """A summary with every float spelled by its bits (``float.hex``), to compare bit for bit."""
    if isinstance(value, dict):
        return {k: _float_bits(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_float_bits(v) for v in value]
    return ("float", value.hex()) if isinstance(value, float) else (type(value).__name__, value)


@pytest.mark.parametrize("scenario", ["golden-pressure.yaml", "repro/nixl-mamba-deeper.yaml"])
@pytest.mark.parametrize("slo", [(None, None), (0.05, 0.01)])
def test_summary_from_column_arrays_equals_summary_from_frames(scenario, slo):
    """``finalize`` summarizes the Arrow tables' columns; the frames give the same dict, every float
    bit for bit and every key in the same order."""
    from pathlib import Path

    from sim.api import RunOptions
    from sim.config import load_scenario
    from sim.engine.run import build_run
    from sim.trace.schema import arrow_tables_from_recorder
    from sim.trace.tables import tables_from_recorder

    path = Path(__file__).resolve().parents[2] / "scenarios" / scenario
    record = build_run(load_scenario(path, ["outputs.plots=false"]), RunOptions()).execute()
    kwargs = dict(group_kinds=record.group_kinds, slo_ttft_s=slo[0], slo_tpot_s=slo[1], crash=record.crash)
    from_arrays = run_summary(arrow_tables_from_recorder(record.recorder), **kwargs)
    from_frames = run_summary(tables_from_recorder(record.recorder), **kwargs)
    assert json.dumps(_float_bits(from_arrays)) == json.dumps(_float_bits(from_frames))
    assert from_arrays["requests"]["total"] > 0 and from_arrays["admissions"]["attempts"] > 0


def test_percentiles_are_numpy_s_bit_for_bit():
    """metrics.percentiles (numpy's linear percentile without np.unique, which imports numpy.ma) gives the bits
    of numpy.percentile: sizes 1 to thousands, ties, zeros, wide ranges, integers, and other points than the
    summary's."""
    from sim.results.metrics import PERCENTILES, percentiles

    rng = np.random.default_rng(7)
    arrays = [np.array([3.5]), np.array([0.0, 0.0]), np.array([2.0, 1.0]), np.arange(7, dtype=float)]
    for n in (3, 4, 5, 10, 11, 99, 100, 101, 997, 4000):
        arrays.append(rng.exponential(0.3, n))
        arrays.append(np.round(rng.exponential(0.3, n), 2))  # ties
        arrays.append(rng.lognormal(0, 6, n))  # values from 1e-8 to 1e8
        arrays.append(rng.integers(0, 5, n).astype(float))
        arrays.append(rng.integers(-50, 50, n))
    for v in arrays:
        for q in (PERCENTILES, (0, 100), (12.5, 33.3, 66.7, 99.9), (50,)):
            want = np.percentile(v, q)
            got = percentiles(v, q)
            assert got.dtype == want.dtype and got.tobytes() == want.tobytes(), (v, q, got, want)
    v = rng.exponential(1.0, 50)
    kept = v.copy()
    percentiles(v, PERCENTILES)
    assert v.tobytes() == kept.tobytes()  # the input is not reordered
