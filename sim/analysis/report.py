"""Human-readable views of ``summary.json``: the end-of-run table and the cross-run comparison.

Pure formatting over the summary dict written by :func:`sim.results.metrics.run_summary`
and the engine; a key a summary lacks is shown as ``-``.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence


def _get(summary: Mapping[str, Any], path: str) -> Any:
    node: Any = summary
    for part in path.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def _fmt(value: Any, unit: str = "") -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        if unit == "%":
            return f"{100 * value:.1f}%"
        if unit == "s":
            return f"{value * 1000:.1f} ms" if abs(value) < 1 else f"{value:.3f} s"
        return f"{value:.3g}"
    if isinstance(value, Mapping):
        return ", ".join(f"{k}={_fmt(v)}" for k, v in value.items()) or "-"
    return str(value)


def _time_unit(summary: Mapping[str, Any]) -> str:
    return "" if summary.get("clock") == "steps" else "s"


def summary_rows(summary: Mapping[str, Any]) -> list[tuple[str, str]]:
    """``(label, value)`` rows for the end-of-run table (latencies in steps with ``clock: steps``)."""
    unit = _time_unit(summary)
    steps_note = " (steps)" if unit == "" else ""
    kinds = summary.get("groups") or []
    rows: list[tuple[str, str]] = [
        ("status", _fmt(summary.get("status"))),
        ("requests", f"{_fmt(_get(summary, 'requests.finished'))} finished / {_fmt(_get(summary, 'requests.total'))}"),
        ("engine steps", _fmt(summary.get("steps"))),
    ]
    for name in ("ttft", "tpot", "e2e"):
        p50 = _get(summary, f"latency_s.{name}.p50")
        p99 = _get(summary, f"latency_s.{name}.p99")
        rows.append((f"{name.upper()} p50 / p99{steps_note}", f"{_fmt(p50, unit)} / {_fmt(p99, unit)}"))
    rows.append(("throughput (req/s, tok/s)", f"{_fmt(_get(summary, 'throughput.requests_per_s'))}, "
                 f"{_fmt(_get(summary, 'throughput.output_tokens_per_s'))}"))
    hit = _get(summary, "cache.hit_rate") or {}
    for key, value in hit.items():
        i = int(key[1:]) if key[1:].isdigit() else None
        kind = kinds[i] if i is not None and i < len(kinds) else ""
        rows.append((f"hit rate {key} {kind}".rstrip(), _fmt(value, "%")))
    rows += [
        ("local / external hit rate", f"{_fmt(_get(summary, 'cache.local_rate'), '%')} / "
                                      f"{_fmt(_get(summary, 'cache.external_rate'), '%')}"),
        ("divergences", _fmt(_get(summary, "admissions.divergences"))),
        ("fallbacks", _fmt(_get(summary, "admissions.fallbacks"))),
        ("admission outcomes", _fmt(_get(summary, "admissions.by_outcome"))),
        ("tokens recomputed by policy", _fmt(_get(summary, "admissions.tokens_recomputed"))),
        ("preemptions", _fmt(_get(summary, "requests.preemptions"))),
    ]
    by_group = _get(summary, "evictions.by_group") or {}
    rows.append(("evictions per group", ", ".join(f"{g}={_fmt(v.get('total'))}" for g, v in by_group.items()) or "-"))
    crash = summary.get("crash")
    if crash:
        rows.append(("CRASH", f"step {crash.get('step')} request {crash.get('request_id')}: {crash.get('reason')}"))
    return rows


COMPARE_COLUMNS: Sequence[tuple[str, str, str]] = (
    ("policy", "policy", ""),
    ("status", "status", ""),
    ("finished", "requests.finished", ""),
    ("TTFT p50", "latency_s.ttft.p50", "t"),
    ("TTFT p99", "latency_s.ttft.p99", "t"),
    ("hit g0", "cache.hit_rate.g0", "%"),
    ("hit g1", "cache.hit_rate.g1", "%"),
    ("fallbacks", "admissions.fallbacks", ""),
    ("outcomes", "admissions.by_outcome", ""),
    ("recomputed", "admissions.tokens_recomputed", ""),
    ("crash", "crash.reason", ""),
)


def compare_rows(summaries: Mapping[str, Mapping[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """A header and one row per run for ``hybridsim compare``."""
    header = ["run"] + [label for label, _, _ in COMPARE_COLUMNS]
    rows = []
    for label, summary in summaries.items():
        unit = _time_unit(summary)
        row = [label]
        for _, path, kind in COMPARE_COLUMNS:
            row.append(_fmt(_get(summary, path), unit if kind == "t" else kind))
        rows.append(row)
    return header, rows
