"""The ``requests`` rows of a run (docs/design.md §6): one a request, finished, failed or never started.

A row is recorded after the run (:func:`record_requests`) or, with the loop's ``record_finished``, as its
request finishes (:func:`record_row` with :func:`provisional_outcome`); either way the row's values are the
same: a finished request's counts and times do not change after its step, and its outcome, which depends on
the whole run (its worst admission outcome, the crash), is settled after the run
(:meth:`sim.trace.recorder.Recorder.settle_request_outcomes`). The table is sorted by ``(arrival_s,
request_id)`` when it is made (ids are unique), so the order the rows are recorded in does not show.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Iterable

from sim.core.request import Request, RequestStatus
from sim.trace.recorder import Recorder

if TYPE_CHECKING:
    from sim.engine.loop import EngineLoop, RequestTimes

_OUTCOME_RANK = {"ok": 0, "recompute": 1, "corrupt": 2, "crash": 3}


def record_row(recorder: Recorder, request: Request, t: RequestTimes | None, outcome: str) -> None:
    """The row of a request the engine was given (``t``: its times, ``None`` if it never arrived)."""
    recorder.record_request(
        request_id=request.request_id,
        arrival_s=float(request.arrival_time),
        first_scheduled_s=t.first_scheduled if t is not None else None,
        first_token_s=t.first_token if t is not None else None,
        finished_s=t.finished if t is not None else None,
        prompt_tokens=request.num_prompt_tokens,
        output_tokens=request.num_output_tokens,
        local_hit_tokens=max(0, request.num_cached_tokens - request.num_external_computed_tokens),
        external_hit_tokens=request.num_external_computed_tokens,
        preemptions=request.num_preemptions,
        outcome=outcome,
    )


def record_unstarted(recorder: Recorder, request: Request, outcome: str) -> None:
    """The ``requests`` row of a request that never reached a scheduler (``rejected``, or ``not_arrived``)."""
    recorder.record_request(
        request_id=request.request_id,
        arrival_s=float(request.arrival_time),
        first_scheduled_s=None,
        first_token_s=None,
        finished_s=None,
        prompt_tokens=request.num_prompt_tokens,
        output_tokens=0,
        local_hit_tokens=0,
        external_hit_tokens=0,
        preemptions=0,
        outcome=outcome,
    )


def provisional_outcome(request: Request) -> str:
    """A request's outcome as it finishes: ``failed``, or ``ok`` until the run is over (then settled)."""
    return "failed" if request.status == RequestStatus.FINISHED_ERROR else "ok"


def request_outcome(request: Request, worst: dict[str, str], crashed_id: str | None, stopped: bool) -> str:
    """A request's outcome: its worst admission outcome if it finished; else why it did not."""
    if request.request_id == crashed_id:
        return "crash"
    if request.status == RequestStatus.FINISHED_ERROR:
        return "failed"
    if request.is_finished():
        return worst.get(request.request_id, "ok")
    return "failed" if stopped else "unfinished"


def worst_outcomes(request_ids: Iterable[str], outcomes: Iterable[str]) -> dict[str, str]:
    """Each request's worst admission outcome (``ok`` < ``recompute`` < ``corrupt`` < ``crash``); a request whose
    outcomes are all ``ok`` is left out (read it as ``worst.get(rid, "ok")``)."""
    worst: dict[str, str] = {}
    for rid, outcome in zip(request_ids, outcomes):
        # "ok" ranks lowest and is the default: only worse outcomes are kept (a long run's ids are many).
        if (
            outcome != "ok"
            and outcome in _OUTCOME_RANK
            and _OUTCOME_RANK[outcome] >= _OUTCOME_RANK.get(worst.get(rid, "ok"), 0)
        ):
            worst[rid] = outcome
    return worst


def record_requests(
    recorder: Recorder, requests: Iterable[Request], rejected: Iterable[Request], loop: EngineLoop, stopped: bool
) -> None:
    """After the run: the rows not yet recorded (the run's ``requests`` in any order, or, with the loop's
    ``record_finished``, the requests it still holds and those that never arrived) and the ``rejected`` ones;
    the outcomes of rows recorded as their requests finished settled."""
    worst = worst_outcomes(
        recorder.column_values("admissions", "request_id"), recorder.column_values("admissions", "outcome")
    )
    crashed = loop.crash.request_id if loop.crash is not None else None
    if loop.record_finished:
        recorder.settle_request_outcomes(worst, crashed)
        requests = itertools.chain(loop.held_requests(), loop.not_arrived())
    for request in requests:
        t = loop.times.get(request.request_id)
        outcome = request_outcome(request, worst, crashed, stopped) if t is not None else "not_arrived"
        record_row(recorder, request, t, outcome)
    for request in rejected:
        record_unstarted(recorder, request, "rejected")
