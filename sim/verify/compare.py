"""First difference between two decision traces, with context, and a side-by-side table.

Steps are compared in step order; inside a step the items are compared in
the order the scheduler produces them: preemptions (running phase),
admission attempts (waiting phase, attempt by attempt, field by field), the
scheduled requests and tokens, then the KV events, event by event. After the
steps come the crash (step, request, type, message) and the finished
requests. When one side crashed in the step where the traces first differ,
the crash is named as the difference.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from sim.trace.csvcell import neutralise
from sim.verify.vllm_side import DecisionTrace, StepTrace

SIDES = ("hybridsim", "vllm")
_ITEMS = ("preempted", "admissions", "scheduled", "kv_events")


@dataclass
class Difference:
    """Where two traces first disagree: ``what`` names the item, ``ours`` / ``theirs`` the two values."""

    step: int | None
    what: str
    ours: Any
    theirs: Any
    context: list[str] = field(default_factory=list)

    def describe(self) -> str:
        where = f"step {self.step}" if self.step is not None else "end of run"
        lines = [
            f"first difference at {where}: {self.what}",
            f"  hybridsim: {_fmt(self.ours)}",
            f"  vllm:      {_fmt(self.theirs)}",
        ]
        if self.context:
            lines.append("context:")
            lines.extend(f"  {line}" for line in self.context)
        return "\n".join(lines)


def _fmt(value: Any) -> str:
    return json.dumps(value, sort_keys=True) if not isinstance(value, str) else value


def _empty(step: int) -> StepTrace:
    return {"step": step, "scheduled": [], "preempted": [], "admissions": [], "kv_events": []}


def _by_step(trace: DecisionTrace) -> dict[int, StepTrace]:
    return {int(s["step"]): s for s in trace["steps"]}


def _step_summary(side: str, entry: StepTrace) -> str:
    sched = ", ".join(f"{r}:{n}" for r, n in entry["scheduled"]) or "-"
    adm = (
        ", ".join(
            f"{a['request']}({a['kind']},{a['result']},local={a['local']},ext={a['external']})"
            for a in entry["admissions"]
        )
        or "-"
    )
    pre = ", ".join(entry["preempted"]) or "-"
    return (
        f"{side:9} step {entry['step']}: scheduled [{sched}] preempted [{pre}] admissions [{adm}] "
        f"kv_events {len(entry['kv_events'])}"
    )


def _item_difference(a: list, b: list, name: str) -> tuple[str, Any, Any] | None:
    for i in range(max(len(a), len(b))):
        x = a[i] if i < len(a) else None
        y = b[i] if i < len(b) else None
        if x == y:
            continue
        if isinstance(x, dict) and isinstance(y, dict):
            for key in x:
                if x.get(key) != y.get(key):
                    return f"{name}[{i}].{key}", x, y
        return f"{name}[{i}]", x, y
    return None


def first_difference(ours: DecisionTrace, theirs: DecisionTrace) -> Difference | None:
    """The first place ``ours`` (hybridsim) and ``theirs`` (vLLM) disagree, or ``None``.

    With a replayed connector, a call the record does not hold (``replay_mismatches``: vLLM asked where
    hybridsim's scheduler did not, or at another step) is a difference too: the decisions' first
    difference when it comes earlier, else the mismatch (at the same step it is the cause)."""
    diff = _first_decision_difference(ours, theirs)
    mismatches = theirs.get("replay_mismatches") or []
    if not mismatches:
        return diff
    first = min(mismatches, key=lambda m: (m["step"] is None, m["step"] or 0))
    if diff is not None and (first["step"] is None or (diff.step is not None and diff.step < first["step"])):
        return diff
    extra = [f"{len(mismatches)} replay mismatches in all"] if len(mismatches) > 1 else []
    return Difference(first["step"], "connector replay", "(recorded answers)", first["message"], extra)


def _first_decision_difference(ours: DecisionTrace, theirs: DecisionTrace) -> Difference | None:
    a, b = _by_step(ours), _by_step(theirs)
    steps = sorted(set(a) | set(b))
    crash_a, crash_b = ours["crash"], theirs["crash"]
    for n, step in enumerate(steps):
        x, y = a.get(step, _empty(step)), b.get(step, _empty(step))
        for item in _ITEMS:
            diff = _item_difference(x[item], y[item], item)  # type: ignore[literal-required]
            if diff is None:
                continue
            context = []
            if n > 0:
                prev = steps[n - 1]
                context += [
                    _step_summary(SIDES[0], a.get(prev, _empty(prev))),
                    _step_summary(SIDES[1], b.get(prev, _empty(prev))),
                ]
            context += [_step_summary(SIDES[0], x), _step_summary(SIDES[1], y)]
            ca = crash_a if crash_a and crash_a["step"] == step else None
            cb = crash_b if crash_b and crash_b["step"] == step else None
            if (ca is None) != (cb is None):
                return Difference(step, "crash", ca, cb, [f"then {diff[0]} differs"] + context)
            what, ov, tv = diff
            return Difference(step, what, ov, tv, context)
    if crash_a != crash_b:
        crashed = crash_a or crash_b
        return Difference(crashed["step"] if crashed else None, "crash", crash_a, crash_b)
    if ours["finished"] != theirs["finished"]:
        only = sorted(set(ours["finished"]) ^ set(theirs["finished"]))
        changed = sorted(
            k for k in set(ours["finished"]) & set(theirs["finished"]) if ours["finished"][k] != theirs["finished"][k]
        )
        return Difference(
            None,
            "finished requests",
            ours["finished"],
            theirs["finished"],
            [f"finished on one side only: {only}", f"different output counts: {changed}"],
        )
    return None


def table_rows(ours: DecisionTrace, theirs: DecisionTrace) -> Iterator[dict[str, Any]]:
    """Side-by-side rows: step, item, index, hybridsim, vllm, same."""
    a, b = _by_step(ours), _by_step(theirs)
    for step in sorted(set(a) | set(b)):
        x, y = a.get(step, _empty(step)), b.get(step, _empty(step))
        for item in _ITEMS:
            xs, ys = x[item], y[item]  # type: ignore[literal-required]
            for i in range(max(len(xs), len(ys))):
                xv = xs[i] if i < len(xs) else None
                yv = ys[i] if i < len(ys) else None
                yield {
                    "step": step,
                    "item": item,
                    "index": i,
                    "hybridsim": "" if xv is None else _fmt(xv),
                    "vllm": "" if yv is None else _fmt(yv),
                    "same": xv == yv,
                }
    for item in ("crash", "finished"):
        xv, yv = ours[item], theirs[item]  # type: ignore[literal-required]
        yield {"step": "", "item": item, "index": 0, "hybridsim": _fmt(xv), "vllm": _fmt(yv), "same": xv == yv}


def write_table(
    path: str | Path,
    ours: DecisionTrace,
    theirs: DecisionTrace,
    *,
    force: bool = False,
    notes: list[str] | None = None,
) -> Path:
    """Write the side-by-side table as CSV through :func:`sim.trace.output.write_file`; returns the path."""
    from sim.trace.output import write_file

    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, fieldnames=["step", "item", "index", "hybridsim", "vllm", "same"])
    writer.writeheader()
    writer.writerows(
        {k: neutralise(v) if isinstance(v, str) else v for k, v in row.items()} for row in table_rows(ours, theirs)
    )
    write_file(path, text.getvalue(), force=force, notes=notes, option="--table")
    return Path(path)
