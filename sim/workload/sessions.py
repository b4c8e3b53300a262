"""Sessions: which request waits for which, and how long it thinks (``workload.sessions``).

A *session* is a set of requests linked by parent edges: a conversation's
turns (``multi_turn``, a script's ``after``, Qwen's ``parent_chat_id``,
Mooncake turns inferred from shared hash-id prefixes) or an agentic task
(fan-out branches and the join that waits for all of them). This module only
annotates the drafts; :mod:`sim.engine.sessions` releases them.

Each draft of a session-enabled workload gets these ``metadata`` keys:

* ``session``: the id of the session's first request in source order (a
  session is a connected component of the parent graph: a fan-out's branches
  and their join are one session);
* ``session_turn``: 1 for a first turn, else 1 + the largest parent's turn;
* ``parents``: the ids it waits for (empty for a first turn);
* ``think_s``: the think time after the last parent finished (generators and
  scripts: drawn or given; ``sessions.think_time`` overrides), or ``None``;
* ``gap_s``: for a trace, the recorded gap between the parent's and this
  request's arrival (after ``time_scale``); closed-loop replay turns it into
  ``max(min_think, gap - simulated parent response time)``.

With ``clock: steps`` think times are floored to whole steps, like arrivals.

Mooncake inference (the trace has no parent field): a turn's prompt is the
previous turn's prompt, its answer and a new message, so the previous
request's *full* 512-token blocks are a prefix of the turn's hash ids. The
parent is the deepest such earlier request whose full blocks, at least
``min_shared_blocks`` of them (default 2: every request of that trace shares
block 0, a system prompt), are a prefix; the latest one wins a tie. A trie
over hash ids finds it in time linear in the trace size.

Invariants: every ``parents`` entry names a draft of the workload; the parent
graph is acyclic (checked; a cycle or a dangling parent raises
:class:`~sim.workload.errors.WorkloadError` naming the request and the key).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Iterable, Mapping, TypedDict, cast

import numpy as np

from sim.core.tokens import StreamSegment, basic_segments
from sim.workload.distributions import sample_values
from sim.workload.draft import RequestDraft
from sim.workload.errors import WorkloadError
from sim.workload.spec import SessionSpec, WorkloadSpec

MOONCAKE_BLOCK = 512
MOONCAKE_PREFIX = "mc:"


class SessionMeta(TypedDict):
    """The session keys :func:`annotate_sessions` writes into a request's ``metadata`` (module docstring)."""

    session: str
    session_turn: int
    parents: list[str]
    think_s: float | None
    gap_s: float | None


def session_meta(metadata: Mapping[str, object]) -> SessionMeta:
    """A session-enabled request's ``metadata``, typed by its session keys (the same object, not a copy)."""
    return cast(SessionMeta, metadata)


def raw_parents(draft: RequestDraft) -> list[str]:
    """The parent ids a source recorded (``parent``, ``parents`` or a script's ``after``)."""
    meta = draft.metadata
    if meta.get("parents"):
        return list(meta["parents"])
    parent = meta.get("parent")
    return [parent] if parent is not None else []


def infer_mooncake_parents(drafts: Iterable[RequestDraft], min_shared_blocks: int) -> None:
    """Set ``metadata['parent']`` of Mooncake drafts from shared hash-id prefixes (module docstring)."""
    trie: dict = {}
    for draft in sorted(drafts, key=lambda d: (d.arrival, d.order)):
        prompt = basic_segments(draft.prompt)  # one StreamSegment per trace block
        ids = [s.stream for s in prompt if isinstance(s, StreamSegment)]
        # Only requests with >= min_shared_blocks full blocks are marked, so any mark found is deep enough.
        node: dict | None = trie
        best = None
        for key in ids:
            node = node.get(key) if node is not None else None
            if node is None:
                break
            best = node.get("#", best)
        draft.metadata["parent"] = best
        full = [s.stream for s in prompt if isinstance(s, StreamSegment) and s.length == MOONCAKE_BLOCK]
        if len(full) >= min_shared_blocks:
            at = trie
            for key in full:
                at = at.setdefault(key, {})
            at["#"] = draft.request_id


def _topological(drafts: list[RequestDraft], parents: dict[str, list[str]]) -> list[RequestDraft]:
    """Drafts with every parent before its children; a cycle is an error naming its members."""
    by_id = {d.request_id: d for d in drafts}
    children: dict[str, list[str]] = {}
    pending = {rid: len(ps) for rid, ps in parents.items()}
    for rid, ps in parents.items():
        for p in ps:
            children.setdefault(p, []).append(rid)
    ready = [d.request_id for d in drafts if pending[d.request_id] == 0]
    out: list[RequestDraft] = []
    while ready:
        rid = ready.pop()
        out.append(by_id[rid])
        for child in children.get(rid, ()):
            pending[child] -= 1
            if pending[child] == 0:
                ready.append(child)
    if len(out) < len(drafts):
        stuck = sorted(rid for rid, n in pending.items() if n > 0)
        raise WorkloadError(
            f"workload.sessions: circular parents among requests {', '.join(map(repr, stuck[:5]))}"
            + (f" (+{len(stuck) - 5} more)" if len(stuck) > 5 else "")
            + "; a request cannot wait for itself or its own descendants"
        )
    return out


def _components(drafts: list[RequestDraft], parents: dict[str, list[str]]) -> dict[str, str]:
    """Each request's session: the first request (source order) of its connected component."""
    root = {d.request_id: d.request_id for d in drafts}

    def find(x: str) -> str:
        while root[x] != x:
            root[x] = root[root[x]]
            x = root[x]
        return x

    rank = {d.request_id: i for i, d in enumerate(drafts)}
    for rid, ps in parents.items():
        for p in ps:
            a, b = find(rid), find(p)
            if a != b:
                first, second = (a, b) if rank[a] < rank[b] else (b, a)
                root[second] = first
    return {rid: find(rid) for rid in root}


def annotate_sessions(
    drafts: list[RequestDraft],
    spec: WorkloadSpec,
    *,
    clock: str,
    rng: np.random.Generator,
    base_dir: Path,
) -> None:
    """Write the session keys (module docstring) into each draft's ``metadata``."""
    sessions = spec.sessions
    assert sessions is not None
    is_trace = spec.trace is not None
    if is_trace and spec.trace is not None and spec.trace.format == "mooncake":
        infer_mooncake_parents(drafts, sessions.min_shared_blocks)
    present = {d.request_id for d in drafts}
    parents: dict[str, list[str]] = {}
    for d in drafts:
        ps = raw_parents(d)
        missing = [p for p in ps if p not in present]
        if missing and sessions.orphans == "error":
            raise WorkloadError(
                f"workload.sessions: request {d.request_id!r} waits for {missing[0]!r}, which is not in the "
                "workload (dangling parent: absent from the source, or dropped by sample, time_window or "
                "limit); fix the parent, or set workload.sessions.orphans: root to start a session there"
            )
        parents[d.request_id] = [p for p in ps if p in present]
    ordered = _topological(drafts, parents)
    session_of = _components(drafts, parents)
    by_id = {d.request_id: d for d in drafts}
    dependents = [d for d in ordered if parents[d.request_id]]
    drawn = _drawn_think(sessions, len(dependents), rng, base_dir)
    for d in ordered:
        ps = parents[d.request_id]
        meta = d.metadata
        meta["parents"] = ps
        meta["session"] = session_of[d.request_id]
        if not ps:
            meta.update(session_turn=1, think_s=None, gap_s=None)
            continue
        meta["session_turn"] = 1 + max(by_id[p].metadata["session_turn"] for p in ps)
        meta["gap_s"] = d.arrival - max(by_id[p].arrival for p in ps) if is_trace else None
        meta["think_s"] = None
    for d, value in zip(dependents, drawn if drawn is not None else [None] * len(dependents)):
        meta = d.metadata
        if value is None and not is_trace:
            value = _given_think(d)
        if value is not None:
            meta["think_s"] = _on_clock(max(sessions.min_think, value), clock)
        elif meta["gap_s"] is not None:
            meta["gap_s"] = _on_clock(meta["gap_s"], clock)


def _drawn_think(sessions: SessionSpec, n: int, rng: np.random.Generator, base_dir: Path) -> list[float] | None:
    if sessions.think_time is None:
        return None
    return [float(v) for v in sample_values(sessions.think_time, rng, n, base_dir)]


def _given_think(draft: RequestDraft) -> float:
    """A generator's or script's own think time (0 when the source gives none)."""
    value = draft.metadata.get("think_time")
    if value is None:
        return 0.0
    value = float(value)
    if value < 0 or not math.isfinite(value):
        raise WorkloadError(
            f"workload.sessions: request {draft.request_id!r} has think time {value}; think times must be "
            "finite and >= 0"
        )
    return value


def _on_clock(value: float, clock: str) -> float:
    return float(math.floor(value)) if clock == "steps" else float(value)
