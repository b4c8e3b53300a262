"""Human-readable views of ``summary.json``: the end-of-run table, and the value formatting that
``sim.analysis.compare`` shares.

Pure formatting over the summary dict written by :func:`sim.results.metrics.run_summary`
and the engine; a key a summary lacks is shown as ``-``.
"""

from __future__ import annotations

from typing import Any, Mapping


def lookup(summary: Mapping[str, Any], path: str) -> Any:
    node: Any = summary
    for part in path.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def format_value(value: Any, unit: str = "") -> str:
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
        return ", ".join(f"{k}={format_value(v)}" for k, v in value.items()) or "-"
    return str(value)


def _time_unit(summary: Mapping[str, Any]) -> str:
    return "" if summary.get("clock") == "steps" else "s"


def summary_rows(summary: Mapping[str, Any]) -> list[tuple[str, str]]:
    """``(label, value)`` rows for the end-of-run table (latencies in steps with ``clock: steps``)."""
    unit = _time_unit(summary)
    steps_note = " (steps)" if unit == "" else ""
    kinds = summary.get("groups") or []
    crashes = int(lookup(summary, "admissions.by_outcome.crash") or 0)
    status = format_value(summary.get("status"))
    if crashes and summary.get("status") == "complete":
        status += f" ({crashes} crash{'es' if crashes > 1 else ''} recorded)"
    rows: list[tuple[str, str]] = [
        ("status", status),
        (
            "requests",
            f"{format_value(lookup(summary, 'requests.finished'))} finished / {format_value(lookup(summary, 'requests.total'))}",
        ),
        ("engine steps", format_value(summary.get("steps"))),
    ]
    cluster = cluster_line(summary)
    if cluster is not None:
        rows.append(("cluster", cluster))
    for name in ("ttft", "tpot", "e2e"):
        p50 = lookup(summary, f"latency_s.{name}.p50")
        p99 = lookup(summary, f"latency_s.{name}.p99")
        rows.append((f"{name.upper()} p50 / p99{steps_note}", f"{format_value(p50, unit)} / {format_value(p99, unit)}"))
    p50, p99 = lookup(summary, "latency_s.queueing.p50"), lookup(summary, "latency_s.queueing.p99")
    rows.append((f"queueing p50 / p99{steps_note}", f"{format_value(p50, unit)} / {format_value(p99, unit)}"))
    per = "step" if unit == "" else "s"
    rows.append(
        (
            f"throughput (req/{per}, tok/{per})",
            f"{format_value(lookup(summary, 'throughput.requests_per_s'))}, "
            f"{format_value(lookup(summary, 'throughput.output_tokens_per_s'))}",
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
    hit = lookup(summary, "cache.hit_rate") or {}
    for name, kind, value in collapse_groups(hit, kinds):
        rows.append((f"hit rate {name} {kind}".rstrip(), format_value(value, "%")))
    rows += [
        (
            "local / external hit rate",
            f"{format_value(lookup(summary, 'cache.local_rate'), '%')} / {format_value(lookup(summary, 'cache.external_rate'), '%')}",
        ),
        ("divergences", format_value(lookup(summary, "admissions.divergences"))),
        ("fallbacks", format_value(lookup(summary, "admissions.fallbacks"))),
        ("admission outcomes", format_value(lookup(summary, "admissions.by_outcome"))),
        ("tokens recomputed by policy", format_value(lookup(summary, "admissions.tokens_recomputed"))),
        ("preemptions", format_value(lookup(summary, "requests.preemptions"))),
    ]
    by_group = lookup(summary, "evictions.by_group") or {}
    totals = {g: v.get("total") if isinstance(v, Mapping) else None for g, v in by_group.items()}
    rows.append(
        (
            "evictions per group",
            ", ".join(f"{name}={format_value(value)}" for name, _, value in collapse_groups(totals, kinds)) or "-",
        )
    )
    rejected = (lookup(summary, "requests.by_outcome") or {}).get("rejected")
    if rejected:
        rows.append(("rejected (prompt > max_model_len)", format_value(rejected)))
    crash = summary.get("crash")
    if crash:
        rows.append(("CRASH", f"step {crash.get('step')} request {crash.get('request_id')}: {crash.get('reason')}"))
    return rows


def collapse_groups(per_group: Mapping[str, Any], kinds: list[str]) -> list[tuple[str, str, Any]]:
    """``(name, kind, value)`` per run of consecutive groups of one type with equal values.

    A run of several groups is named ``g0–g5`` and its kind reads ``mamba (6 groups)`` (Nemotron-H's six
    identical Mamba groups are one row, as in the plots); a lone group keeps its own name (``g6``). Keys that
    are not ``g<index>`` stay on their own.
    """
    out: list[tuple[str, str, Any]] = []
    run: list[tuple[int, str, Any]] = []

    def close() -> None:
        if not run:
            return
        first, kind, value = run[0]
        if len(run) == 1:
            out.append((f"g{first}", kind, value))
        else:
            out.append((f"g{first}–g{run[-1][0]}", f"{kind} ({len(run)} groups)".lstrip(), value))
        run.clear()

    for key, value in per_group.items():
        index = int(key[1:]) if key.startswith("g") and key[1:].isdigit() else None
        if index is None:
            close()
            out.append((key, "", value))
            continue
        kind = kinds[index] if index < len(kinds) else ""
        if run and (run[-1][0] + 1 != index or run[-1][1] != kind or run[-1][2] != value):
            close()
        run.append((index, kind, value))
    close()
    return out


def bytes_text(n: Any) -> str:
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
        parts.append(f"{m['loads']} loads ({bytes_text(m.get('bytes_loaded'))})")
    if "stores" in m:
        parts.append(f"{m['stores']} stores ({bytes_text(m.get('bytes_stored'))})")
    if "tier_bytes" in m:
        parts.append(f"tier {bytes_text(m['tier_bytes'])} / {bytes_text(m.get('tier_capacity_bytes'))}")
    return f"{name}: {', '.join(parts)}" if parts else str(name)


def kind_hit_rate(summary: Mapping[str, Any], kind: str) -> float | None:
    """Mean hit rate over the groups of one type that have one (``None`` when the run has no such group, or
    none of them a rate: no lookup happened)."""
    kinds = summary.get("groups") or []
    rates = summary.get("cache", {}).get("hit_rate", {}) if isinstance(summary.get("cache"), Mapping) else {}
    values = [rates[f"g{i}"] for i, k in enumerate(kinds) if k == kind and rates.get(f"g{i}") is not None]
    return sum(values) / len(values) if values else None


#: The per-instance figures of a cluster run, ``(label, path in the instance's summary, unit)``: the columns
#: of ``show``'s instance table and the per-instance rows of ``compare``. ``routed`` is read from the
#: cluster section (``cluster.routed[i]``); every other path from ``instances[i]``.
INSTANCE_FIGURES: tuple[tuple[str, str, str], ...] = (
    ("routed", "routed", ""),
    ("finished", "requests.finished", ""),
    ("TTFT p50", "latency_s.ttft.p50", "t"),
    ("TTFT p95", "latency_s.ttft.p95", "t"),
    ("local hit rate", "cache.local_rate", "%"),
    ("FA hit rate", "cache.full_attention_hit_rate", "%"),
    ("divergences FA-deeper", "admissions.divergences.fa_deeper", ""),
    ("divergences mamba-deeper", "admissions.divergences.mamba_deeper", ""),
    ("fallbacks", "admissions.fallbacks", ""),
    ("preemptions", "requests.preemptions", ""),
    ("evictions", "evictions.total", ""),
)


def instance_value(summary: Mapping[str, Any], index: int, path: str) -> Any:
    """One :data:`INSTANCE_FIGURES` value of instance ``index`` of a cluster summary (``None`` if missing)."""
    if path == "routed":
        routed = lookup(summary, "cluster.routed")
        return routed[index] if isinstance(routed, list) and index < len(routed) else None
    instances = summary.get("instances")
    if not isinstance(instances, list) or index >= len(instances) or not isinstance(instances[index], Mapping):
        return None
    return lookup(instances[index], path)


def num_instances(summary: Mapping[str, Any]) -> int:
    """How many instances a cluster summary has (0 for a one-instance run without a ``cluster`` section)."""
    instances = summary.get("instances")
    return len(instances) if isinstance(instances, list) else 0


def cluster_line(summary: Mapping[str, Any]) -> str | None:
    """``4 instances, router prefix_aware (group_aware)`` for a cluster summary, else ``None``."""
    n = num_instances(summary)
    if not n:
        return None
    router = lookup(summary, "cluster.router")
    aware = " (group_aware)" if lookup(summary, "cluster.group_aware") else ""
    delay = lookup(summary, "cluster.view_delay")
    stale = f", view delay {format_value(delay, _time_unit(summary))}" if delay else ""
    return f"{n} instances, router {format_value(router)}{aware}{stale}"


def instance_table(summary: Mapping[str, Any]) -> tuple[list[str], list[list[str]]]:
    """The heading and one row per instance of a cluster summary (no rows for a one-instance run)."""
    unit = _time_unit(summary)
    header = ["instance", *(label for label, _, _ in INSTANCE_FIGURES)]
    rows = []
    for i in range(num_instances(summary)):
        cells = [str(i)]
        for _, path, kind in INSTANCE_FIGURES:
            cells.append(format_value(instance_value(summary, i, path), unit if kind == "t" else kind))
        rows.append(cells)
    return header, rows
