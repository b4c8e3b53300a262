"""Quiet stretches: runs of engine steps in which every running request takes one quiet decode.

A *quiet step* is one whose ``schedule()`` / ``update_from_output()`` pair, on
:class:`~sim.accel.decodes.QuietDecodeScheduler`, does nothing but this: every
request of ``running`` is scheduled as a quiet decode (one token, inside its
quiet horizon, no ``allocate_slots``), the waiting phase finds every queue
empty, each request samples one token and none stops, and no KV event is
emitted. Such a step changes only each running request's two counters (and its
block hashes at a hash-block boundary). :func:`quiet_steps` bounds how many of
the next steps are quiet, from the scheduler's state alone (nothing arrives:
the caller bounds that); :func:`take_quiet_steps` applies that many at once.

The bound, per running request (``c`` computed, ``o`` output tokens, ``n = c + 1``
known tokens): step ``i`` (from 0) schedules it at ``c + i`` computed, inside its
horizon while ``c + i <= max_decode_computed``; it samples its ``(o + i + 1)``-th
token, and stops unless ``o + i + 1 < output_len`` and ``n + i + 1 <
max_model_len`` (:class:`QuietDecodeScheduler.update_from_output
<sim.accel.decodes.QuietDecodeScheduler.update_from_output>`'s shortcut). The
request must already have its first token (the engine times the first token
of a request scheduled for its last prompt token) and not be an in-flight
prefill. Nothing here records rows: the engine loop that takes the steps
(``sim.engine.stretch``) records each step's rows.
"""

from __future__ import annotations

from typing import Sequence

from sim.accel.decodes import QuietDecodeScheduler
from sim.accel.quiet import NO_BOUND
from sim.core.request import Request, RequestStatus
from sim.core.scheduler import Scheduler


def quiet_steps(scheduler: Scheduler) -> int:
    """How many of the next steps are quiet (0: the next one is not), bounded by the scheduler's state only:
    a request arriving, a transfer, an action or a connector is the caller's to rule out (see the module
    docstring). Only an exact :class:`QuietDecodeScheduler` without a connector has quiet steps."""
    if type(scheduler) is not QuietDecodeScheduler or scheduler.connector is not None:
        return 0
    running = scheduler.running
    if not running or len(running) > scheduler.config.max_num_batched_tokens:
        return 0
    if len(scheduler.waiting) or len(scheduler.kv_holding_waiting) or len(scheduler.async_kv_waiting):
        return 0
    if scheduler.kv.num_pending_events:
        return 0
    horizons = scheduler.quiet.horizons
    inflight = scheduler._inflight_prefills
    max_model_len = scheduler.max_model_len
    status = RequestStatus.RUNNING
    bound = NO_BOUND
    for request in running:
        rid = request.request_id
        horizon = horizons.get(rid)
        if horizon is None or request.status is not status or rid in inflight:
            return 0
        computed = request.num_computed_tokens
        num_output = request.num_output_tokens
        num_tokens = request.num_prompt_tokens + num_output
        if not num_output or computed + 1 != num_tokens:
            return 0
        steps = horizon.max_decode_computed - computed + 1
        left = request.output_len - num_output - 1
        if left < steps:
            steps = left
        left = max_model_len - num_tokens - 1
        if left < steps:
            steps = left
        if steps < bound:
            bound = steps
            if bound <= 0:
                return 0
    return bound


def take_quiet_steps(scheduler: QuietDecodeScheduler, requests: Sequence[Request], steps: int, scheduled: int) -> None:
    """Apply ``steps`` whole quiet steps, then ``scheduled - steps`` (0 or 1) more ``schedule()`` calls without
    their ``update_from_output`` (a step in flight when the run stopped), to ``requests`` (``running`` when the
    stretch began; at most :func:`quiet_steps` of them). ``scheduler.step`` is the engine's to set."""
    assert 0 <= steps <= scheduled <= steps + 1
    if not scheduled:
        return
    for request in requests:
        request.num_computed_tokens += scheduled
        if steps:
            request.num_output_tokens += steps
            request.update_block_hashes()
    scheduler.kv.new_step_starts()
    scheduler.finished_req_ids = set()
    scheduler.num_quiet_decodes += scheduled * len(requests)
