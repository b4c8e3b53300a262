"""A small hand-made run (two groups: full attention, Mamba) with hand-computable metrics."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from sim.trace.tables import normalize_table

NAN = math.nan


def build_tables() -> dict[str, pd.DataFrame]:
    requests = pd.DataFrame(
        [
            # id, arrival, first_sched, first_token, finished, prompt, out, local, ext, preempt, outcome
            ["r0", 0.0, 0.5, 1.0, 3.0, 100, 5, 64, 0, 1, "ok"],
            ["r1", 1.0, 1.0, 1.5, 2.1, 50, 3, 16, 32, 0, "ok"],
            ["r2", 2.0, 2.0, 4.0, 4.0, 40, 1, 16, 0, 0, "corrupt"],
            ["r3", 2.5, 3.0, NAN, NAN, 10, 0, 8, 0, 0, "failed"],
        ],
        columns=[
            "request_id",
            "arrival_s",
            "first_scheduled_s",
            "first_token_s",
            "finished_s",
            "prompt_tokens",
            "output_tokens",
            "local_hit_tokens",
            "external_hit_tokens",
            "preemptions",
            "outcome",
        ],
    )
    adm_cols = [
        "step",
        "time_s",
        "request_id",
        "prompt_tokens",
        "hit_g0",
        "hit_g1",
        "local_tokens",
        "external_tokens",
        "hit_diverged",
        "fallback",
        "policy",
        "outcome",
        "crash_reason",
        "kind",
        "reason",
        "num_computed_tokens",
        "tokens_lost",
        "taint_origin",
    ]
    admissions = pd.DataFrame(
        [
            [0, 0.0, "r0", 100, 64, 96, 64, 0, False, False, "reconciled", "ok", "", "first", "", 0, 0, ""],
            [
                1,
                1.0,
                "r1",
                50,
                32,
                16,
                0,
                0,
                False,
                False,
                "reconciled",
                "not_admitted",
                "",
                "first",
                "no blocks",
                0,
                0,
                "",
            ],
            [2, 1.5, "r1", 50, 48, 16, 16, 32, True, True, "reconciled", "ok", "", "first", "", 0, 32, ""],
            [3, 2.0, "r2", 40, 16, 0, 16, 0, False, False, "max_per_group", "corrupt", "", "first", "", 0, 0, "r0"],
            [5, 2.5, "r0", 100, 0, 96, 0, 0, False, False, "reconciled", "ok", "", "resumed", "", 0, 0, ""],
            [
                6,
                3.0,
                "r3",
                10,
                8,
                0,
                8,
                0,
                False,
                False,
                "max_per_group",
                "crash",
                "AssertionError: num_new_tokens > 0",
                "first",
                "",
                0,
                0,
                "",
            ],
        ],
        columns=adm_cols,
    )
    kv_events = pd.DataFrame(
        [
            [0, 0, 0.0, "stored", 0, 1, 11, "r0", "cache"],
            [1, 0, 0.0, "stored", 1, 2, 12, "r0", "cache"],
            [2, 1, 1.0, "stored", 0, 3, 13, "r0", "cache"],
            [3, 4, 2.5, "removed", 0, 1, 11, "r1", "evict_lru"],
            [4, 4, 2.5, "removed", 0, 3, 13, "r1", "evict_lru"],
            [5, 5, 3.0, "removed", 1, 2, 12, "", "evict_forced"],
        ],
        columns=["seq", "step", "time_s", "kind", "group", "block_id", "block_hash", "request_id", "cause"],
    )
    steps = pd.DataFrame(
        [[s, 0.5 * s, 0.5, 1, 1, 16, 1, 10 - s, s, 1, s // 2, 1] for s in range(7)],
        columns=[
            "step",
            "time_s",
            "duration_s",
            "running",
            "waiting",
            "prefill_tokens",
            "decode_tokens",
            "free_blocks",
            "blocks_g0",
            "blocks_g1",
            "cached_g0",
            "cached_g1",
        ],
    )
    schedule = pd.DataFrame(
        [[0, "r0", "new", 16, 0, False], [4, "r0", "running", 0, 101, True]],
        columns=["step", "request_id", "kind", "num_scheduled_tokens", "num_computed_tokens", "preempted"],
    )
    raw = {"kv_events": kv_events, "admissions": admissions, "requests": requests, "schedule": schedule, "steps": steps}
    return {name: normalize_table(name, df) for name, df in raw.items()}


@pytest.fixture
def tables() -> dict[str, pd.DataFrame]:
    return build_tables()
