"""The scheduler over the speed layer's manager decides exactly what it decides over the plain core.

Whole scheduler runs (``support.scheduler.Harness``) with a
:class:`~sim.accel.QuietKVCacheManager` and with the plain
:class:`~sim.core.kv.kv_cache_manager.KVCacheManager`: requests arriving while others
decode, long prompts chunked by the threshold, block pressure (preemptions and
resumed admissions), aborts of running requests and a budget squeeze. Every
schedule row, batch total, admission row and finish step must match, and the
quiet path must actually have skipped calls (else the comparison shows nothing).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from support.scheduler import Harness, req

from sim.accel import QuietDecodeScheduler
from sim.accel.quiet import QuietHorizons
from sim.core.request import RequestStatus


def _run(
    fast: bool, seed: int, groups: tuple[str, ...], sched_policy: str = "fcfs"
) -> tuple[Harness, list[tuple[int, ...]], list[tuple[str, ...]]]:
    rng = np.random.default_rng(seed)
    h = Harness(
        groups=groups,
        sched_policy=sched_policy,
        num_blocks=70,
        max_num_batched_tokens=int(rng.integers(40, 120)),
        max_num_seqs=16,
        long_prefill_token_threshold=24,
        fast_paths=fast,
    )
    pending = [
        req(f"r{i}", int(rng.integers(4, 90)), max_tokens=int(rng.integers(4, 70)), content=f"c{i % 4}-{i}")
        for i in range(36)
    ]
    totals: list[tuple[int, ...]] = []
    inflight: list[tuple[str, ...]] = []
    step = 0
    while pending or h.sched.has_unfinished_requests():
        if pending and rng.random() < 0.4:
            h.add(pending.pop(0))
        if step == 30:
            h.sched.config = dataclasses.replace(h.sched.config, max_num_batched_tokens=4)
        if step == 34:
            h.sched.config = dataclasses.replace(h.sched.config, max_num_batched_tokens=96)
        if step in (20, 45):
            h.sched.finish_requests([r.request_id for r in h.sched.running[::3]], RequestStatus.FINISHED_ABORTED)
        out = h.run_step()
        totals.append(
            (out.prefill_tokens, out.decode_tokens, out.decode_context_tokens, out.total_num_scheduled_tokens)
        )
        # The scheduler's own state after the step: the requests still in flight as prefills (in order).
        inflight.append(tuple(h.sched._inflight_prefills))
        step += 1
        assert step < 3000
    return h, totals, inflight


@pytest.mark.parametrize("sched_policy", ["fcfs", "priority"])
@pytest.mark.parametrize("groups", [("full_attention",), ("full_attention", "mamba"), ("mamba", "full_attention")])
def test_scheduler_over_quiet_manager_matches_the_plain_core(groups, sched_policy, monkeypatch):
    skipped = decodes = 0
    covers = QuietHorizons.covers

    def counting(self, request, num_new_tokens):
        nonlocal skipped
        hit = covers(self, request, num_new_tokens)
        skipped += hit
        return hit

    monkeypatch.setattr(QuietHorizons, "covers", counting)
    for seed in range(3):
        fast, fast_totals, fast_inflight = _run(True, seed, groups, sched_policy)
        plain, plain_totals, plain_inflight = _run(False, seed, groups, sched_policy)
        assert isinstance(fast.sched, QuietDecodeScheduler) and not isinstance(plain.sched, QuietDecodeScheduler)
        decodes += fast.sched.num_quiet_decodes
        assert fast.schedule_rows() == plain.schedule_rows(), seed
        assert fast.admission_rows() == plain.admission_rows(), seed
        assert fast_totals == plain_totals, seed
        assert fast_inflight == plain_inflight, seed
        assert fast.finished == plain.finished, seed
        assert fast.sched.num_preemptions == plain.sched.num_preemptions, seed
    # The layer ran: decodes scheduled without the calls (and, with full attention only, other calls skipped).
    assert decodes > 100
    assert skipped > 10 or "mamba" in groups
