"""Record what one engine's connector told its scheduler, to replay it on the vLLM side (``verify`` on a cluster
with a shared tier, docs/verify.md "Recorded connector answers").

A cluster instance's connector (the offload connector on the shared tier) answers from state that other
instances change (their stores and evictions) and from transfers whose completion the clock decides, so no
script of the harness can stand in for it. What the scheduler sees of it is small, though, and
:func:`record_connector` writes all of it down while the cluster runs, by wrapping the bound connector's
methods on the instance (the connector's own behaviour is unchanged; the wrappers only copy answers):

* every ``get_num_new_matched_tokens`` call, per request in call order: the step, the tokens it was given
  (the block-aligned local hit), the answer (tokens or ``None``, "not yet") and ``load_async``;
* every ``may_load_async`` answer (vLLM 0.34, asked as a request is queued), per request in order;
* every ``request_finished_all_groups`` (or single-group ``request_finished``) answer's ``delay_free``,
  per request;
* every ``has_pending_block_frees`` answer, in call order;
* the steps at which the engine polled the connector (``get_finished``: every step the engine ran), and the
  ``finished_recving`` / ``finished_sending`` sets it was handed at each;
* the step at which each request entered the scheduler (``on_new_request``);
* whether any load failed (``get_block_ids_with_load_errors``; such a run is not replayed).

:func:`replay_script` turns a recording into the harness's :class:`~sim.verify.vllm_side.ReplayScript`,
which :class:`HybridsimReplayConnector` (in :mod:`sim.verify.vllm_side`) answers from, in the same order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sim.verify.vllm_side import ReplayScript


@dataclass
class ConnectorRecording:
    """One engine's connector answers (see the module docstring)."""

    supports_divergent_local_hybrid_hits: bool
    #: request id -> ``[step, num_computed_tokens, tokens or None, load_async]`` per call.
    lookups: dict[str, list[list[Any]]] = field(default_factory=dict)
    may_load_async: dict[str, list[bool]] = field(default_factory=dict)
    delay_free: dict[str, list[bool]] = field(default_factory=dict)
    pending_block_frees: list[bool] = field(default_factory=list)
    #: ``[step, sorted finished_recving, sorted finished_sending]`` for each poll that had any.
    finished: list[list[Any]] = field(default_factory=list)
    #: Every step the engine polled the connector, in order.
    steps: list[int] = field(default_factory=list)
    added: dict[str, int] = field(default_factory=dict)
    load_errors: int = 0


def record_connector(connector: Any, scheduler: Any) -> ConnectorRecording:
    """Start recording ``connector``'s answers to ``scheduler`` (``scheduler.step`` dates them); the recording
    fills as the run goes. Wraps the methods on the connector instance, so the engine and the scheduler,
    which call them through the instance, go through the wrappers."""
    rec = ConnectorRecording(bool(connector.supports_divergent_local_hybrid_hits))

    match = connector.get_num_new_matched_tokens

    def get_num_new_matched_tokens(request: Any, num_computed_tokens: int) -> tuple[int | None, bool]:
        ext, load_async = match(request, num_computed_tokens)
        rec.lookups.setdefault(request.request_id, []).append(
            [int(scheduler.step), int(num_computed_tokens), None if ext is None else int(ext), bool(load_async)]
        )
        return ext, load_async

    may = connector.may_load_async

    def may_load_async(request: Any) -> bool:
        answer = may(request)
        rec.may_load_async.setdefault(request.request_id, []).append(bool(answer))
        return answer

    def finishing(method: Any) -> Any:
        def wrapped(request: Any, block_ids: Any) -> Any:
            out = method(request, block_ids)
            rec.delay_free.setdefault(request.request_id, []).append(bool(out[0]))
            return out

        return wrapped

    pending = connector.has_pending_block_frees

    def has_pending_block_frees() -> bool:
        answer = pending()
        rec.pending_block_frees.append(bool(answer))
        return answer

    finished = connector.get_finished

    def get_finished() -> tuple[set[str], set[str]]:
        recving, sending = finished()
        step = int(scheduler.step)
        rec.steps.append(step)
        if recving or sending:
            rec.finished.append([step, sorted(recving), sorted(sending)])
        return recving, sending

    errors = connector.get_block_ids_with_load_errors

    def get_block_ids_with_load_errors() -> set[int]:
        out = errors()
        rec.load_errors += len(out)
        return out

    new_request = connector.on_new_request

    def on_new_request(request: Any) -> None:
        rec.added[request.request_id] = int(scheduler.step)
        new_request(request)

    connector.get_num_new_matched_tokens = get_num_new_matched_tokens
    connector.may_load_async = may_load_async
    connector.request_finished_all_groups = finishing(connector.request_finished_all_groups)
    connector.request_finished = finishing(connector.request_finished)
    connector.has_pending_block_frees = has_pending_block_frees
    connector.get_finished = get_finished
    connector.get_block_ids_with_load_errors = get_block_ids_with_load_errors
    connector.on_new_request = on_new_request
    return rec


def step_runs(steps: list[int]) -> list[list[int]]:
    """``[first, last]`` runs of consecutive steps (the engine's steps, compactly)."""
    runs: list[list[int]] = []
    for s in steps:
        if runs and s == runs[-1][1] + 1:
            runs[-1][1] = s
        elif not runs or s > runs[-1][1]:
            runs.append([s, s])
    return runs


def replay_script(rec: ConnectorRecording) -> ReplayScript:
    """The harness's replay script of ``rec``."""
    return {
        "kind": "replay",
        "supports_divergent_local_hybrid_hits": rec.supports_divergent_local_hybrid_hits,
        "lookups": {rid: [list(call) for call in calls] for rid, calls in rec.lookups.items()},
        "may_load_async": {rid: list(a) for rid, a in rec.may_load_async.items()},
        "delay_free": {rid: list(a) for rid, a in rec.delay_free.items()},
        "pending_block_frees": list(rec.pending_block_frees),
        "finished": [list(f) for f in rec.finished],
        "steps": step_runs(rec.steps),
    }
