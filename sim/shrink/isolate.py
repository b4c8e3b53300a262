"""A crashed cluster shrinks as its crashing instance alone (``hybridsim shrink`` on a cluster scenario).

A bug report about a crash wants one engine: that is what vLLM runs and what ``export vllm-test`` lowers. In
a cluster whose instances share nothing (no ``cluster.tier``, no prefill/decode roles), an instance's run is
a function of the requests the router sent it and the times they reached it: :func:`isolate_crash` runs the
cluster once, takes the instance that crashed, and writes it as a one-instance scenario: the instance's own
scenario (:func:`sim.cluster.instances.instance_scenarios`: its overrides applied, no ``cluster``) with an
explicit workload of exactly those requests, each at the time (or step) it arrived there. A session's turn
becomes a plain request at the time it was released (its parent may have run elsewhere).

The isolated scenario is kept only when it crashes alone with the cluster's reason, at the same request:
the connector's random draws are the cluster's on instance 0 only (the other instances draw from child
streams a seed cannot name), so a crash that needed them is refused, as is a cluster with a shared tier or
P/D roles (an instance's answers there come from the others). The refusal says why and points at
``hybridsim replay``, which reproduces any cluster crash whole.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

from sim.config.scenario import Scenario
from sim.engine.build import CapacityWarning
from sim.shrink.convert import request_entry
from sim.shrink.probe import probe
from sim.shrink.property import ShrinkError


@dataclass(frozen=True)
class Isolated:
    """The crashing instance as a scenario of its own, and what to tell the user about it."""

    scenario: Scenario
    instance: int
    num_requests: int

    def note(self) -> str:
        requests = f"{self.num_requests} request{'s' if self.num_requests != 1 else ''}"
        return (
            f"the cluster crashed on instance {self.instance}: shrinking that instance alone ({requests} the "
            "router sent it, at the times they reached it; it crashes alone as in the cluster)"
        )


def isolate_crash(scenario: Scenario) -> Isolated:
    """The instance of cluster ``scenario`` that crashes, alone (module docstring); :class:`ShrinkError` when
    the cluster does not crash or the instance does not crash alone."""
    from sim.cluster.instances import instance_scenarios
    from sim.cluster.run import build_cluster_run
    from sim.engine.run import RunOptions

    cluster = scenario.cluster
    assert cluster is not None
    replay_hint = "hybridsim replay BUNDLE/replay reproduces a cluster's crash whole"
    if cluster.tier is not None or cluster.disaggregated:
        shared = "a shared tier" if cluster.tier is not None else "prefill/decode roles"
        raise ShrinkError(
            f"cluster: shrink reduces a crashed cluster to its crashing instance alone, and with {shared} an "
            f"instance's run depends on the others ({replay_hint}; drop cluster.tier or the roles to shrink)"
        )
    run_scenario = scenario.model_copy(update={"on_crash": "stop"})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CapacityWarning)
        run = build_cluster_run(run_scenario, RunOptions(write_plots=False, retire_finished=False))
        record = run.execute()
    if record.crash is None:
        raise ShrinkError(
            f"cluster: shrink takes a cluster only when it crashes (it then shrinks the crashing instance); this "
            f"one ends {record.status!r}: run one instance's scenario alone to shrink another property"
        )
    index = int(record.crash["instance"])
    entries: list[dict[str, Any]] = []
    for request in sorted(run.instances[index].routed, key=lambda r: r.arrival_time):
        entry = request_entry(0, request)
        if entry is None:
            raise ShrinkError(
                f"cluster: request {request.request_id!r} has explicit token ids, which a shrunk script cannot name"
            )
        at = request.arrival_time
        entry["at"] = int(at) if scenario.clock == "steps" and float(at).is_integer() else float(at)
        entries.append(entry)
    data = instance_scenarios(run_scenario)[index].model_dump(mode="json")
    data["name"] = f"{scenario.name}-instance{index}"
    data["workload"] = {"requests": entries}
    alone = Scenario.model_validate(data)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CapacityWarning)
        crash = probe(alone).crash
    wanted = record.crash
    if crash is None or crash.reason != wanted["reason"] or crash.request_id != wanted["request_id"]:
        seen = "does not crash" if crash is None else f"crashes with {crash.reason!r} at request {crash.request_id!r}"
        why = "" if index == 0 else " (its connector's random draws differ outside the cluster)"
        raise ShrinkError(
            f"cluster: instance {index} crashed with {wanted['reason']!r} at request {wanted['request_id']!r}, but "
            f"alone, fed the same requests at the same times, it {seen}{why}; {replay_hint}"
        )
    return Isolated(alone, index, len(entries))
