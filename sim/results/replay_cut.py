"""The crash replay's scenario: the resolved scenario cut down to what the run had by the crash step.

:func:`replay_scenario` returns the scenario ``hybridsim replay`` re-runs
after a crash (``replay/replay.yaml``). It always sets ``on_crash: stop`` and
names it ``<name>-replay``. On the step clock it also drops what cannot have
mattered before the crash, consistently, so that the cut is a valid scenario
whenever the original was:

* actions due after the crash step;
* scripted requests that had not arrived by the crash step (``arrived``: the
  ids the run had seen by then, from its ``requests`` table), unless something
  kept still names them: a kept request's ``after`` parents or quoted
  ``output_of`` answer, a kept ``evict`` action's ``prefix_of`` (its hashes
  come from that prompt whether or not it arrived) and, with closed-loop
  ``concurrency``, every turn of a kept session (dropping a later turn would
  end the session early and free its slot earlier);
* the connector's per-request entries (:data:`REQUEST_ID_OPTIONS`, in the
  connector, in a ``faulty`` connector's wrapped one and in ``connector_fault``
  actions) naming a dropped request.

Requests are not dropped when which request is which depends on their
position in the script: ``workload.sample`` (one draw per request in source
order), ``workload.limit`` and drawn session think times
(``workload.sessions.think_time``). Their replay keeps every request; it
still reproduces the crash, only larger (``hybridsim shrink`` reduces it).

Invariant: every request the run had seen by the crash step is in the cut with
the same arrival, and every action due by then is kept with the same effect,
so the replay decides exactly what the run decided up to the crash.
"""

from __future__ import annotations

import json
from typing import Any, Collection

from sim.config.scenario import CONNECTOR_ID_MAPS, Scenario

#: Connector options (and ``connector_fault`` keys) that name requests: maps keyed by request id or lists
#: of ids (the scripted connector's and the ``faulty`` connector's).
REQUEST_ID_OPTIONS: tuple[str, ...] = (*CONNECTOR_ID_MAPS, "fail_loads", "partial_loads", "drop_mamba", "slow")
#: Options holding a wrapped connector's own options (``faulty``).
WRAPPED_OPTIONS = ("wraps", "inner")


def replay_scenario(scenario: Scenario, crash_step: int, arrived: Collection[str]) -> Scenario:
    """The replay of a run of ``scenario`` that crashed at ``crash_step`` having seen the requests ``arrived``
    (module docstring). Raises ``ValueError`` (pydantic's ``ValidationError``) if the cut does not validate."""
    data: dict[str, Any] = json.loads(scenario.model_dump_json())
    data["on_crash"] = "stop"
    data["name"] = f"{scenario.name}-replay"
    if scenario.clock == "steps":
        data["actions"] = [a for a in data.get("actions", []) if a["at"] <= crash_step]
        workload = data["workload"]
        if workload.get("requests") is not None and _position_free(scenario):
            keep = _kept_requests(workload, data["actions"], set(arrived))
            workload["requests"] = [r for r in workload["requests"] if r["id"] in keep]
            _filter_ids(data["connector"], keep)
            for action in data["actions"]:
                if action.get("connector_fault") is not None:
                    _filter_ids(action["connector_fault"], keep)
    return Scenario.model_validate(data)


def _position_free(scenario: Scenario) -> bool:
    """Whether a scripted request's fate is independent of the other requests in the script."""
    workload = scenario.workload
    sessions = workload.sessions
    return workload.sample == 1.0 and workload.limit is None and (sessions is None or sessions.think_time is None)


def _kept_requests(workload: dict[str, Any], actions: list[dict[str, Any]], arrived: set[str]) -> set[str]:
    """The ids the cut keeps: the arrived ones and everything a kept request or action names, to a fixpoint."""
    requests = {r["id"]: r for r in workload["requests"]}
    sessions = workload.get("sessions")
    whole_sessions = sessions is not None and sessions.get("mode") == "closed" and sessions.get("concurrency")
    children: dict[str, list[str]] = {}
    for r in requests.values():
        for parent in r.get("after") or ():
            children.setdefault(parent, []).append(r["id"])
    todo = [rid for rid in requests if rid in arrived]
    todo += [a["evict"]["prefix_of"] for a in actions if a.get("evict") is not None]
    keep: set[str] = set()
    while todo:
        rid = todo.pop()
        if rid in keep or rid not in requests:
            continue
        keep.add(rid)
        r = requests[rid]
        todo.extend(r.get("after") or ())
        todo.extend(seg["output_of"] for seg in r["prompt"] if "output_of" in seg)
        if whole_sessions:
            todo.extend(children.get(rid, ()))
    return keep


def _filter_ids(options: dict[str, Any], keep: set[str]) -> None:
    """Drop the entries of ``options``' per-request keys (and a wrapped connector's) that name no kept request."""
    for key in REQUEST_ID_OPTIONS:
        value = options.get(key)
        if isinstance(value, dict):
            options[key] = {rid: v for rid, v in value.items() if str(rid) in keep}
        elif isinstance(value, list):
            options[key] = [rid for rid in value if str(rid) in keep]
    for key in WRAPPED_OPTIONS:
        inner = options.get(key)
        if isinstance(inner, dict):
            _filter_ids(inner, keep)
