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
    crashes = int(_get(summary, "admissions.by_outcome.crash") or 0)
    status = _fmt(summary.get("status"))
    if crashes and summary.get("status") == "complete":
        status += f" ({crashes} crash{'es' if crashes > 1 else ''} recorded)"
    rows: list[tuple[str, str]] = [
        ("status", status),
        ("requests", f"{_fmt(_get(summary, 'requests.finished'))} finished / {_fmt(_get(summary, 'requests.total'))}"),
        ("engine steps", _fmt(summary.get("steps"))),
    ]
    for name in ("ttft", "tpot", "e2e"):
        p50 = _get(summary, f"latency_s.{name}.p50")
        p99 = _get(summary, f"latency_s.{name}.p99")
        rows.append((f"{name.upper()} p50 / p99{steps_note}", f"{_fmt(p50, unit)} / {_fmt(p99, unit)}"))
    p50, p99 = _get(summary, "latency_s.queueing.p50"), _get(summary, "latency_s.queueing.p99")
    rows.append((f"queueing p50 / p99{steps_note}", f"{_fmt(p50, unit)} / {_fmt(p99, unit)}"))
    per = "step" if unit == "" else "s"
    rows.append(
        (
            f"throughput (req/{per}, tok/{per})",
            f"{_fmt(_get(summary, 'throughput.requests_per_s'))}, "
            f"{_fmt(_get(summary, 'throughput.output_tokens_per_s'))}",
        )
    )
    sizes = summary.get("block_sizes") or []
    if summary.get("num_blocks") is not None:
        size_text = f"{sizes[0]} tokens" if sizes and len(set(sizes)) == 1 else "/".join(map(str, sizes)) + " tokens"
        rows.append(
            (
                "KV-cache pool",
                f"{summary['num_blocks']} blocks of {size_text}, {len(kinds)} groups"
                if sizes
                else f"{summary['num_blocks']} blocks",
            )
        )
    policy, path = summary.get("policy"), summary.get("lookup_path")
    if policy is not None:
        rows.append(("prefix policy (lookup path)", f"{policy} ({path})" if path and path != policy else str(policy)))
    connector = _connector_row(summary)
    if connector is not None:
        rows.append(("connector", connector))
    hit = _get(summary, "cache.hit_rate") or {}
    for key, value in hit.items():
        i = int(key[1:]) if key[1:].isdigit() else None
        kind = kinds[i] if i is not None and i < len(kinds) else ""
        rows.append((f"hit rate {key} {kind}".rstrip(), _fmt(value, "%")))
    rows += [
        (
            "local / external hit rate",
            f"{_fmt(_get(summary, 'cache.local_rate'), '%')} / {_fmt(_get(summary, 'cache.external_rate'), '%')}",
        ),
        ("divergences", _fmt(_get(summary, "admissions.divergences"))),
        ("fallbacks", _fmt(_get(summary, "admissions.fallbacks"))),
        ("admission outcomes", _fmt(_get(summary, "admissions.by_outcome"))),
        ("tokens recomputed by policy", _fmt(_get(summary, "admissions.tokens_recomputed"))),
        ("preemptions", _fmt(_get(summary, "requests.preemptions"))),
    ]
    by_group = _get(summary, "evictions.by_group") or {}
    rows.append(("evictions per group", ", ".join(f"{g}={_fmt(v.get('total'))}" for g, v in by_group.items()) or "-"))
    rejected = (_get(summary, "requests.by_outcome") or {}).get("rejected")
    if rejected:
        rows.append(("rejected (prompt > max_model_len)", _fmt(rejected)))
    crash = summary.get("crash")
    if crash:
        rows.append(("CRASH", f"step {crash.get('step')} request {crash.get('request_id')}: {crash.get('reason')}"))
    return rows


def _bytes(n: Any) -> str:
    if not isinstance(n, (int, float)):
        return "-"
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.3g} {unit}"
    return f"{int(n)} B"


def _connector_row(summary: Mapping[str, Any]) -> str | None:
    """``offload: 12 loads (3.2 GB), 40 stores (9.1 GB), tier 8.0 GB / 20 GB`` (what the connector reports)."""
    name = summary.get("connector")
    if not name or name == "none":
        return None
    m = summary.get("connector_metrics") or {}
    parts = []
    if "queries" in m:
        parts.append(f"{m['queries']} queries, {m.get('hit_tokens', 0)} hit tokens")
    if "loads" in m:
        parts.append(f"{m['loads']} loads ({_bytes(m.get('bytes_loaded'))})")
    if "stores" in m:
        parts.append(f"{m['stores']} stores ({_bytes(m.get('bytes_stored'))})")
    if "tier_bytes" in m:
        parts.append(f"tier {_bytes(m['tier_bytes'])} / {_bytes(m.get('tier_capacity_bytes'))}")
    return f"{name}: {', '.join(parts)}" if parts else str(name)


COMPARE_COLUMNS: Sequence[tuple[str, str, str]] = (
    ("policy", "policy", ""),
    ("status", "status", ""),
    ("finished", "requests.finished", ""),
    ("TTFT p50", "latency_s.ttft.p50", "t"),
    ("TTFT p99", "latency_s.ttft.p99", "t"),
)

#: Group types in compare's column order, with their column names.
KIND_COLUMNS: Sequence[tuple[str, str]] = (
    ("full_attention", "hit FA"),
    ("sliding_window", "hit SWA"),
    ("mamba", "hit Mamba"),
)

COMPARE_TAIL: Sequence[tuple[str, str, str]] = (
    ("local", "cache.local_rate", "%"),
    ("external", "cache.external_rate", "%"),
    ("fallbacks", "admissions.fallbacks", ""),
    ("tokens lost", "admissions.tokens_recomputed", ""),
    ("conn loaded", "connector_metrics.bytes_loaded", "B"),
    ("conn stored", "connector_metrics.bytes_stored", "B"),
    ("goodput", "goodput.requests_per_s", "rate"),
    ("outcomes", "admissions.by_outcome", ""),
    ("crash", "crash.reason", ""),
)


def kind_hit_rate(summary: Mapping[str, Any], kind: str) -> float | None:
    """Mean hit rate over the groups of one type (``None`` when the run has no such group)."""
    kinds = summary.get("groups") or []
    rates = summary.get("cache", {}).get("hit_rate", {}) if isinstance(summary.get("cache"), Mapping) else {}
    values = [rates[f"g{i}"] for i, k in enumerate(kinds) if k == kind and f"g{i}" in rates]
    return sum(values) / len(values) if values else None


def compare_rows(summaries: Mapping[str, Mapping[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """A header and one row per run for ``hybridsim compare``: hit rates per group type (only the types
    some run has), local / external shares, tokens lost, connector bytes, goodput and the crash."""
    kinds = [(k, name) for k, name in KIND_COLUMNS if any(k in (s.get("groups") or []) for s in summaries.values())]
    # Summaries without group types (older bundles): the first two groups' columns.
    legacy = not any(s.get("groups") for s in summaries.values())
    header = (
        ["run"]
        + [label for label, _, _ in COMPARE_COLUMNS]
        + [name for _, name in kinds]
        + (["hit g0", "hit g1"] if legacy else [])
        + [label for label, _, _ in COMPARE_TAIL]
    )
    rows = []
    for label, summary in summaries.items():
        unit = _time_unit(summary)
        row = [label]
        for _, path, kind in COMPARE_COLUMNS:
            row.append(_fmt(_get(summary, path), unit if kind == "t" else kind))
        row += [_fmt(kind_hit_rate(summary, k), "%") for k, _ in kinds]
        if legacy:
            row += [_fmt(_get(summary, "cache.hit_rate.g0"), "%"), _fmt(_get(summary, "cache.hit_rate.g1"), "%")]
        for _, path, kind in COMPARE_TAIL:
            value = _get(summary, path)
            if kind == "B":
                row.append(_bytes(value) if value is not None else "-")
            elif kind == "rate":
                row.append("-" if value is None else f"{value:.3g}/{'step' if unit == '' else 's'}")
            else:
                row.append(_fmt(value, kind))
        rows.append(row)
    return header, rows
