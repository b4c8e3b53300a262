"""Per-request latencies and the run summary (``summary.json``) from the result tables.

Definitions (times in seconds of simulated time, from the ``requests`` table):

* TTFT ``first_token_s - arrival_s``; E2E ``finished_s - arrival_s``;
  queueing ``first_scheduled_s - arrival_s``.
* TPOT ``(finished_s - first_token_s) / (output_tokens - 1)``, undefined (NaN)
  for one output token, as vLLM's serving benchmark defines it. With only the
  first and last token times known, a request's mean ITL equals its TPOT; the
  run-level ``itl.mean`` is token-weighted instead (total decode time over total
  inter-token gaps, as the benchmark pools ITLs), while ``tpot.mean`` weights
  every request equally.
* A request *finished* when it has a ``finished_s`` and its ``outcome`` is one
  of :data:`FINISHED_OUTCOMES` (the worst outcome of its admissions); every
  other request (``crash``, ``failed``, ``unfinished``, ``not_arrived``)
  *failed*. Latency percentiles and throughput count finished requests only.
* Percentiles are numpy's linear interpolation (``numpy.percentile``), the
  convention of vLLM's benchmarks.
* Throughput divides by the span from the first arrival to the last finish.
  Goodput counts finished requests whose outcome is not ``corrupt`` (their
  output is wrong, however fast) and that meet every SLO given (a request
  without a TPOT meets the TPOT SLO).
* A request's *first admission* is its first ``admissions`` row whose outcome
  is an admitted one (not ``not_admitted``); failed attempts before it and
  re-admissions after a preemption are left out so that each prompt counts
  once. ``hit_rate.g<i>`` is ``sum(hit_g<i>) / sum(prompt_tokens)`` over first
  admissions (whatever their outcome: ``hit_g<i>`` is the group's independent
  lookup, a property of the cache, not of the policy); ``local_rate`` /
  ``external_rate`` do the same with ``local_tokens`` / ``external_tokens``;
  ``full_attention_hit_rate`` with the minimum hit over the ``full_attention``
  groups (``None`` without one): what full attention alone holds, next to
  ``local_rate``, what was usable.
* Divergence is judged on every admitted row (each is a boundary decision).
  With FA = the minimum hit over ``full_attention`` groups and O = the hits of
  the other groups: ``mamba_deeper`` when FA < max(O), ``fa_deeper`` when
  FA > min(O) (both can hold with three or more groups).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from sim.trace.bundle import ResultSource, tables_of
from sim.trace.tables import infer_num_groups

#: ``requests.outcome`` values of a request that ran to completion.
FINISHED_OUTCOMES: frozenset[str] = frozenset({"ok", "recompute", "corrupt"})
#: ``admissions.outcome`` of an attempt that did not admit the request.
NOT_ADMITTED = "not_admitted"
FULL_ATTENTION = "full_attention"
PERCENTILES = (50, 90, 95, 99)


def request_metrics(requests: pd.DataFrame) -> pd.DataFrame:
    """One row per request: id, outcome, finished flag, output tokens and its latencies."""
    arrival = requests["arrival_s"]
    out_tokens = requests["output_tokens"]
    decode_gaps = (out_tokens - 1).where(out_tokens > 1)
    finished = requests["finished_s"].notna() & requests["outcome"].isin(FINISHED_OUTCOMES)
    return pd.DataFrame(
        {
            "request_id": requests["request_id"],
            "outcome": requests["outcome"],
            "finished": finished.astype(bool),
            "output_tokens": out_tokens,
            "ttft_s": requests["first_token_s"] - arrival,
            "tpot_s": (requests["finished_s"] - requests["first_token_s"]) / decode_gaps,
            "itl_mean_s": (requests["finished_s"] - requests["first_token_s"]) / decode_gaps,
            "e2e_s": requests["finished_s"] - arrival,
            "queueing_s": requests["first_scheduled_s"] - arrival,
        }
    )


def _distribution(values: pd.Series) -> dict[str, float | None]:
    v = values.dropna().to_numpy(dtype=float)
    if len(v) == 0:
        return {"mean": None, **{f"p{p}": None for p in PERCENTILES}}
    # One call for all the percentiles: each is computed as a call of its own would (same order statistics).
    points = np.percentile(v, PERCENTILES)
    return {"mean": float(v.mean()), **{f"p{p}": float(x) for p, x in zip(PERCENTILES, points)}}


def _counts(values: pd.Series) -> dict[str, int]:
    return {str(k): int(n) for k, n in sorted(values.value_counts().items())}


def _coded(values: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """``(codes, uniques)`` of a column, to count many subsets of it without filtering frames; NA is code -1."""
    codes, uniques = pd.factorize(values)
    return codes, np.asarray(uniques, dtype=object)


def _coded_counts(codes: np.ndarray, uniques: np.ndarray, mask: np.ndarray) -> dict[str, int]:
    """:func:`_counts` of the rows in ``mask`` of a :func:`_coded` column (NA left out, as value_counts does)."""
    picked = codes[mask]
    counts = np.bincount(picked[picked >= 0], minlength=len(uniques))
    return {str(k): int(n) for k, n in sorted((uniques[i], counts[i]) for i in np.flatnonzero(counts))}


def _admitted_mask(admissions: pd.DataFrame) -> np.ndarray:
    """Rows whose outcome admitted the request."""
    return (admissions["outcome"] != NOT_ADMITTED).to_numpy(dtype=bool)


def _ratio(num: float, den: float) -> float | None:
    return float(num) / float(den) if den > 0 else None


def first_admissions(admissions: pd.DataFrame) -> pd.DataFrame:
    """Each request's first admitted row, in table order (see module docstring)."""
    admitted = np.flatnonzero(_admitted_mask(admissions))
    again = admissions["request_id"].iloc[admitted].duplicated(keep="first").to_numpy(dtype=bool)
    return admissions.iloc[admitted[~again]]


def divergence_counts(admissions: pd.DataFrame, group_kinds: Sequence[str]) -> dict[str, int]:
    """``mamba_deeper`` / ``fa_deeper`` counts over admitted rows (module docstring)."""
    admitted = _admitted_mask(admissions)
    fa = [f"hit_g{i}" for i, k in enumerate(group_kinds) if k == FULL_ATTENTION]
    other = [f"hit_g{i}" for i, k in enumerate(group_kinds) if k != FULL_ATTENTION]
    if not fa or not other or not admitted.any():
        return {"mamba_deeper": 0, "fa_deeper": 0}
    # Hit columns are int64 (no NA), so numpy's row minimum equals pandas'.
    fa_hit = admissions[fa].to_numpy(dtype=np.int64)[admitted].min(axis=1)
    other_hits = admissions[other].to_numpy(dtype=np.int64)[admitted]
    return {
        "mamba_deeper": int((fa_hit < other_hits.max(axis=1)).sum()),
        "fa_deeper": int((fa_hit > other_hits.min(axis=1)).sum()),
    }


def _full_attention_rate(first: pd.DataFrame, group_kinds: Sequence[str], prompt: float) -> float | None:
    """Hit rate of the full-attention groups alone (their minimum per admission), or None without FA groups."""
    fa = [f"hit_g{i}" for i, kind in enumerate(group_kinds) if kind == FULL_ATTENTION]
    if not fa:
        return None
    return _ratio(int(first[fa].to_numpy(dtype=np.int64).min(axis=1).sum()), prompt)


def run_summary(
    tables: ResultSource,
    *,
    group_kinds: Sequence[str],
    slo_ttft_s: float | None = None,
    slo_tpot_s: float | None = None,
    crash: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The run's metrics as a JSON-able dict with sorted keys (the body of ``summary.json``).

    ``tables`` is a result or a mapping of table name to DataFrame; ``group_kinds`` names the attention type of each KV-cache
    group in group order; ``crash`` is ``None`` or ``{step, time_s,
    request_id, reason}`` (DESIGN.md §6).
    """
    t = tables_of(tables)
    adm, req, kv = t["admissions"], t["requests"], t["kv_events"]
    num_groups = max(infer_num_groups(adm.columns), infer_num_groups(t["steps"].columns))
    if len(group_kinds) != num_groups:
        raise ValueError(
            f"group_kinds has {len(group_kinds)} entries {list(group_kinds)} but the tables have "
            f"{num_groups} KV-cache groups; give one attention type per group"
        )
    for name, value in (("slo_ttft_s", slo_ttft_s), ("slo_tpot_s", slo_tpot_s)):
        if value is not None and not value > 0:
            raise ValueError(f"{name} must be a positive number of seconds or null, got {value!r}")

    per_req = request_metrics(req)
    done = per_req[per_req["finished"]]
    span = (req.loc[per_req["finished"], "finished_s"].max() - req["arrival_s"].min()) if len(done) else np.nan
    duration = float(span) if pd.notna(span) and span > 0 else None
    first = first_admissions(adm)
    return {
        "groups": list(group_kinds),
        "crash": dict(crash) if crash is not None else None,
        "num_steps": int(len(t["steps"])),
        "requests": _request_section(req, done),
        "latency_s": _latency_section(done),
        "throughput": {
            "duration_s": duration,
            "requests_per_s": _ratio(len(done), duration) if duration else None,
            "output_tokens_per_s": _ratio(done["output_tokens"].sum(), duration) if duration else None,
        },
        "goodput": _goodput_section(done, duration, slo_ttft_s, slo_tpot_s),
        "cache": _cache_section(first, group_kinds, num_groups),
        "admissions": _admission_section(adm, group_kinds),
        "evictions": _eviction_section(kv, num_groups),
    }


def _request_section(req: pd.DataFrame, done: pd.DataFrame) -> dict[str, Any]:
    return {
        "total": int(len(req)),
        "finished": int(len(done)),
        "failed": int(len(req) - len(done)),
        "by_outcome": _counts(req["outcome"]),
        "preemptions": int(req["preemptions"].sum()),
        "local_hit_tokens": int(req["local_hit_tokens"].sum()),
        "external_hit_tokens": int(req["external_hit_tokens"].sum()),
        "prompt_tokens": int(req["prompt_tokens"].sum()),
        "output_tokens": int(req["output_tokens"].sum()),
    }


def _latency_section(done: pd.DataFrame) -> dict[str, Any]:
    """Distributions over finished requests; ITL is decode time over decode gaps (requests with > 1 token)."""
    decode_time = (done["tpot_s"] * (done["output_tokens"] - 1)).sum()
    decode_gaps = (done["output_tokens"] - 1).where(done["output_tokens"] > 1).sum()
    return {
        "ttft": _distribution(done["ttft_s"]),
        "tpot": _distribution(done["tpot_s"]),
        "e2e": _distribution(done["e2e_s"]),
        "queueing": _distribution(done["queueing_s"]),
        "itl": {"mean": _ratio(decode_time, decode_gaps) if decode_gaps > 0 else None},
    }


def _goodput_section(
    done: pd.DataFrame, duration: float | None, slo_ttft_s: float | None, slo_tpot_s: float | None
) -> dict[str, Any]:
    """Finished, not corrupt, and within every SLO bound given (a single-token request has no TPOT)."""
    good = done[done["outcome"] != "corrupt"]
    if slo_ttft_s is not None:
        good = good[good["ttft_s"] <= slo_ttft_s]
    if slo_tpot_s is not None:
        good = good[good["tpot_s"].isna() | (good["tpot_s"] <= slo_tpot_s)]
    return {
        "slo_ttft_s": slo_ttft_s,
        "slo_tpot_s": slo_tpot_s,
        "requests": int(len(good)),
        "requests_per_s": _ratio(len(good), duration) if duration else None,
    }


def _cache_section(first: pd.DataFrame, group_kinds: Sequence[str], num_groups: int) -> dict[str, Any]:
    """Hit rates over each request's first admission, as fractions of their prompt tokens."""
    prompt = float(first["prompt_tokens"].sum())
    return {
        "first_admissions": int(len(first)),
        "prompt_tokens": int(prompt),
        "hit_rate": {f"g{i}": _ratio(first[f"hit_g{i}"].sum(), prompt) for i in range(num_groups)},
        "local_rate": _ratio(first["local_tokens"].sum(), prompt),
        "full_attention_hit_rate": _full_attention_rate(first, group_kinds, prompt),
        "external_rate": _ratio(first["external_tokens"].sum(), prompt),
    }


def _admission_section(adm: pd.DataFrame, group_kinds: Sequence[str]) -> dict[str, Any]:
    outcomes, outcome_values = _coded(adm["outcome"])
    policies, policy_values = _coded(adm["policy"])
    every = np.ones(len(adm), dtype=bool)
    by_policy = sorted(range(len(policy_values)), key=lambda i: str(policy_values[i]))
    return {
        "attempts": int(len(adm)),
        "admitted": int(_admitted_mask(adm).sum()),
        "by_outcome": _coded_counts(outcomes, outcome_values, every),
        "by_policy": {str(policy_values[i]): _coded_counts(outcomes, outcome_values, policies == i) for i in by_policy},
        "crash_reasons": _counts(adm.loc[adm["crash_reason"] != "", "crash_reason"]),
        "fallbacks": int(adm["fallback"].sum()),
        "hit_diverged": int(adm["hit_diverged"].sum()),
        "divergences": divergence_counts(adm, group_kinds),
        "tokens_recomputed": int(adm["tokens_lost"].sum()),
    }


def _eviction_section(kv: pd.DataFrame, num_groups: int) -> dict[str, Any]:
    # Column by column: filtering the whole (large) kv_events frame would copy every column.
    removed = (kv["kind"] == "removed").to_numpy(dtype=bool)
    groups = kv["group"].to_numpy()
    causes, cause_values = _coded(kv["cause"])
    by_group = {}
    for g in range(num_groups):
        of_group = removed & (groups == g)
        by_group[f"g{g}"] = {"total": int(of_group.sum()), "by_cause": _coded_counts(causes, cause_values, of_group)}
    return {"total": int(removed.sum()), "by_group": by_group}


def add_ideal_hit_rate(summary: dict[str, Any], tables: ResultSource, requests: Sequence[Any], block_size: int) -> None:
    """Add the infinite-cache limit to ``summary["cache"]`` (``outputs.ideal_hit_rate: true``).

    ``ideal_hit_rate`` / ``ideal_hit_tokens``: :func:`sim.workload.stats.ideal_hit_tokens`
    at ``block_size`` (the scheduler block size: hits are aligned to it), over
    the run's requests in arrival order, over every request's prompt tokens (the
    denominator of ``local_rate`` when every request was admitted). ``missed_reuse_tokens``: ideal hit tokens minus the local and
    external tokens of first admissions, i.e. prompt tokens an infinite cache
    would have supplied but this run computed again (the tokens recomputed
    because of eviction or missing Mamba states).
    """
    from sim.workload.stats import ideal_hit_tokens

    ordered = sorted(requests, key=lambda r: r.arrival_time)
    ideal = int(sum(ideal_hit_tokens(ordered, block_size)))
    first = first_admissions(tables_of(tables)["admissions"])
    reused = int(first["local_tokens"].sum() + first["external_tokens"].sum())
    cache = summary["cache"]
    cache["ideal_hit_tokens"] = ideal
    cache["ideal_hit_rate"] = _ratio(ideal, float(summary["requests"]["prompt_tokens"]))
    cache["missed_reuse_tokens"] = max(0, ideal - reused)
