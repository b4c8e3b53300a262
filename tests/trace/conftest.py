"""A hand-filled Recorder shared by the trace tests."""

from __future__ import annotations

import pytest

from sim.core.kv.block_pool import KVEvent
from sim.trace.recorder import Recorder
from tests.support.kv import event_log


def event(kind: str, group: int, block_id: int, block_hash: int, request_id: str = "r0", cause: str = "cache"):
    return KVEvent(kind, group, block_id, block_hash, request_id, cause)


def admit(rec: Recorder, request_id: str, hits, outcome: str = "ok", **kw) -> None:
    rec.record_admission(
        request_id=request_id,
        prompt_tokens=kw.pop("prompt_tokens", 64),
        hits=hits,
        local_tokens=kw.pop("local_tokens", min(hits)),
        external_tokens=kw.pop("external_tokens", 0),
        hit_diverged=kw.pop("hit_diverged", False),
        fallback=kw.pop("fallback", False),
        policy=kw.pop("policy", "reconciled"),
        outcome=outcome,
        **kw,
    )


def build_recorder() -> Recorder:
    """Two groups, ten kv events over steps 0..3, admissions recorded out of step order."""
    rec = Recorder(num_groups=2)
    for step in range(4):
        rec.set_clock(step, 0.25 * step)
        rec.record_kv_event_log(
            event_log(event("stored", 0, 10 + step, (1 << 63) + step, "r0"), event("stored", 1, 20 + step, step, "r0"))
        )
        rec.record_step(
            duration_s=0.25,
            running=1,
            waiting=step % 2,
            prefill_tokens=16,
            decode_tokens=step,
            free_blocks=50 - 2 * step,
            blocks_per_group=[step + 1, 1],
            cached_per_group=[step, 1],
        )
    rec.set_clock(4, 1.0)
    rec.record_kv_event_log(
        event_log(event("removed", 0, 10, 1 << 63, "r1", "evict_lru"), event("cleared", -1, -1, 0, "", "reset"))
    )
    rec.set_clock(3, 0.75)
    admit(rec, "ra", [32, 48], kind="first")
    admit(rec, "rb", [16, 16], outcome="not_admitted", reason="no blocks")
    rec.set_clock(1, 0.25)
    admit(rec, "rc", [0, 0])
    rec.record_schedule("rc", "new", 16, 0, False)
    rec.record_schedule("ra", "running", 1, 64, False)
    rec.set_clock(0, 0.0)
    rec.record_schedule("rz", "running", 0, 8, True)
    for rid, arrival in (("r2", 1.0), ("r1", 1.0), ("r0", 0.5)):
        rec.record_request(
            request_id=rid,
            arrival_s=arrival,
            first_scheduled_s=arrival + 0.1,
            first_token_s=arrival + 0.2,
            finished_s=None if rid == "r2" else arrival + 1.0,
            prompt_tokens=64,
            output_tokens=3,
            local_hit_tokens=16,
            external_hit_tokens=0,
            preemptions=0,
            outcome="failed" if rid == "r2" else "ok",
        )
    return rec


@pytest.fixture
def recorder() -> Recorder:
    return build_recorder()
