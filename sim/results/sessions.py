"""Session metrics: one row per turn, one per session, and their summary (``summary['sessions']``).

Per turn (``turns``): the request, its session and turn index, the think time
it got (closed loop; the planned one open-loop), latency (finish - arrival),
TTFT, and the prefix reuse it could have had from its parents: the
``reusable_tokens`` are the leading full blocks its prompt shares with a
parent's prompt *plus answer* (block hashes at the scheduler's hash block
size, the best parent of a join), ``hit_gN`` is group N's hit at its first
admission attempt capped there, and ``usable_hit_rate`` is
``min(local_hit_tokens, reusable) / reusable`` (empty for a first turn or
nothing reusable). Per session (``sessions``): turns, total latency (last
finish - first arrival), total think time, mean local hit per turn and the
session's usable hit rate (reused over reusable tokens).
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from sim.core.request import Request
from sim.workload.sessions import session_meta

TURN_COLUMNS = (
    "request_id",
    "session",
    "turn",
    "parents",
    "think_s",
    "arrival_s",
    "finished_s",
    "latency_s",
    "ttft_s",
    "prompt_tokens",
    "reusable_tokens",
    "local_hit_tokens",
    "usable_hit_rate",
)


def shared_prefix_tokens(child: Request, parent: Request) -> int:
    """Tokens of the leading full blocks ``child``'s prompt shares with ``parent``'s prompt + output."""
    a, b = child.block_hashes, parent.block_hashes
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n * child.hash_block_size


def turn_table(
    requests: Sequence[Request],
    tables: Mapping[str, pd.DataFrame],
    think_used: Mapping[str, float],
    parents_from: Sequence[Request] = (),
) -> pd.DataFrame:
    """One row per request of a session-enabled workload, in workload order (module docstring). A parent is
    looked up among ``requests`` and ``parents_from`` (a cluster's requests that have no row of their own
    here); a parent found in neither (rejected before the run) offers nothing reusable."""
    req = tables["requests"].set_index("request_id")
    adm = tables["admissions"]
    hit_cols = [c for c in adm.columns if c.startswith("hit_g")]
    first_hits = adm.drop_duplicates("request_id").set_index("request_id")[hit_cols]
    by_id = {r.request_id: r for r in parents_from}
    by_id.update((r.request_id, r) for r in requests)
    rows = []
    for r in requests:
        meta = session_meta(r.metadata)
        row = req.loc[r.request_id]
        parents = [by_id[p] for p in meta["parents"] if p in by_id]
        reusable = max(shared_prefix_tokens(r, p) for p in parents) if parents and r.block_hashes else 0
        local = int(row["local_hit_tokens"])
        think = think_used.get(r.request_id, meta.get("think_s"))
        out = {
            "request_id": r.request_id,
            "session": meta["session"],
            "turn": int(meta["session_turn"]),
            "parents": ",".join(meta["parents"]),
            "think_s": np.nan if think is None else float(think),
            "arrival_s": float(row["arrival_s"]),
            "finished_s": row["finished_s"],
            "latency_s": row["finished_s"] - row["arrival_s"],
            "ttft_s": row["first_token_s"] - row["arrival_s"],
            "prompt_tokens": int(row["prompt_tokens"]),
            "reusable_tokens": reusable,
            "local_hit_tokens": local,
            "usable_hit_rate": min(local, reusable) / reusable if reusable else np.nan,
        }
        hits = first_hits.loc[r.request_id] if r.request_id in first_hits.index else None
        for c in hit_cols:
            out[c] = min(int(hits[c]), reusable) if hits is not None and reusable else np.nan
        rows.append(out)
    df = pd.DataFrame(rows, columns=[*TURN_COLUMNS, *hit_cols])
    return df.astype({"finished_s": float, "latency_s": float, "ttft_s": float})


def session_tables_and_summary(
    mode: str,
    requests: Sequence[Request],
    tables: Mapping[str, pd.DataFrame],
    think_used: Mapping[str, float],
    parents_from: Sequence[Request] = (),
) -> tuple[dict[str, pd.DataFrame], dict]:
    """The ``turns`` and ``sessions`` tables of a run and its ``summary['sessions']`` entry
    (:func:`turn_table`'s arguments)."""
    turns = turn_table(requests, tables, think_used, parents_from)
    sessions = session_table(turns)
    return {"turns": turns, "sessions": sessions}, sessions_summary(mode, turns, sessions)


def session_table(turns: pd.DataFrame) -> pd.DataFrame:
    """One row per session, in order of first appearance."""
    reusable = turns["reusable_tokens"]
    turns = turns.assign(_reused=np.minimum(turns["local_hit_tokens"], reusable), _reusable=reusable)
    g = turns.groupby("session", sort=False)
    out = pd.DataFrame(
        {
            "turns": g.size(),
            "total_latency_s": g["finished_s"].max() - g["arrival_s"].min(),
            "think_s": g["think_s"].sum(),
            "hit_tokens_per_turn": g["local_hit_tokens"].mean(),
            "usable_hit_rate": g["_reused"].sum() / g["_reusable"].sum().replace(0, np.nan),
        }
    )
    # A session with an unfinished turn has no total latency.
    out.loc[g["finished_s"].apply(lambda s: s.isna().any()), "total_latency_s"] = np.nan
    return out.reset_index()


def by_turn(turns: pd.DataFrame) -> pd.DataFrame:
    """Per turn index: count and the mean usable hit rate (overall and per group's capped hit)."""
    hit_cols = [c for c in turns.columns if c.startswith("hit_g")]
    rows = []
    for turn, part in turns.groupby("turn", sort=True):
        reusable = part["reusable_tokens"].sum()
        row = {
            "turn": int(turn),
            "n": len(part),
            "usable_hit_rate": float(np.minimum(part["local_hit_tokens"], part["reusable_tokens"]).sum() / reusable)
            if reusable
            else None,
        }
        for c in hit_cols:
            row[f"usable_{c}"] = float(part[c].sum() / reusable) if reusable else None
        rows.append(row)
    return pd.DataFrame(rows)


def _quantile(values: pd.Series, q: float) -> float | None:
    """The ``q`` quantile of the non-missing values (``None`` if there are none)."""
    values = values.dropna()
    return float(values.quantile(q)) if len(values) else None


def sessions_summary(mode: str, turns: pd.DataFrame, sessions: pd.DataFrame) -> dict:
    """The ``summary['sessions']`` entry."""
    later = turns[turns["turn"] > 1]
    reusable = later["reusable_tokens"].sum()
    return {
        "mode": mode,
        "count": len(sessions),
        "turns_mean": float(sessions["turns"].mean()),
        "total_latency_s_p50": _quantile(sessions["total_latency_s"], 0.5),
        "think_s_mean": float(later["think_s"].mean()) if later["think_s"].notna().any() else None,
        "usable_hit_rate": float(np.minimum(later["local_hit_tokens"], later["reusable_tokens"]).sum() / reusable)
        if reusable
        else None,
        "by_turn": by_turn(turns).to_dict(orient="records"),
    }
