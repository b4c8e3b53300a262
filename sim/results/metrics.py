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

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator, Mapping, Sequence, TypeAlias

import numpy as np
import pyarrow as pa

from sim.trace.bundle import LoadedResult, ResultSource, tables_of
from sim.trace.recorder import KVEventTable
from sim.trace.schema import ArrowTables, coded_array, infer_num_groups, numpy_of

if TYPE_CHECKING:
    import pandas as pd

    from sim.core.policy.checkpoint import BaseCheckpointPolicy

#: One column as the metrics read it: a NumPy array (numbers), or an Arrow or pandas string array.
ColumnArray: TypeAlias = "np.ndarray | pa.Array | pa.ChunkedArray | pd.api.extensions.ExtensionArray"
#: One table's columns as arrays, by name in table order.
TableColumns: TypeAlias = Mapping[str, ColumnArray]

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
    import pandas as pd

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


def _distribution(values: np.ndarray) -> dict[str, float | None]:
    """Mean and percentiles of the non-NaN values (in their order), ``None`` each when there are none."""
    v = values[~np.isnan(values)]
    if len(v) == 0:
        return {"mean": None, **{f"p{p}": None for p in PERCENTILES}}
    # One call for all the percentiles: each is computed as a call of its own would (same order statistics).
    points = percentiles(v, PERCENTILES)
    return {"mean": float(v.mean()), **{f"p{p}": float(x) for p, x in zip(PERCENTILES, points)}}


def percentiles(v: np.ndarray, q: Sequence[float]) -> np.ndarray:
    """``numpy.percentile(v, q)`` (its default, linear interpolation) of a 1-D array without NaN, the same
    bits: numpy's own steps (NumPy 1.26 to 2.x) without ``np.unique``, whose masked-array check imports
    ``numpy.ma`` (about 0.01 s of a run; tests/results/test_metrics.py holds the two equal).

    The points' virtual indexes ``(n - 1) * q / 100``, their neighbouring order statistics (found by the same
    ``partition`` of a copy, with the same ``kth``), and ``a + (b - a) * g``, or ``b - (b - a) * (1 - g)`` where
    the weight ``g >= 0.5``."""
    n = len(v)
    virtual = (n - 1) * np.true_divide(np.asarray(q), 100)
    previous = np.floor(virtual)
    following = previous + 1
    at_end = virtual >= n - 1
    previous[at_end] = -1
    following[at_end] = -1
    previous, following = previous.astype(np.intp), following.astype(np.intp)
    arr = v.flatten()
    arr.partition(np.array(sorted({0, -1, *previous.tolist(), *following.tolist()}), dtype=np.intp))
    low, high = arr[previous], arr[following]
    weight = np.asarray(virtual - previous, dtype=virtual.dtype)
    diff = high - low
    out = np.add(low, diff * weight)
    np.subtract(high, diff * (1 - weight), out=out, where=weight >= 0.5, casting="unsafe")
    return out


def _nansum(values: np.ndarray) -> Any:
    """The sum pandas' ``Series.sum()`` gives a float column: NaN as 0, then NumPy's (pairwise) sum."""
    return np.where(np.isnan(values), 0.0, values).sum()


class _FrameColumns(Mapping[str, ColumnArray]):
    """A DataFrame's columns as arrays (``to_numpy()``, or the extension array of a ``str`` column)."""

    def __init__(self, frame: pd.DataFrame) -> None:
        self.frame = frame

    def __getitem__(self, name: str) -> ColumnArray:
        import pandas as pd

        column = self.frame[name]
        return column.array if isinstance(column.dtype, pd.api.extensions.ExtensionDtype) else column.to_numpy()

    def __iter__(self) -> Iterator[str]:
        return iter(self.frame.columns)

    def __len__(self) -> int:
        return len(self.frame.columns)


class _ArrowColumns(Mapping[str, ColumnArray]):
    """An Arrow table's columns as arrays: numbers as NumPy arrays (a null float is NaN), strings as they are."""

    def __init__(self, table: pa.Table) -> None:
        self.table = table

    def __getitem__(self, name: str) -> ColumnArray:
        column = self.table.column(name)
        if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
            return column
        return numpy_of(column)

    def __iter__(self) -> Iterator[str]:
        return iter(self.table.column_names)

    def __len__(self) -> int:
        return self.table.num_columns


class _RunColumns(Mapping[str, ColumnArray]):
    """One table of a run's :class:`~sim.trace.schema.ArrowTables` read a column at a time, never made whole: a
    long run's ``admissions`` and ``steps`` rows are mostly spilled to disk (:mod:`sim.trace.spill`), and the
    summary reads only ``steps``' column names and row count and some of ``admissions``' columns."""

    def __init__(self, tables: ArrowTables, name: str) -> None:
        self.tables = tables
        self.name = name

    def __getitem__(self, column: str) -> ColumnArray:
        values = self.tables.column(self.name, column)
        if pa.types.is_string(values.type) or pa.types.is_large_string(values.type):
            return values
        return numpy_of(values)

    def __iter__(self) -> Iterator[str]:
        return iter(self.tables.column_names(self.name))

    def __len__(self) -> int:
        return len(self.tables.column_names(self.name))

    @property
    def num_rows(self) -> int:
        return self.tables.num_rows(self.name)


class _PackedKVColumns(Mapping[str, ColumnArray]):
    """The recorder's packed ``kv_events`` (:class:`~sim.trace.recorder.KVEventTable`) read as columns
    without making it an Arrow table: ``group`` as a NumPy array, ``kind`` and ``cause`` as dictionary
    arrays of their codes (:func:`_coded` takes them as they are). Only the columns the summary reads."""

    _NAMES = ("kind", "group", "cause")

    def __init__(self, events: KVEventTable) -> None:
        self.events = events

    def __getitem__(self, name: str) -> ColumnArray:
        events = self.events
        if name == "group":
            return np.asarray(events.group, dtype=np.int64)
        if name in ("kind", "cause"):
            return coded_array(events.kind if name == "kind" else events.cause)
        raise KeyError(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self._NAMES)

    def __len__(self) -> int:
        return len(self._NAMES)


def _num_rows(table: TableColumns) -> int:
    if isinstance(table, _FrameColumns):
        return len(table.frame)
    if isinstance(table, _ArrowColumns):
        return table.table.num_rows
    if isinstance(table, _RunColumns):
        return table.num_rows
    return len(next(iter(table.values()))) if table else 0


def _columns_of(
    tables: ResultSource | Mapping[str, TableColumns] | Mapping[str, pa.Table],
) -> Mapping[str, TableColumns]:
    """Every table of ``tables`` as :data:`TableColumns`: a run's Arrow tables are read as they are (no
    pandas), a mapping of tables of arrays is taken as is, DataFrames are read column by column."""
    source = tables.tables if isinstance(tables, LoadedResult) else tables
    if isinstance(source, ArrowTables):
        events = source.recorded_kv_events
        return {
            name: _PackedKVColumns(events)
            if name == "kv_events" and events is not None
            else _RunColumns(source, name)
            if name in ("admissions", "steps")
            else _ArrowColumns(source.table(name))
            for name in source
        }
    if isinstance(source, Mapping) and source and all(isinstance(t, pa.Table) for t in source.values()):
        return {name: _ArrowColumns(table) for name, table in source.items()}
    if isinstance(source, Mapping) and source and all(isinstance(t, Mapping) for t in source.values()):
        return source
    return {name: _FrameColumns(frame) for name, frame in tables_of(tables).items()}  # type: ignore[arg-type]


def _coded(values: ColumnArray) -> tuple[np.ndarray, np.ndarray]:
    """``(codes, uniques)`` of a string column, to count many subsets of it without filtering tables: the
    values numbered in order of first appearance, as ``pandas.factorize`` numbers them; NA is code -1.
    (Dict lookups in C: pyarrow's dictionary_encode would import pyarrow.compute, about a tenth of a second.)"""
    if isinstance(values, pa.DictionaryArray) and not values.null_count:  # codes already (distinct values)
        uniques = np.empty(len(values.dictionary), dtype=object)
        uniques[:] = values.dictionary.to_pylist()
        return numpy_of(values.indices).astype(np.int64), uniques
    if isinstance(values, (pa.Array, pa.ChunkedArray)):
        items = values.to_pylist()
    elif isinstance(values, np.ndarray) or type(values).__module__.startswith("pandas"):
        items = [None if _is_na(v) else v for v in values]  # a DataFrame's column
    else:
        items = list(values)
    # dict.fromkeys keeps first appearances in order and looks every value up in C.
    index = {value: code for code, value in enumerate(v for v in dict.fromkeys(items) if v is not None)}
    uniques = np.empty(len(index), dtype=object)
    uniques[:] = list(index)
    index[None] = -1
    codes = np.fromiter(map(index.__getitem__, items), dtype=np.int64, count=len(items))
    return codes, uniques


def _is_na(value: object) -> bool:
    """None, NaN or pandas' NA (as ``pandas.factorize`` leaves them out)."""
    return value is None or (isinstance(value, float) and value != value) or type(value).__name__ == "NAType"


def _equal_to(values: ColumnArray, text: str) -> np.ndarray:
    """Rows of a string column equal to ``text`` (NA is not)."""
    codes, uniques = _coded(values)
    return _coded_in(codes, uniques, frozenset({text}))


def _coded_counts(codes: np.ndarray, uniques: np.ndarray, mask: np.ndarray) -> dict[str, int]:
    """``value_counts`` of the rows in ``mask`` of a :func:`_coded` column (NA left out), as
    ``{str(value): count}`` in value order."""
    picked = codes[mask]
    counts = np.bincount(picked[picked >= 0], minlength=len(uniques))
    return {str(k): int(n) for k, n in sorted((uniques[i], counts[i]) for i in np.flatnonzero(counts))}


def _coded_in(codes: np.ndarray, uniques: np.ndarray, members: frozenset[str]) -> np.ndarray:
    """Rows of a :func:`_coded` column whose value is one of ``members`` (NA is not), as ``isin`` has it."""
    return np.array([u in members for u in uniques] + [False], dtype=bool)[codes]


def _admitted_mask(admissions: TableColumns) -> np.ndarray:
    """Rows whose outcome admitted the request."""
    return ~_equal_to(admissions["outcome"], NOT_ADMITTED)


def _ratio(num: float, den: float) -> float | None:
    return float(num) / float(den) if den > 0 else None


def _first_rows(admissions: TableColumns, admitted: np.ndarray) -> np.ndarray:
    """Positions of each request's first admitted row, in table order (``admitted``: :func:`_admitted_mask`)."""
    rows = np.flatnonzero(admitted)
    codes, _ = _coded(admissions["request_id"])
    # The first position of every request id among the admitted rows (NA ids, code -1, count as one id):
    # np.unique(return_index=True)'s positions, without its import of numpy.ma.
    ids = codes[rows] + 1
    first = np.full(int(ids.max()) + 1 if len(ids) else 0, len(ids), dtype=np.int64)
    np.minimum.at(first, ids, np.arange(len(ids), dtype=np.int64))
    return rows[np.sort(first[first < len(ids)])]


def first_admissions(admissions: pd.DataFrame) -> pd.DataFrame:
    """Each request's first admitted row, in table order (see module docstring)."""
    columns = _FrameColumns(admissions)
    return admissions.iloc[_first_rows(columns, _admitted_mask(columns))]


def _hits(admissions: TableColumns, columns: Sequence[str], rows: np.ndarray) -> np.ndarray:
    """The ``rows`` (positions or a mask) of some ``hit_g<i>`` columns as an int64 matrix (one column each)."""
    return np.column_stack([np.asarray(admissions[c], dtype=np.int64)[rows] for c in columns])


def divergence_counts(admissions: pd.DataFrame, group_kinds: Sequence[str]) -> dict[str, int]:
    """``mamba_deeper`` / ``fa_deeper`` counts over admitted rows (module docstring)."""
    columns = _FrameColumns(admissions)
    return _divergences(columns, group_kinds, _admitted_mask(columns))


def _divergences(admissions: TableColumns, group_kinds: Sequence[str], admitted: np.ndarray) -> dict[str, int]:
    fa = [f"hit_g{i}" for i, k in enumerate(group_kinds) if k == FULL_ATTENTION]
    other = [f"hit_g{i}" for i, k in enumerate(group_kinds) if k != FULL_ATTENTION]
    if not fa or not other or not admitted.any():
        return {"mamba_deeper": 0, "fa_deeper": 0}
    # Hit columns are int64 (no NA), so numpy's row minimum equals pandas'.
    fa_hit = _hits(admissions, fa, admitted).min(axis=1)
    other_hits = _hits(admissions, other, admitted)
    return {
        "mamba_deeper": int((fa_hit < other_hits.max(axis=1)).sum()),
        "fa_deeper": int((fa_hit > other_hits.min(axis=1)).sum()),
    }


def run_summary(
    tables: ResultSource | Mapping[str, TableColumns],
    *,
    group_kinds: Sequence[str],
    slo_ttft_s: float | None = None,
    slo_tpot_s: float | None = None,
    crash: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The run's metrics as a JSON-able dict with sorted keys (the body of ``summary.json``).

    ``tables`` is a result, a mapping of table name to DataFrame, or one of table name to
    :data:`TableColumns` (or a run's Arrow tables, :func:`~sim.trace.schema.arrow_tables_from_recorder`); ``group_kinds`` names the attention type of each KV-cache
    group in group order; ``crash`` is ``None`` or ``{step, time_s,
    request_id, reason}`` (docs/design.md §6).

    Computed column by column on NumPy arrays (each column read once), with the
    same operations in the same order as :func:`request_metrics` and pandas'
    reductions (a float sum is NaN-as-0 then NumPy's sum, as ``Series.sum``),
    so every statistic is the pandas definition's, bit for bit.
    """
    t = _columns_of(tables)
    adm, req, kv = t["admissions"], t["requests"], t["kv_events"]
    num_groups = max(infer_num_groups(adm), infer_num_groups(t["steps"]))
    if len(group_kinds) != num_groups:
        raise ValueError(
            f"group_kinds has {len(group_kinds)} entries {list(group_kinds)} but the tables have "
            f"{num_groups} KV-cache groups; give one attention type per group"
        )
    for name, value in (("slo_ttft_s", slo_ttft_s), ("slo_tpot_s", slo_tpot_s)):
        if value is not None and not value > 0:
            raise ValueError(f"{name} must be a positive number of seconds or null, got {value!r}")

    done = _Finished(req)
    admitted = _admitted_mask(adm)
    first = _first_rows(adm, admitted)
    return {
        "groups": list(group_kinds),
        "crash": dict(crash) if crash is not None else None,
        "num_steps": _num_rows(t["steps"]),
        "requests": _request_section(req, done),
        "latency_s": _latency_section(done),
        "throughput": {
            "duration_s": done.duration,
            "requests_per_s": _ratio(done.count, done.duration) if done.duration else None,
            "output_tokens_per_s": _ratio(done.output_tokens.sum(), done.duration) if done.duration else None,
        },
        "goodput": _goodput_section(done, slo_ttft_s, slo_tpot_s),
        "cache": _cache_section(adm, first, group_kinds, num_groups),
        "admissions": _admission_section(adm, admitted, group_kinds),
        "evictions": _eviction_section(kv, num_groups),
    }


class _Finished:
    """The finished requests' columns and latencies (:func:`request_metrics`' rows with ``finished``), as arrays."""

    def __init__(self, req: TableColumns) -> None:
        arrival = np.asarray(req["arrival_s"])
        first_token = np.asarray(req["first_token_s"])
        finished_s = np.asarray(req["finished_s"])
        out_tokens = np.asarray(req["output_tokens"])
        self.outcome_codes, self.outcome_values = _coded(req["outcome"])
        finished = ~np.isnan(finished_s) & _coded_in(self.outcome_codes, self.outcome_values, FINISHED_OUTCOMES)
        rows = np.flatnonzero(finished)
        decode_gaps = np.where(out_tokens > 1, out_tokens - 1, np.nan)
        self.count = len(rows)
        self.output_tokens = out_tokens[rows]
        self.outcome = self.outcome_codes[rows]
        self.ttft = (first_token - arrival)[rows]
        self.tpot = ((finished_s - first_token) / decode_gaps)[rows]
        self.e2e = (finished_s - arrival)[rows]
        self.queueing = (np.asarray(req["first_scheduled_s"]) - arrival)[rows]
        # Throughput's span: the first arrival (of any request) to the last finish.
        known = arrival[~np.isnan(arrival)]
        span = finished_s[rows].max() - known.min() if self.count and len(known) else np.nan
        self.duration = float(span) if not np.isnan(span) and span > 0 else None


def _request_section(req: TableColumns, done: _Finished) -> dict[str, Any]:
    rows = _num_rows(req)
    every = np.ones(rows, dtype=bool)

    def total(col: str) -> int:
        return int(np.asarray(req[col]).sum())

    return {
        "total": rows,
        "finished": int(done.count),
        "failed": int(rows - done.count),
        "by_outcome": _coded_counts(done.outcome_codes, done.outcome_values, every),
        "preemptions": total("preemptions"),
        "local_hit_tokens": total("local_hit_tokens"),
        "external_hit_tokens": total("external_hit_tokens"),
        "prompt_tokens": total("prompt_tokens"),
        "output_tokens": total("output_tokens"),
    }


def _latency_section(done: _Finished) -> dict[str, Any]:
    """Distributions over finished requests; ITL is decode time over decode gaps (requests with > 1 token)."""
    decode_time = _nansum(done.tpot * (done.output_tokens - 1))
    decode_gaps = _nansum(np.where(done.output_tokens > 1, done.output_tokens - 1, np.nan))
    return {
        "ttft": _distribution(done.ttft),
        "tpot": _distribution(done.tpot),
        "e2e": _distribution(done.e2e),
        "queueing": _distribution(done.queueing),
        "itl": {"mean": _ratio(decode_time, decode_gaps) if decode_gaps > 0 else None},
    }


def _goodput_section(done: _Finished, slo_ttft_s: float | None, slo_tpot_s: float | None) -> dict[str, Any]:
    """Finished, not corrupt, and within every SLO bound given (a single-token request has no TPOT)."""
    good = ~_coded_in(done.outcome, done.outcome_values, frozenset({"corrupt"}))
    if slo_ttft_s is not None:
        good &= done.ttft <= slo_ttft_s
    if slo_tpot_s is not None:
        good &= np.isnan(done.tpot) | (done.tpot <= slo_tpot_s)
    count = int(good.sum())
    return {
        "slo_ttft_s": slo_ttft_s,
        "slo_tpot_s": slo_tpot_s,
        "requests": count,
        "requests_per_s": _ratio(count, done.duration) if done.duration else None,
    }


def _cache_section(adm: TableColumns, first: np.ndarray, group_kinds: Sequence[str], num_groups: int) -> dict[str, Any]:
    """Hit rates over each request's first admission (rows ``first``), as fractions of their prompt tokens."""

    def total(col: str) -> Any:
        return np.asarray(adm[col])[first].sum()

    prompt = float(total("prompt_tokens"))
    fa = [f"hit_g{i}" for i, kind in enumerate(group_kinds) if kind == FULL_ATTENTION]
    return {
        "first_admissions": int(len(first)),
        "prompt_tokens": int(prompt),
        "hit_rate": {f"g{i}": _ratio(total(f"hit_g{i}"), prompt) for i in range(num_groups)},
        "local_rate": _ratio(total("local_tokens"), prompt),
        # The full-attention groups alone: their minimum hit per admission (None without such a group).
        "full_attention_hit_rate": _ratio(int(_hits(adm, fa, first).min(axis=1).sum()), prompt) if fa else None,
        "external_rate": _ratio(total("external_tokens"), prompt),
    }


def _admission_section(adm: TableColumns, admitted: np.ndarray, group_kinds: Sequence[str]) -> dict[str, Any]:
    outcomes, outcome_values = _coded(adm["outcome"])
    policies, policy_values = _coded(adm["policy"])
    reasons, reason_values = _coded(adm["crash_reason"])
    attempts = _num_rows(adm)
    every = np.ones(attempts, dtype=bool)
    by_policy = sorted(range(len(policy_values)), key=lambda i: str(policy_values[i]))
    return {
        "attempts": attempts,
        "admitted": int(admitted.sum()),
        "by_outcome": _coded_counts(outcomes, outcome_values, every),
        "by_policy": {str(policy_values[i]): _coded_counts(outcomes, outcome_values, policies == i) for i in by_policy},
        "crash_reasons": _coded_counts(reasons, reason_values, ~_coded_in(reasons, reason_values, frozenset({""}))),
        "fallbacks": int(np.asarray(adm["fallback"]).sum()),
        "hit_diverged": int(np.asarray(adm["hit_diverged"]).sum()),
        "divergences": _divergences(adm, group_kinds, admitted),
        "tokens_recomputed": int(np.asarray(adm["tokens_lost"]).sum()),
    }


def _eviction_section(kv: TableColumns, num_groups: int) -> dict[str, Any]:
    # Column by column: filtering the whole (large) kv_events frame would copy every column.
    removed = _equal_to(kv["kind"], "removed")
    groups = np.asarray(kv["group"])
    causes, cause_values = _coded(kv["cause"])
    # A run's spilled rows (sim.trace.spill) are counted by the recorder as they leave: (group, cause) -> rows.
    spilled = kv.events.removed_spilled if isinstance(kv, _PackedKVColumns) else {}
    by_group = {}
    for g in range(num_groups):
        of_group = removed & (groups == g)
        by_cause = _coded_counts(causes, cause_values, of_group)
        total = int(of_group.sum())
        if spilled:
            for (group, cause), n in spilled.items():
                if group == g:
                    by_cause[cause] = by_cause.get(cause, 0) + n
                    total += n
            by_cause = dict(sorted(by_cause.items()))
        by_group[f"g{g}"] = {"total": total, "by_cause": by_cause}
    return {"total": int(removed.sum()) + sum(spilled.values()), "by_group": by_group}


@dataclass(frozen=True)
class MambaPlacementLimits:
    """How a layout with Mamba groups saves states, for the ideal's split (:func:`add_ideal_hit_rate`).

    ``placement``: a fresh instance of the run's checkpoint policy (``None``: ``vllm``);
    ``retention_interval``: the run's ``cache.retention_interval``.
    """

    placement: BaseCheckpointPolicy | None
    retention_interval: int | None


def add_ideal_hit_rate(
    summary: dict[str, Any],
    tables: ResultSource,
    requests: Sequence[Any],
    block_size: int,
    mamba: MambaPlacementLimits | None = None,
) -> None:
    """Add the infinite-cache limit to ``summary["cache"]`` (``outputs.ideal_hit_rate: true``).

    ``ideal_hit_rate`` / ``ideal_hit_tokens``: :func:`sim.workload.stats.ideal_hit_tokens`
    at ``block_size`` (the scheduler block size: hits are aligned to it), over
    the run's requests in arrival order, over every request's prompt tokens (the
    denominator of ``local_rate`` when every request was admitted). ``missed_reuse_tokens``: ideal hit tokens minus the local and
    external tokens of first admissions, i.e. prompt tokens an infinite cache
    would have supplied but this run computed again (the tokens recomputed
    because of eviction or missing Mamba states).

    With Mamba groups (``mamba`` given) the ideal is split in two
    (:func:`sim.workload.stats.placement_hit_tokens`): ``ideal_vllm_placement_hit_rate``
    (and ``_tokens``), what an infinite pool reaches when a hit needs a Mamba
    state where vLLM's align mode saves them, and ``placement_loss_rate``, the
    ideal minus that: what vLLM's placement loses whatever the pool size.
    ``ideal_placement_hit_rate`` is the same infinite-pool limit under the
    run's own ``cache.mamba_checkpoint_policy`` (equal to the vLLM one for ``vllm``).
    """
    from sim.workload.stats import ideal_hit_tokens, placement_hit_tokens

    ordered = sorted(requests, key=lambda r: r.arrival_time)
    ideal = int(sum(ideal_hit_tokens(ordered, block_size)))
    adm = _columns_of(tables)["admissions"]
    first = _first_rows(adm, _admitted_mask(adm))
    reused = int(np.asarray(adm["local_tokens"])[first].sum() + np.asarray(adm["external_tokens"])[first].sum())
    cache = summary["cache"]
    prompt = float(summary["requests"]["prompt_tokens"])
    cache["ideal_hit_tokens"] = ideal
    cache["ideal_hit_rate"] = _ratio(ideal, prompt)
    cache["missed_reuse_tokens"] = max(0, ideal - reused)
    if mamba is None:
        return
    vllm = int(sum(placement_hit_tokens(ordered, block_size, None, mamba.retention_interval)))
    cache["ideal_vllm_placement_hit_tokens"] = vllm
    cache["ideal_vllm_placement_hit_rate"] = _ratio(vllm, prompt)
    cache["placement_loss_rate"] = _ratio(ideal - vllm, prompt)
    own = vllm
    if mamba.placement is not None:
        own = int(sum(placement_hit_tokens(ordered, block_size, mamba.placement, mamba.retention_interval)))
    cache["ideal_placement_hit_rate"] = _ratio(own, prompt)
