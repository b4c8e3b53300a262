"""hybridsim's result tables -> the decision-trace shape of :mod:`sim.verify.vllm_side`.

The mapping (hybridsim's names to the trace's; docs/design.md §6 semantics unchanged):

* ``schedule`` rows of a step: ``preempted = false`` rows give ``scheduled``
  (request, ``num_scheduled_tokens``) in row order, ``preempted = true`` rows
  give ``preempted``.
* ``admissions`` rows: ``hit_g*`` -> ``hits``, ``local_tokens`` / ``external_tokens``
  -> ``local`` / ``external``; ``outcome`` ``ok`` / ``recompute`` / ``corrupt``
  (hybridsim's verdicts on an admitted request) -> ``admitted``, ``crash`` ->
  ``crash``, ``not_admitted`` with reason ``no_blocks`` -> ``no_blocks`` and
  with any other reason (``connector_not_ready``, ``no_aligned_chunk``) ->
  ``skipped``.
* ``kv_events``: kind, group and block id as recorded; the 64-bit hash is
  replaced by its number in order of first appearance.
* ``summary.crash``: ``reason`` ``"Type: message"`` is split into type and message.
* ``finished``: requests that finished (a ``finished_s`` and an admitted
  outcome), with their ``output_tokens``.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import pandas as pd

from sim.verify.vllm_side import (
    AdmissionTrace,
    CrashTrace,
    DecisionTrace,
    KVEventTrace,
    StepTrace,
)

_ADMITTED = ("ok", "recompute", "corrupt")


def admission_result(outcome: str, reason: str) -> str:
    """hybridsim's ``outcome`` / ``reason`` as the trace's ``result``."""
    if outcome in _ADMITTED:
        return "admitted"
    if outcome == "crash":
        return "crash"
    if outcome == "not_admitted":
        return "no_blocks" if reason == "no_blocks" else "skipped"
    raise ValueError(f"admissions.outcome {outcome!r} is not an admission outcome")


def split_reason(reason: str) -> tuple[str, str]:
    """``"AssertionError: num_new_tokens > 0"`` -> ``("AssertionError", "num_new_tokens > 0")``."""
    kind, sep, message = reason.partition(": ")
    return (kind, message) if sep else (reason, "")


def _rows(frame: pd.DataFrame) -> list[dict[str, Any]]:
    return frame.to_dict("records") if len(frame) else []


def decision_trace(tables: Mapping[str, pd.DataFrame], summary: dict[str, Any]) -> DecisionTrace:
    """The decision trace of one hybridsim run (its tables and summary)."""
    steps: dict[int, StepTrace] = {}

    def at(step: int) -> StepTrace:
        if step not in steps:
            steps[step] = {"step": step, "scheduled": [], "preempted": [], "admissions": [], "kv_events": []}
        return steps[step]

    for row in _rows(tables["schedule"]):
        entry = at(int(row["step"]))
        if bool(row["preempted"]):
            entry["preempted"].append(str(row["request_id"]))
        else:
            entry["scheduled"].append([str(row["request_id"]), int(row["num_scheduled_tokens"])])

    admissions = tables["admissions"]
    hit_cols = sorted((c for c in admissions.columns if c.startswith("hit_g")), key=lambda c: int(c[5:]))
    for row in _rows(admissions):
        att: AdmissionTrace = {
            "request": str(row["request_id"]),
            "kind": str(row["kind"]),
            "hits": [int(row[c]) for c in hit_cols],
            "local": int(row["local_tokens"]),
            "external": int(row["external_tokens"]),
            "hit_diverged": bool(row["hit_diverged"]),
            "fallback": bool(row["fallback"]),
            "result": admission_result(str(row["outcome"]), str(row["reason"])),  # type: ignore[typeddict-item]
        }
        at(int(row["step"]))["admissions"].append(att)

    hash_ids: dict[str, int] = {}
    for row in _rows(tables["kv_events"]):
        kind = str(row["kind"])
        if kind == "cleared":
            event: KVEventTrace = {"kind": "cleared", "group": -1, "block_id": -1, "hash": -1}
        elif kind not in ("stored", "removed"):
            raise ValueError(f"kv_events: unknown event kind {kind!r} (expected stored, removed or cleared)")
        else:
            h = str(row["block_hash"])
            if h not in hash_ids:
                hash_ids[h] = len(hash_ids)
            event = {
                "kind": "stored" if kind == "stored" else "removed",
                "group": int(row["group"]),
                "block_id": int(row["block_id"]),
                "hash": hash_ids[h],
            }
        at(int(row["step"]))["kv_events"].append(event)

    crash: CrashTrace | None = None
    c = summary.get("crash")
    if c:
        kind, message = split_reason(str(c["reason"]))
        crash = {"step": int(c["step"]), "request": c.get("request_id"), "type": kind, "message": message}

    finished: dict[str, int] = {}
    for row in _rows(tables["requests"]):
        done = row["finished_s"]
        if done is not None and not (isinstance(done, float) and math.isnan(done)) and row["outcome"] in _ADMITTED:
            finished[str(row["request_id"])] = int(row["output_tokens"])

    ordered = [steps[k] for k in sorted(steps)]
    return {
        "steps": ordered,
        "crash": crash,
        "finished": finished,
        "num_steps": int(summary.get("steps", 0)),
        "stopped": "crash"
        if crash
        else ("" if summary.get("status") == "complete" else str(summary.get("status", ""))),
    }
