"""The cross-run comparison behind ``hybridsim compare``: metrics as rows, runs as columns.

Pure formatting over ``summary.json`` dicts (no tables, no plotting). Invariants:

- The first run is the baseline. A numeric metric *differs* when some run's value is off the baseline's by
  more than the tolerance, relative to the baseline's magnitude (``|v - v0| > tol * |v0|``; with a zero
  baseline, any non-zero value differs); a text metric differs when the texts differ. Differing rows carry
  each run's ratio to the baseline (``None`` where the baseline is 0 or a value is missing).
- Rows appear in a fixed order (a cluster's rows, then per instance, after the run-wide ones); a metric no run has is left out, so the table only grows with what the
  runs report (group types, outcomes and connector figures vary by run).
- Every output format (table, markdown, csv, json) renders the same :class:`Comparison`; csv and json carry
  the raw values (seconds, fractions, counts), the table and markdown carry formatted cells.
"""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass
from typing import Any, Literal, Mapping, Sequence

from sim.analysis.report import (
    INSTANCE_FIGURES,
    bytes_text,
    format_value,
    instance_value,
    kind_hit_rate,
    lookup,
    num_instances,
)
from sim.trace.csvcell import neutralise_row

#: ``hybridsim compare --format`` choices.
FORMATS = ("table", "markdown", "csv", "json")
Format = Literal["table", "markdown", "csv", "json"]

#: The default relative tolerance under which two runs' figures count as the same.
DEFAULT_TOLERANCE = 0.02

Unit = Literal["", "t", "%", "B", "rate", "text"]


@dataclass(frozen=True)
class Metric:
    """One row: a label, where its value sits in ``summary.json`` and how to show it."""

    label: str
    path: str
    unit: Unit = ""


#: The latency figures, per metric and percentile.
LATENCIES: Sequence[tuple[str, str]] = (("TTFT", "ttft"), ("TPOT", "tpot"), ("E2E", "e2e"), ("queueing", "queueing"))
PERCENTILES: Sequence[str] = ("p50", "p95", "p99")

HEAD: Sequence[Metric] = (
    Metric("prefix policy", "policy", "text"),
    Metric("status", "status", "text"),
    Metric("requests finished", "requests.finished"),
    Metric("requests total", "requests.total"),
)

#: Group types with their row labels, in row order.
KIND_LABELS: Sequence[tuple[str, str]] = (
    ("full_attention", "hit rate FA"),
    ("sliding_window", "hit rate SWA"),
    ("mamba", "hit rate Mamba"),
)

TAIL: Sequence[Metric] = (
    Metric("local hit rate", "cache.local_rate", "%"),
    Metric("external hit rate", "cache.external_rate", "%"),
    Metric("divergences mamba-deeper", "admissions.divergences.mamba_deeper"),
    Metric("divergences FA-deeper", "admissions.divergences.fa_deeper"),
    Metric("fallbacks", "admissions.fallbacks"),
    Metric("tokens recomputed", "admissions.tokens_recomputed"),
    Metric("preemptions", "requests.preemptions"),
    Metric("evictions", "evictions.total"),
    Metric("connector loaded", "connector_metrics.bytes_loaded", "B"),
    Metric("connector stored", "connector_metrics.bytes_stored", "B"),
    Metric("goodput", "goodput.requests_per_s", "rate"),
    Metric("throughput (tok)", "throughput.output_tokens_per_s", "rate"),
)

CRASH = Metric("crash", "crash.reason", "text")

#: A cluster's own rows (then one block of :data:`~sim.analysis.report.INSTANCE_FIGURES` rows per instance).
CLUSTER: Sequence[Metric] = (
    Metric("instances", "cluster.instances"),
    Metric("router", "cluster.router", "text"),
    Metric("router group_aware", "cluster.group_aware", "text"),
)


@dataclass(frozen=True)
class Row:
    """One compared metric: raw values and cells per run, whether the runs differ, ratios to the first."""

    metric: str
    values: tuple[Any, ...]
    cells: tuple[str, ...]
    differs: bool
    ratios: tuple[float | None, ...]


@dataclass(frozen=True)
class Comparison:
    """The rows of a comparison of ``runs`` (labels, the first is the baseline)."""

    runs: tuple[str, ...]
    rows: tuple[Row, ...]
    tolerance: float


def _metrics(summaries: Sequence[Mapping[str, Any]]) -> list[tuple[Metric, list[Any]]]:
    """Every metric some run has, with each run's raw value (``None`` where a run lacks it)."""
    out: list[tuple[Metric, list[Any]]] = []

    def add(metric: Metric, values: list[Any]) -> None:
        if any(v is not None for v in values):
            out.append((metric, values))

    for m in HEAD:
        add(m, [lookup(s, m.path) for s in summaries])
    for label, name in LATENCIES:
        for p in PERCENTILES:
            m = Metric(f"{label} {p}", f"latency_s.{name}.{p}", "t")
            add(m, [lookup(s, m.path) for s in summaries])
    for kind, label in KIND_LABELS:
        add(Metric(label, f"groups:{kind}", "%"), [kind_hit_rate(s, kind) for s in summaries])
    for m in TAIL:
        add(m, [lookup(s, m.path) for s in summaries])
    for section, noun in (("requests.by_outcome", "requests"), ("admissions.by_outcome", "admissions")):
        keys = sorted({k for s in summaries for k in (lookup(s, section) or {})})
        for key in keys:
            values = [
                (lookup(s, section) or {}).get(key, 0) if lookup(s, section) is not None else None for s in summaries
            ]
            add(Metric(f"{noun} {key}", f"{section}.{key}"), values)
    for m in CLUSTER:
        add(m, [lookup(s, m.path) for s in summaries])
    for i in range(max(num_instances(s) for s in summaries)):
        for label, path, unit in INSTANCE_FIGURES:
            metric = Metric(f"instance {i} {label}", f"instances.{i}.{path}", unit)  # type: ignore[arg-type]
            add(metric, [instance_value(s, i, path) for s in summaries])
    add(CRASH, [lookup(s, CRASH.path) for s in summaries])
    return out


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _differs(values: Sequence[Any], tolerance: float) -> bool:
    numbers = [_number(v) for v in values]
    if all(n is not None for n in numbers):
        base = numbers[0]
        assert base is not None
        return any(abs(n - base) > tolerance * abs(base) or (base == 0 and n != 0) for n in numbers if n is not None)
    return len({json.dumps(v, sort_keys=True, default=str) for v in values}) > 1


def _ratios(values: Sequence[Any]) -> tuple[float | None, ...]:
    base = _number(values[0])
    return tuple(
        None if base in (None, 0.0) or _number(v) is None else _number(v) / base  # type: ignore[operator]
        for v in values
    )


def _cell(value: Any, unit: Unit, clock_unit: str) -> str:
    if value is None:
        return "-"
    if unit == "B":
        return bytes_text(value)
    if unit == "rate":
        return f"{value:.3g}/{'step' if clock_unit == '' else 's'}" if _number(value) is not None else str(value)
    if unit == "t":
        return format_value(value, clock_unit)
    if unit == "text":
        return format_value(value)
    return format_value(value, unit)


def compare(summaries: Mapping[str, Mapping[str, Any]], tolerance: float = DEFAULT_TOLERANCE) -> Comparison:
    """Compare runs (label -> summary), the first one being the baseline."""
    if not math.isfinite(tolerance) or tolerance < 0:
        raise ValueError(f"--tolerance must be a finite number >= 0, got {tolerance}")
    runs = tuple(summaries)
    listed = [summaries[r] for r in runs]
    clock_units = ["" if s.get("clock") == "steps" else "s" for s in listed]
    rows = []
    for metric, values in _metrics(listed):
        differs = len(values) > 1 and _differs(values, tolerance)
        cells = tuple(_cell(v, metric.unit, u) for v, u in zip(values, clock_units))
        rows.append(
            Row(metric.label, tuple(values), cells, differs, _ratios(values) if differs else (None,) * len(values))
        )
    return Comparison(runs, tuple(rows), tolerance)


def _display_cells(row: Row) -> list[str]:
    """Cells with the ratio to the baseline appended where the row differs (``54.5 ms ×1.12``)."""
    out = [row.cells[0]]
    for cell, ratio in zip(row.cells[1:], row.ratios[1:]):
        out.append(f"{cell} ×{ratio:.3g}" if row.differs and ratio is not None and ratio != 1.0 else cell)
    return out


def _heading(comparison: Comparison) -> list[str]:
    return ["metric", *comparison.runs, "Δ"]


def to_markdown(comparison: Comparison) -> str:
    """A GitHub table, for pasting into an issue (``|`` in a cell is escaped)."""

    def esc(text: str) -> str:
        return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")

    head = _heading(comparison)
    lines = ["| " + " | ".join(map(esc, head)) + " |", "|" + "---|" * len(head)]
    for row in comparison.rows:
        cells = [row.metric, *_display_cells(row), "*" if row.differs else ""]
        lines.append("| " + " | ".join(map(esc, cells)) + " |")
    lines.append("")
    lines.append(f"Δ: differs from the first run by more than {comparison.tolerance:.0%}; ×r is the ratio to it.")
    return "\n".join(lines) + "\n"


def to_csv(comparison: Comparison) -> str:
    """One line per metric, raw values per run, then ``differs`` (``true``/``false``)."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(neutralise_row(["metric", *comparison.runs, "differs"]))
    for row in comparison.rows:
        writer.writerow(
            neutralise_row(
                [
                    row.metric,
                    *("" if v is None else json.dumps(v) if isinstance(v, (dict, list)) else v for v in row.values),
                ]
                + ["true" if row.differs else "false"]
            )
        )
    return buf.getvalue()


def to_json(comparison: Comparison) -> str:
    """``{"runs": [...], "tolerance": t, "metrics": [{metric, values: {run: v}, differs, ratio: {run: r}}]}``."""
    doc = {
        "runs": list(comparison.runs),
        "tolerance": comparison.tolerance,
        "metrics": [
            {
                "metric": row.metric,
                "values": dict(zip(comparison.runs, row.values)),
                "differs": row.differs,
                "ratio": dict(zip(comparison.runs, row.ratios)),
            }
            for row in comparison.rows
        ],
    }
    return json.dumps(doc, indent=1, sort_keys=False, default=str) + "\n"


def table_rows(comparison: Comparison) -> tuple[list[str], list[list[str]]]:
    """The heading and rows of the terminal table (the same cells as markdown)."""
    return _heading(comparison), [[r.metric, *_display_cells(r), "*" if r.differs else ""] for r in comparison.rows]
