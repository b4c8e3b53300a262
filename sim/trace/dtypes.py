"""The result tables' column dtypes, declared once (no pyarrow: the recorder reads them while a run records).

A dtype is a schema name: ``int64``, ``Int64`` (an int that may be missing), ``float64`` (a missing time is
null), ``bool``, ``str`` or :data:`HASH_DTYPE`. :mod:`sim.trace.schema` maps them to Arrow types and
:mod:`sim.trace.recorder` packs the ``int64``/``float64`` columns it always fills.
"""

from __future__ import annotations

#: Dtype name of the 64-bit block-hash column (a ``str`` column of 16 hex digits).
HASH_DTYPE = "hex64"

INT, NINT, FLOAT, BOOL, STR = "int64", "Int64", "float64", "bool", "str"

#: Each table's fixed columns -> their schema dtype (docs/design.md §6).
FIXED_DTYPES: dict[str, dict[str, str]] = {
    "kv_events": {
        "seq": INT,
        "step": INT,
        "time_s": FLOAT,
        "kind": STR,
        "group": INT,
        "block_id": INT,
        "block_hash": HASH_DTYPE,
        "request_id": STR,
        "cause": STR,
    },
    "admissions": {
        "step": INT,
        "time_s": FLOAT,
        "request_id": STR,
        "prompt_tokens": INT,
        "local_tokens": INT,
        "external_tokens": INT,
        "hit_diverged": BOOL,
        "fallback": BOOL,
        "policy": STR,
        "outcome": STR,
        "crash_reason": STR,
        "kind": STR,
        "reason": STR,
        "num_computed_tokens": INT,
        "tokens_lost": INT,
        "taint_origin": STR,
        "lookup_seq": INT,
        "claimed_boundary": INT,
        "connector_asked_at": INT,
        "connector_answer": INT,
    },
    "requests": {
        "request_id": STR,
        "arrival_s": FLOAT,
        "first_scheduled_s": FLOAT,
        "first_token_s": FLOAT,
        "finished_s": FLOAT,
        "prompt_tokens": INT,
        "output_tokens": INT,
        "local_hit_tokens": INT,
        "external_hit_tokens": INT,
        "preemptions": INT,
        "outcome": STR,
    },
    "schedule": {
        "step": INT,
        "request_id": STR,
        "kind": STR,
        "num_scheduled_tokens": INT,
        "num_computed_tokens": INT,
        "preempted": BOOL,
    },
    "steps": {
        "step": INT,
        "time_s": FLOAT,
        "duration_s": FLOAT,
        "running": INT,
        "waiting": INT,
        "prefill_tokens": INT,
        "decode_tokens": INT,
        "free_blocks": INT,
    },
}

#: Per table, the prefixes of its per-group columns (``<prefix><i>``, all ``int64``).
PER_GROUP: dict[str, tuple[str, ...]] = {
    "admissions": ("hit_g",),
    "steps": ("blocks_g", "cached_g"),
}
