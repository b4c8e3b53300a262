"""``hybridsim explain``: the story of one admission attempt, from a run's tables.

This module only reads and renders; it builds nothing of a run. What the tables do
not hold (the cache layout, the request's block hashes, the connector's
capabilities) arrives as an :class:`ExplainInputs`, which a layer allowed to build
runs derives from the run's scenario (:func:`sim.api.explain_bundle`). Nothing is
re-simulated:

* the request's block hashes come from rebuilding the scenario's workload (the
  same seed gives the same tokens);
* the cache the lookup saw is the ``kv_events`` rows with ``seq <
  lookup_seq`` (``stored`` adds a ``(hash, group)`` entry, ``removed`` drops
  one, ``cleared`` empties the cache), matched against those hashes;
* what the admission needed per group is the truth checker's validity rule
  (:func:`sim.core.admission_truth.resident_block_range`) at the claimed boundary
  ``local + external``; a needed block that was not cached is *unbacked*;
* a cached block stored by a request admitted ``corrupt`` is *tainted*
  (the checker's taint, reconstructed: its exact bad point is not recorded).

The verdict itself (``outcome``, ``tokens_lost``, ``taint_origin``) is the
recorded one; for ``ok`` / ``recompute`` the best valid boundary is the
checker's (``claimed_boundary + tokens_lost``); for the other outcomes it is
recomputed here from the local cache only (a connector's answer at another
position is not recorded).

:func:`block_map` gives the cells of the ``--plot`` block map as data (one row
per group, identical rows merged); :func:`render_block_map` only draws them.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, Sequence

import pandas as pd

from sim.core.admission_truth import resident_block_range
from sim.core.kv.hash_view import cached_block_hashes
from sim.core.kv.specs import KVCacheConfig, SlidingWindowSpec, cdiv
from sim.trace.tables import hash_to_hex

#: Cell classes of the block map, in legend order.
CELL_CLASSES: tuple[str, ...] = (
    "absent",
    "resident",
    "claimed_backed",
    "claimed_unbacked",
    "claimed_tainted",
    "external",
    "resident_recomputed",
    "recomputed",
)

#: Legend text per cell class.
CELL_LABELS: dict[str, str] = {
    "absent": "absent",
    "resident": "resident",
    "claimed_backed": "claimed, backed",
    "claimed_unbacked": "claimed, unbacked",
    "claimed_tainted": "claimed, tainted",
    "external": "external (connector)",
    "resident_recomputed": "resident, recomputed anyway",
    "recomputed": "recomputed",
}

_GROUP_LABEL = {"full_attention": "full_attention", "sliding_window": "sliding_window", "mamba": "mamba"}


class RunTables(Protocol):
    """The tables :func:`explain` reads: a loaded bundle or a :class:`~sim.results.RunResult` has them."""

    @property
    def admissions(self) -> pd.DataFrame: ...

    @property
    def kv_events(self) -> pd.DataFrame: ...


@dataclass(frozen=True)
class ExplainInputs:
    """What explaining one request needs beyond the tables, derived from the run's scenario.

    ``block_hashes`` are the request's prompt block hashes at ``kv_cache_config.hash_block_size`` (the
    hashes the run's cache keyed it by); the connector fields are its name (``"none"`` without one) and the
    two capabilities that change what an admission needed.
    """

    kv_cache_config: KVCacheConfig
    block_hashes: tuple[int, ...]
    connector: str = "none"
    supplies_mamba_state: bool = False
    pulls_unhashed_blocks: bool = False


class ExplainError(ValueError):
    """A request or attempt the bundle does not hold (message names what exists)."""


@dataclass(frozen=True)
class GroupStory:
    """One KV-cache group at the attempt's lookup and at its claimed boundary."""

    index: int
    kind: str
    block_size: int
    window: int
    hit: int
    #: Block positions of the request's prompt cached in this group at the lookup.
    resident: tuple[int, ...]
    #: Block range ``[start, stop)`` the rule reads at the boundary (``None``: a Mamba state off a block boundary).
    need: tuple[int, int] | None
    #: Needed positions not cached (nor written by the connector).
    unbacked: tuple[int, ...]
    #: Cached positions whose entry is tainted: position -> taint origin.
    tainted: dict[int, str]
    #: Prompt blocks of this group (columns of its block-map row).
    num_blocks: int


@dataclass(frozen=True)
class Explanation:
    """One admission attempt, with every fact ``explain`` prints."""

    request_id: str
    attempt: int
    attempts: int
    step: int
    kind: str
    policy: str
    prompt_tokens: int
    groups: list[GroupStory]
    local_tokens: int
    external_tokens: int
    claimed_boundary: int
    hit_diverged: bool
    fallback: bool
    connector: str
    connector_asked_at: int
    connector_answer: int
    state_supplied: bool
    outcome: str
    reason: str
    crash_reason: str
    tokens_lost: int
    taint_origin: str
    best_valid_boundary: int
    best_valid_source: str
    lookup_known: bool
    notes: list[str] = field(default_factory=list)
    #: A cluster bundle: the instance the request was routed to, and the router (``None``: one instance).
    instance: int | None = None
    router: str = ""

    def fields(self) -> dict[str, str]:
        """The text fields, label -> value, in print order (what tests pin)."""
        out: dict[str, str] = {
            "admission": f"{self.request_id} attempt {self.attempt} of {self.attempts}, step {self.step}, "
            f"kind {self.kind}, prompt {self.prompt_tokens} tokens",
        }
        if self.instance is not None:
            out["instance"] = f"{self.instance} (routed by {self.router}; the hits and blocks below are its own)"
        for g in self.groups:
            out[f"g{g.index} {g.kind}"] = _group_line(g, self.lookup_known)
        out["policy"] = _policy_line(self)
        out["connector"] = _connector_line(self)
        out["fallback"] = (
            f"fired: the lookup flagged hit_diverged and the connector answered 0, so the scheduler re-looked "
            f"up the reconciled hit (local {self.local_tokens})"
            if self.fallback
            else (
                "not fired (hit_diverged, but the connector answered external tokens)"
                if self.hit_diverged
                else "not fired (no hit_diverged)"
            )
        )
        out["outcome"] = _outcome_line(self)
        out["unbacked"] = _unbacked_line(self)
        out["mamba state"] = _mamba_line(self)
        out["taint origin"] = self.taint_origin or "none"
        out["best valid boundary"] = f"{self.best_valid_boundary} ({self.best_valid_source})"
        return out

    def text(self) -> str:
        width = max(len(k) for k in self.fields())
        lines = [f"{k.ljust(width)}  {v}" for k, v in self.fields().items()]
        return "\n".join(lines + [f"note: {n}" for n in self.notes]) + "\n"


# ------------------------------------------------------------------ lines


def _ranges(positions: Sequence[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2, 5"`` (``"none"`` when empty)."""
    if not positions:
        return "none"
    parts, start, prev = [], positions[0], positions[0]
    for p in list(positions[1:]) + [None]:
        if p is not None and p == prev + 1:
            prev = p
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if p is not None:
            start = prev = p
    return ", ".join(parts)


def _group_line(g: GroupStory, lookup_known: bool) -> str:
    resident = _ranges(g.resident) if lookup_known else "unknown (bundle without lookup_seq)"
    return f"hit {g.hit} tokens; blocks cached at the lookup: {resident} (of 0-{g.num_blocks - 1}, {g.block_size} tokens each)"


def _policy_line(e: Explanation) -> str:
    hits = ", ".join(f"g{g.index} {g.hit}" for g in e.groups)
    text = f"{e.policy} chose local {e.local_tokens} from per-group hits ({hits})"
    if e.hit_diverged:
        text += "; its lookup flagged hit_diverged (the deeper hit is backed only if the connector loads it)"
    fa = [g.hit for g in e.groups if g.kind == "full_attention"]
    others = [g.hit for g in e.groups if g.kind != "full_attention"]
    if fa and others and e.local_tokens > min(fa):
        text += f"; local is deeper than the full-attention hit {min(fa)}"
    elif others and e.local_tokens < max([*fa, *others]) and not e.fallback:
        text += f"; the groups agree only up to {e.local_tokens}"
    return text


def _connector_line(e: Explanation) -> str:
    if e.connector in ("", "none"):
        return "none attached"
    if e.connector_asked_at < 0:
        return f"{e.connector}: not asked"
    answer = "not ready (no answer)" if e.connector_answer < 0 else f"{e.connector_answer} tokens"
    text = f"{e.connector}: asked at {e.connector_asked_at}, answered {answer}; external_tokens {e.external_tokens}"
    if e.state_supplied and e.external_tokens:
        text += " (supplies the Mamba state at the boundary)"
    return text


def _outcome_line(e: Explanation) -> str:
    b = e.claimed_boundary
    if e.outcome == "crash":
        return f"crash: {e.crash_reason} (claimed boundary {b} = local {e.local_tokens} + external {e.external_tokens} of {e.prompt_tokens} prompt tokens)"
    if e.outcome == "not_admitted":
        return f"not_admitted: {e.reason}"
    if e.outcome == "corrupt":
        why = (
            f"a resident block is tainted (origin {e.taint_origin})"
            if e.taint_origin
            else "a needed block is not backed"
        )
        return f"corrupt at resume boundary {b}: {why}"
    if e.outcome == "recompute":
        return f"recompute: valid at {b}, but {e.best_valid_boundary} was valid: {e.tokens_lost} tokens lost"
    return f"{e.outcome}: valid at resume boundary {b}"


def _unbacked_line(e: Explanation) -> str:
    parts = []
    for g in e.groups:
        if g.need is None:
            parts.append(f"g{g.index}: no state can exist at {e.claimed_boundary} (not a block boundary)")
        elif g.unbacked:
            lo, hi = g.unbacked[0] * g.block_size, (g.unbacked[-1] + 1) * g.block_size
            parts.append(f"g{g.index} blocks {_ranges(g.unbacked)} (tokens {lo}-{hi - 1})")
    return "; ".join(parts) if parts else "none"


def _mamba_line(e: Explanation) -> str:
    parts = []
    for g in e.groups:
        if g.kind != "mamba":
            continue
        b = e.claimed_boundary
        if b == 0:
            parts.append(f"g{g.index}: starts from zero state")
        elif e.state_supplied and e.external_tokens:
            parts.append(f"g{g.index}: supplied by the connector at {b}")
        elif g.need is None or g.unbacked:
            parts.append(f"g{g.index}: missing at {b}")
        elif any(i in g.tainted for i in range(*g.need)):
            parts.append(f"g{g.index}: cached at {b} but tainted")
        else:
            parts.append(f"g{g.index}: cached at {b}")
    return "; ".join(parts) if parts else "no Mamba group"


# -------------------------------------------------------------- building


def find_attempt(admissions: pd.DataFrame, request_id: str, attempt: int | None) -> tuple[pd.Series, int, int]:
    """``(row, attempt, attempts)`` of ``request_id``'s attempt ``attempt`` (1-based; ``None``: the last);
    :class:`ExplainError` naming what exists when the request or the attempt is not in ``admissions``."""
    rows = admissions[admissions["request_id"] == request_id]
    if rows.empty:
        known = ", ".join(sorted(set(admissions["request_id"]))[:10])
        raise ExplainError(f"request {request_id!r} has no admission attempt in this bundle (requests: {known}, ...)")
    n = len(rows)
    if attempt is None:
        attempt = n
    if not 1 <= attempt <= n:
        raise ExplainError(f"--attempt {attempt}: request {request_id!r} has attempts 1-{n}")
    return rows.iloc[attempt - 1], attempt, n


def _cache_at(
    kv_events: pd.DataFrame, admissions: pd.DataFrame, seq: int
) -> tuple[set[tuple[str, int]], dict[tuple[str, int], str]]:
    """Cache entries ``(hash hex, group)`` after the events with ``seq < seq``, and the tainted ones.

    An entry is tainted (value: the taint origin) when the request that stored
    it had been admitted ``corrupt`` at its last attempt before the store.
    """
    verdicts: dict[str, list[tuple[int, str, str]]] = {}
    for rid, lseq, outcome, origin in zip(
        admissions["request_id"], admissions["lookup_seq"], admissions["outcome"], admissions["taint_origin"]
    ):
        verdicts.setdefault(rid, []).append((int(lseq), outcome, origin or rid))

    def taint_of(rid: str, at: int) -> str:
        last = [v for v in verdicts.get(rid, ()) if v[0] <= at]
        return last[-1][2] if last and last[-1][1] == "corrupt" else ""

    cached: Counter = Counter()
    tainted: dict[tuple[str, int], str] = {}
    ev = kv_events[kv_events["seq"] < seq]
    for s, kind, group, h, rid in zip(ev["seq"], ev["kind"], ev["group"], ev["block_hash"], ev["request_id"]):
        key = (h, int(group))
        if kind == "stored":
            cached[key] += 1
            origin = taint_of(rid, int(s))
            if origin:
                tainted[key] = origin
        elif kind == "removed":
            cached[key] -= 1
            if cached[key] <= 0:
                del cached[key]
                tainted.pop(key, None)
        elif kind == "cleared":
            cached.clear()
            tainted.clear()
    return set(cached), tainted


def explain(result: RunTables, inputs: ExplainInputs, request_id: str, attempt: int | None = None) -> Explanation:
    """The :class:`Explanation` of ``request_id``'s attempt ``attempt`` (1-based; default the last).

    ``result`` holds the run's tables (a loaded bundle or a :class:`~sim.results.RunResult`); ``inputs`` the
    layout, hashes and connector capabilities from its scenario; nothing is built or stepped here.
    """
    row, attempt, attempts = find_attempt(result.admissions, request_id, attempt)
    config = inputs.kv_cache_config
    conn_name = inputs.connector
    loaded = conn_name != "none" and int(row["external_tokens"]) > 0
    state_supplied = loaded and inputs.supplies_mamba_state
    refilled = loaded and inputs.pulls_unhashed_blocks
    lookup_seq = int(row["lookup_seq"])
    cached, taints = _cache_at(result.kv_events, result.admissions, lookup_seq if lookup_seq >= 0 else 0)
    local, ext = int(row["local_tokens"]), int(row["external_tokens"])
    boundary = int(row["claimed_boundary"])
    prompt = int(row["prompt_tokens"])

    groups = []
    for gid, group in enumerate(config.groups):
        spec = group.spec
        bs = spec.block_size
        window = spec.window if isinstance(spec, SlidingWindowSpec) else 0
        hashes = cached_block_hashes(inputs.block_hashes, config, bs)  # none with prefix caching off
        n_prompt = prompt // bs
        resident = tuple(i for i in range(min(n_prompt, len(hashes))) if (hash_to_hex(hashes[i]), gid) in cached)
        need = resident_block_range(spec.kind, bs, window, boundary, local, state_supplied)
        tainted = {
            i: taints[(hash_to_hex(hashes[i]), gid)] for i in resident if (hash_to_hex(hashes[i]), gid) in taints
        }
        unbacked: list[int] = []
        if need is not None and not (refilled and spec.kind != "mamba"):
            unbacked = [i for i in range(*need) if i not in resident]
        groups.append(
            GroupStory(
                gid,
                spec.kind,
                bs,
                window,
                int(row[f"hit_g{gid}"]),
                resident,
                need,
                tuple(unbacked),
                tainted,
                cdiv(prompt, bs),
            )
        )

    outcome = str(row["outcome"])
    lost = int(row["tokens_lost"])
    if outcome in ("ok", "recompute"):
        best, source = boundary + lost, "the truth checker's, local cache and connector"
    else:
        best = _best_local_boundary(groups, config.scheduler_block_size, prompt)
        source = "local cache only, at the lookup"
    notes = []
    if lookup_seq < 0:
        notes.append("this bundle predates lookup_seq: cached blocks are not known")
    if outcome == "corrupt" and not any(g.unbacked or g.tainted or g.need is None for g in groups):
        notes.append(
            "the checker saw what the lookup did not: a claimed block list shorter than its boundary, "
            "or a block evicted between the lookup and the allocation"
        )
    if str(row["kind"]) == "after_async_load":
        notes.append("a resume after an async load: no lookup of its own (see the attempt before)")
    return Explanation(
        request_id=request_id,
        attempt=attempt,
        attempts=attempts,
        step=int(row["step"]),
        kind=str(row["kind"]),
        policy=str(row["policy"]),
        prompt_tokens=prompt,
        groups=groups,
        local_tokens=local,
        external_tokens=ext,
        claimed_boundary=boundary,
        hit_diverged=bool(row["hit_diverged"]),
        fallback=bool(row["fallback"]),
        connector=conn_name,
        connector_asked_at=int(row["connector_asked_at"]),
        connector_answer=int(row["connector_answer"]),
        state_supplied=state_supplied,
        outcome=outcome,
        reason=str(row["reason"]),
        crash_reason=str(row["crash_reason"]),
        tokens_lost=lost,
        taint_origin=str(row["taint_origin"]),
        best_valid_boundary=best,
        best_valid_source=source,
        lookup_known=lookup_seq >= 0,
        notes=notes,
    )


def _best_local_boundary(groups: list[GroupStory], align: int, prompt: int) -> int:
    """Deepest aligned boundary ``c < prompt`` the cached blocks back by the validity rule (0 if none)."""
    cap = prompt - 1
    for g in groups:
        if g.kind == "full_attention":
            cap = min(cap, g.hit)
    c = cap // align * align
    while c > 0:
        ok = True
        for g in groups:
            need = resident_block_range(g.kind, g.block_size, g.window, c, c, False)
            if g.kind == "full_attention":
                assert need is not None  # only a Mamba group's range can be None
                if any(i in g.tainted for i in range(*need)):  # the hit itself covers residency
                    ok = False
                    break
                continue
            if need is None or any(i not in g.resident or i in g.tainted for i in range(*need)):
                ok = False
                break
        if ok:
            return c
        c -= align
    return 0


# ------------------------------------------------------------- block map


@dataclass(frozen=True)
class BlockMapRow:
    """One row of the block map: a label (``"mamba ×6"`` for merged groups), its groups, one class per block."""

    label: str
    groups: tuple[int, ...]
    block_size: int
    cells: tuple[str, ...]


def _cells(e: Explanation, g: GroupStory) -> tuple[str, ...]:
    b = e.claimed_boundary
    cells = []
    written = range(e.local_tokens // g.block_size, cdiv(b, g.block_size)) if e.external_tokens else range(0)
    for i in range(g.num_blocks):
        needed = g.need is not None and g.need[0] <= i < g.need[1]
        if needed:
            cells.append(
                "claimed_tainted" if i in g.tainted else "claimed_unbacked" if i in g.unbacked else "claimed_backed"
            )
        elif g.kind != "mamba" and i in written:
            cells.append("external")
        elif g.kind == "mamba" and e.state_supplied and i == b // g.block_size - 1:
            cells.append("external")
        elif i * g.block_size >= b or (g.kind == "mamba" and (i + 1) * g.block_size > b):
            # Past the resume boundary: computed again, although the cache may still hold it (lost reuse).
            cells.append("resident_recomputed" if i in g.resident else "recomputed")
        elif i in g.resident:
            cells.append("resident")
        else:
            cells.append("absent")
    return tuple(cells)


def block_map(e: Explanation) -> list[BlockMapRow]:
    """The block map's rows: identical (kind, block size, cells) groups merged into one labelled row."""
    rows: list[BlockMapRow] = []
    for g in e.groups:
        cells = _cells(e, g)
        for k, r in enumerate(rows):
            if r.cells == cells and r.block_size == g.block_size and e.groups[r.groups[0]].kind == g.kind:
                rows[k] = BlockMapRow(r.label, r.groups + (g.index,), r.block_size, r.cells)
                break
        else:
            rows.append(BlockMapRow(g.kind, (g.index,), g.block_size, cells))
    return [
        BlockMapRow(r.label if len(r.groups) == 1 else f"{r.label} ×{len(r.groups)}", r.groups, r.block_size, r.cells)
        for r in rows
    ]


_COLOURS = {
    "absent": "#f2f2f2",
    "resident": "#9ecae1",
    "claimed_backed": "#31a354",
    "claimed_unbacked": "#de2d26",
    "claimed_tainted": "#fd8d3c",
    "external": "#756bb1",
    "resident_recomputed": "#c6dbef",
    "recomputed": "#bdbdbd",
}


def render_block_map(e: Explanation, path: str | Path, *, force: bool = False, notes: list[str] | None = None) -> Path:
    """Draw :func:`block_map` (one row per merged group, the resume boundary as a line) to ``path``
    (``force``, ``notes``: see :func:`sim.analysis.figures.save_figure`).

    The x axis counts blocks of the smallest group block size, with integer ticks only."""
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch, Rectangle
    from matplotlib.ticker import MaxNLocator

    from sim.analysis.figures import save_figure

    rows = block_map(e)
    ncols = max(len(r.cells) for r in rows)
    fig = Figure(figsize=(max(6.0, min(16.0, 2.5 + 0.35 * ncols)), 1.6 + 0.45 * len(rows)))
    ax = fig.subplots()
    for y, r in enumerate(rows):
        scale = r.block_size / min(x.block_size for x in rows)
        for i, cls in enumerate(r.cells):
            ax.add_patch(Rectangle((i * scale, y), scale, 0.9, facecolor=_COLOURS[cls], edgecolor="white"))
    smallest = min(x.block_size for x in rows)
    ax.axvline(e.claimed_boundary / smallest, color="black", linewidth=2)
    ax.text(e.claimed_boundary / smallest, len(rows) + 0.35, f"resume {e.claimed_boundary}", ha="center", fontsize=8)
    ax.set_xlim(0, max(len(r.cells) * r.block_size / smallest for r in rows))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylim(len(rows) + 0.4, 0)
    ax.set_yticks([y + 0.45 for y in range(len(rows))], [r.label for r in rows])
    ax.set_xlabel(f"block position ({smallest} tokens)")
    ax.set_title(f"{e.request_id} attempt {e.attempt}: {e.outcome}")
    used = [c for c in CELL_CLASSES if any(c in r.cells for r in rows)]
    ax.legend(
        handles=[Patch(facecolor=_COLOURS[c], label=CELL_LABELS[c]) for c in used],
        loc="upper center",
        bbox_to_anchor=(0.5, -0.3),
        ncol=min(4, len(used)),
        fontsize=8,
        frameon=False,
    )
    return save_figure(fig, path, tight=True, force=force, notes=notes)
