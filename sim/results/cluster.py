"""Stage 3 of a cluster run: :func:`finalize_cluster` turns a :class:`~sim.cluster.run.ClusterRecord` into one
:class:`~sim.results.finalize.RunResult` (docs/cluster.md).

Every table is the instances' tables stacked, with an ``instance`` column last (the instance's index;
``-1`` in ``requests`` for a request routed nowhere: rejected as too long, or not arrived when the run
stopped). Rows come in instance order (-1 first), each instance's rows in its own table order; ``seq`` of
``kv_events`` and ``step`` count per instance. ``summary.json`` holds the cluster's totals under the usual
keys (computed from the stacked tables with the one-instance definitions), a ``cluster`` section (instance
count, router, requests routed per instance) and ``instances``: each instance's own summary. With a shared KV
tier (``cluster.tier``) the result also has the ``tier_events`` table (:func:`tier_events`) and ``summary.json``
a ``tier`` section (:meth:`sim.cluster.tier.SharedTier.summary`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pandas as pd

from sim.cluster.pd import PREFILL_LEG_SUFFIX
from sim.cluster.run import ClusterRecord
from sim.cluster.tier import SharedTier
from sim.results.finalize import RunResult, finalize
from sim.results.metrics import run_summary
from sim.trace.bundle import LoadedResult
from sim.trace.schema import hash_to_hex
from sim.trace.tables import TABLE_NAMES, tables_from_recorder

#: Summary keys copied from an instance's summary into ``instances[i]`` (its scalars and per-group lists).
_INSTANCE_FACTS = ("num_blocks", "steps", "status", "policy", "lookup_path")


def _stack(frames: list[tuple[int, pd.DataFrame]]) -> pd.DataFrame:
    """The frames one after the other, with their instance's index as a last column (one copy: concat's)."""
    out = pd.concat([frame for _, frame in frames], ignore_index=True)
    out["instance"] = np.repeat(np.array([index for index, _ in frames], dtype=np.int64), [len(f) for _, f in frames])
    return out


def finalize_cluster(record: ClusterRecord) -> RunResult:
    """One result for the whole cluster; see the module docstring. Writes nothing."""
    scenario = record.scenario
    cluster = scenario.cluster
    assert cluster is not None
    results = [finalize(instance, with_sessions=False) for instance in record.instances]
    unrouted = tables_from_recorder(record.unrouted)
    tables: dict[str, pd.DataFrame] = {}
    for name in TABLE_NAMES:
        frames = [(-1, unrouted[name])] if name == "requests" and len(unrouted[name]) else []
        frames += [(i, r.tables[name]) for i, r in enumerate(results)]
        tables[name] = _stack(frames)
    first = record.instances[0]
    summary = run_summary(
        _client_view(tables) if record.pd is not None else tables,
        group_kinds=first.group_kinds,
        slo_ttft_s=scenario.slo.ttft_s if scenario.slo else None,
        slo_tpot_s=scenario.slo.tpot_s if scenario.slo else None,
        crash=record.crash,
    )
    routed = [0] * len(results)
    for index in record.routing.values():
        routed[index] += 1
    summary.update(
        {
            "name": scenario.name,
            "seed": scenario.seed,
            "clock": scenario.clock,
            "policy": scenario.scheduler.prefix_policy,
            "lookup_path": first.lookup_path,
            "connector": scenario.connector.type,
            "num_blocks": sum(r.kv_cache_config.num_blocks for r in record.instances),
            "block_sizes": [g.spec.block_size for g in first.kv_cache_config.groups],
            "steps": max(r.steps for r in record.instances),
            "simulated_s": record.simulated_s,
            "status": record.status,
            "message": record.message,
            "cluster": {
                "instances": len(results),
                "router": cluster.router.policy,
                "group_aware": cluster.router.group_aware,
                "view_delay": cluster.router.view_delay,
                "routed": routed,
            },
            "instances": [_instance_summary(i, r.summary) for i, r in enumerate(results)],
        }
    )
    crash_detail: dict[str, Any] | None = None
    if record.crash is not None:
        crashed = results[record.crash["instance"]]
        crash_detail = dict(crashed.crash_detail or {}, instance=record.crash["instance"])
    if record.tier is not None:
        summary["tier"] = record.tier.summary()
    if record.pd is not None:
        summary["pd"] = _pd_summary(record, tables)
    session_tables: dict[str, pd.DataFrame] = {}
    if scenario.workload.sessions is not None:
        session_tables, summary["sessions"] = _cluster_sessions(record, tables, scenario.workload.sessions.mode)
    return RunResult(
        summary=summary,
        tables=tables,
        path=None,
        group_kinds=list(first.group_kinds),
        status=record.status,
        scenario=scenario,
        crash_detail=crash_detail,
        session_tables=session_tables,
        tier_tables={} if record.tier is None else {"tier_events": tier_events(record.tier)},
    )


#: ``tier_events`` columns in order (docs/cluster.md): one row per object stored into, removed from or loaded
#: from the shared tier, in the order it happened.
TIER_EVENT_COLUMNS = (
    "seq",
    "time",
    "instance",
    "kind",
    "group",
    "group_kind",
    "block_hash",
    "bytes",
    "request_id",
    "cause",
)


def tier_events(tier: SharedTier) -> pd.DataFrame:
    """The shared tier's events as a table: ``seq`` from 0, ``time`` when the change took effect (a store's
    completion, a load's completion), ``instance`` whose transfer caused it, ``block_hash`` the object's
    chunk-end hash (16 hex digits), ``bytes`` the object's size."""
    rows = tier.log_rows
    kinds = tier.group_kinds
    return pd.DataFrame(
        {
            "seq": pd.array(range(len(rows)), dtype="int64"),
            "time": pd.array([e.time for e in rows], dtype="float64"),
            "instance": pd.array([e.instance for e in rows], dtype="int64"),
            "kind": pd.array([e.kind for e in rows], dtype="str"),
            "group": pd.array([e.group for e in rows], dtype="int64"),
            "group_kind": pd.array([kinds[e.group] for e in rows], dtype="str"),
            "block_hash": pd.array([hash_to_hex(e.key) for e in rows], dtype="str"),
            "bytes": pd.array([e.nbytes for e in rows], dtype="int64"),
            "request_id": pd.array([e.request_id for e in rows], dtype="str"),
            "cause": pd.array([e.cause for e in rows], dtype="str"),
        },
        columns=list(TIER_EVENT_COLUMNS),
    )


def _is_leg(table: pd.DataFrame) -> pd.Series:
    return table["request_id"].str.endswith(PREFILL_LEG_SUFFIX)


def _client_view(tables: dict[str, pd.DataFrame]) -> dict[str, pd.DataFrame]:
    """A P/D cluster's tables as the clients see them: without the prefill legs' requests and admissions
    (each request's latency and hits are its decode instance's row: TTFT from the client's arrival)."""
    out = dict(tables)
    for name in ("requests", "admissions"):
        out[name] = tables[name].loc[~_is_leg(tables[name])].reset_index(drop=True)
    return out


def _pd_summary(record: ClusterRecord, tables: dict[str, pd.DataFrame]) -> dict[str, Any]:
    """``summary.json``'s ``pd`` section: the instances by role, the prefill legs (their local prefix hits,
    their time to the prefill's one token) and the decode instances' pulls."""
    cluster = record.scenario.cluster
    assert cluster is not None and record.pd is not None
    roles = [spec.role for spec in cluster.instance_specs()]
    requests, admissions = tables["requests"], tables["admissions"]
    legs = requests.loc[_is_leg(requests)]
    leg_admissions = admissions.loc[_is_leg(admissions)]
    prompt = int(leg_admissions["prompt_tokens"].sum())
    local = int(leg_admissions["local_tokens"].sum())
    prefill_s = (legs["first_token_s"] - legs["arrival_s"]).dropna()
    pulls = {"loads": 0, "bytes_loaded": 0, "transfer_time": 0.0}
    for run, role in zip(record.instances, roles):
        if role == "decode" and run.connector_metrics:
            for key in pulls:
                pulls[key] += run.connector_metrics.get(f"remote.{key}", run.connector_metrics.get(key, 0))
    return {
        "prefill_instances": [i for i, r in enumerate(roles) if r == "prefill"],
        "decode_instances": [i for i, r in enumerate(roles) if r == "decode"],
        "prefills": record.pd.prefills,
        "prefill_local_hit_tokens": local,
        "prefill_local_hit_rate": local / prompt if prompt else None,
        "prefill_s_p50": float(prefill_s.quantile(0.5)) if len(prefill_s) else None,
        "pulls": pulls["loads"],
        "bytes_pulled": pulls["bytes_loaded"],
        "pulled_tokens": int(requests.loc[~_is_leg(requests), "external_hit_tokens"].sum()),
        "pull_time_mean": pulls["transfer_time"] / pulls["loads"] if pulls["loads"] else None,
    }


def _cluster_sessions(
    record: ClusterRecord, tables: dict[str, pd.DataFrame], mode: str
) -> tuple[dict[str, pd.DataFrame], dict[str, Any]]:
    """The ``turns`` and ``sessions`` tables over the whole cluster (a turn's parent may have run on another
    instance), as the clients see the requests (a P/D cluster's prefill legs left out): one row per request
    that has a ``requests`` row, in workload order."""
    from sim.results.sessions import session_tables_and_summary

    view = _client_view(tables) if record.pd is not None else tables
    listed = set(view["requests"]["request_id"])
    requests = [r for r in record.workload if r.request_id in listed]
    think_used = record.instances[0].think_used if record.instances else {}
    return session_tables_and_summary(mode, requests, view, think_used, parents_from=record.workload)


def _instance_summary(index: int, summary: dict[str, Any]) -> dict[str, Any]:
    """An instance's own summary (latency, hits, outcomes, ...) without the run-wide facts it repeats."""
    drop = {"name", "seed", "clock", "connector", "simulated_s", "message", "block_sizes"}
    out = {k: v for k, v in summary.items() if k not in drop}
    out["instance"] = index
    return out


def instance_of(result: LoadedResult, request_id: str) -> int | None:
    """The instance ``request_id`` ran on in a cluster bundle; ``None`` for a one-instance bundle (no
    ``instance`` column) or a request routed nowhere."""
    requests = result.tables["requests"]
    if "instance" not in requests.columns:
        return None
    rows = requests.loc[requests["request_id"] == request_id, "instance"]
    if rows.empty or int(rows.iloc[0]) < 0:
        return None
    return int(rows.iloc[0])


def select_instance(result: LoadedResult, index: int) -> LoadedResult:
    """The bundle as instance ``index`` alone saw it: every table's rows of that instance, without the
    ``instance`` column (what ``explain`` reads: one engine's events and admissions)."""
    tables = {
        name: table.loc[table["instance"] == index].drop(columns="instance").reset_index(drop=True)
        if "instance" in table.columns
        else table
        for name, table in result.tables.items()
    }
    return replace(result, tables=tables)
