"""``hybridsim verify`` on a cluster scenario: each instance's decisions against vLLM's (docs/cluster.md).

The cluster runs once in hybridsim. Each instance is then one vLLM engine fed exactly the requests the router
sent it, at the steps they reached it: the instance's scenario (:func:`sim.cluster.instances.instance_scenarios`)
with the workload cut to those requests is lowered as any scenario (:func:`sim.verify.lower.lower`) and run
through vLLM's scheduler, and its decision trace is compared with the instance's rows of the cluster's tables.
The router itself is hybridsim's (vLLM has none): what is verified is that every engine decides as vLLM does
given its arrivals.

With a shared tier (``cluster.tier``) each instance's connector answers from a store every instance changes,
and with prefill/decode roles from another engine's prefill: the cluster run records every answer each
instance's connector gave its scheduler (:mod:`sim.verify.replay`), and the instance's vLLM engine gets a
connector that answers the same, in the same order (``HybridsimReplayConnector``); a call the record does not
hold is a difference. A P/D cluster's prefill instances get the prefill legs (``<id>@prefill``) as their
requests, and a decode instance's request arrives at the step its scheduler got it (its leg done).

Not verifiable: what a one-instance scenario cannot verify, and a cluster that crashed (the crash stops every
instance at once, which no single vLLM engine does; verify the crashing instance through its replay bundle).
"""

from __future__ import annotations

import warnings

from sim.cluster.instances import instance_scenarios
from sim.cluster.pd import with_prefill_legs
from sim.config.scenario import Scenario
from sim.engine.build import CapacityWarning, build_components, scenario_workload
from sim.engine.run import RunOptions
from sim.results.cluster import select_instance
from sim.results.finalize import RunResult
from sim.verify import vllm_side
from sim.verify.compare import Difference, first_difference
from sim.verify.decisions import decision_trace
from sim.verify.lower import lower, not_verifiable_reason
from sim.verify.replay import ConnectorRecording, record_connector, replay_script
from sim.verify.run import Verdict, VerifyStatus
from sim.verify.vllm_side import DecisionTrace


def run_recorded(scenario: Scenario, record: bool) -> tuple[RunResult, list[ConnectorRecording] | None]:
    """Run the cluster ``scenario``; with ``record``, every instance's connector answers as well."""
    from sim.cluster.run import build_cluster_run
    from sim.results.cluster import finalize_cluster

    # Recorded: no quiet stretches (every recorded instance has a connector, which stretches skip anyway; a
    # stretched run that reruns without them would leave the wrapped connectors behind).
    cluster = build_cluster_run(scenario, RunOptions(write_plots=False), stretches=not record)
    recordings = None
    if record:
        recordings = []
        for instance in cluster.instances:
            connector = instance.components.connector
            assert connector is not None, "a recorded cluster gives every instance a connector"
            recordings.append(record_connector(connector, instance.components.scheduler))
    return finalize_cluster(cluster.execute()), recordings


def cluster_not_verifiable_reason(scenario: Scenario) -> str | None:
    """Why cluster ``scenario`` cannot be verified before it runs (``None``: every instance can be): the first
    instance that a one-instance scenario could not verify, named. Running it may still show it cannot be (a
    crash, failed loads): :func:`verify_cluster` says so then."""
    cluster = scenario.cluster
    assert cluster is not None
    replayed = cluster.tier is not None or cluster.disaggregated
    for i, instance in enumerate(instance_scenarios(scenario)):
        reason = not_verifiable_reason(instance, replayed=replayed)
        if reason is not None:
            return f"instance {i}: {reason}"
    return None


def verify_cluster(scenario: Scenario) -> Verdict:
    """One verdict for the whole cluster: identical when every instance is; else the first instance that
    differs (or is not verifiable), named in the reason."""
    assert scenario.cluster is not None
    run = scenario.model_copy(
        update={
            "on_crash": "stop",
            "outputs": scenario.outputs.model_copy(update={"schedule_table": True, "plots": False}),
        }
    )
    disaggregated = scenario.cluster.disaggregated
    replayed = scenario.cluster.tier is not None or disaggregated
    instances = instance_scenarios(run)
    reason = cluster_not_verifiable_reason(run)
    if reason is not None:
        return Verdict(scenario.name, VerifyStatus.NOT_VERIFIABLE, reason)
    vllm_side.check_release(scenario.vllm_version)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CapacityWarning)
        result, recordings = run_recorded(run, replayed)
    if result.summary.get("crash") is not None:
        where = result.summary["crash"].get("instance")
        return Verdict(
            scenario.name,
            VerifyStatus.NOT_VERIFIABLE,
            f"the cluster crashed on instance {where}; a crash stops every instance at once, which no single "
            "vLLM engine does (verify that instance's replay bundle)",
        )
    if recordings is not None:
        for i, rec in enumerate(recordings):
            if rec.load_errors:
                return Verdict(
                    scenario.name,
                    VerifyStatus.NOT_VERIFIABLE,
                    f"instance {i}: {rec.load_errors} blocks failed to load; the harness replays no load errors",
                )
    requests = result.tables["requests"]
    home = {str(r): int(i) for r, i in zip(requests["request_id"], requests["instance"])}
    fresh, _ = scenario_workload(instances[0])
    if disaggregated:  # the prefill instances' requests are the legs the proxy made
        fresh = with_prefill_legs(fresh)
    verdicts: list[str] = []
    first: tuple[Difference, DecisionTrace, DecisionTrace] | None = None
    for i, instance in enumerate(instances):
        mine = [r for r in fresh if home.get(r.request_id) == i]
        added = recordings[i].added if recordings is not None else None
        if added is not None:  # the requests its scheduler saw (a P/D request waits for its leg first)
            mine = [r for r in mine if r.request_id in added]
        if not mine:
            verdicts.append(f"instance {i}: no requests")
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", CapacityWarning)
            components = build_components(instance, workload=(mine, []))
        assert components is not None
        replay = replay_script(recordings[i]) if recordings is not None else None
        # A decode instance's request reaches its scheduler when its prefill leg is done, not at its arrival.
        arrivals = added if disaggregated else None
        theirs = vllm_side.run_script(lower(instance, components, replay=replay, arrival_steps=arrivals))
        own = select_instance(result, i)
        ours = decision_trace(own.tables, result.summary["instances"][i])
        diff = first_difference(ours, theirs)
        if diff is None:
            verdicts.append(f"instance {i}: identical ({len(mine)} requests)")
            continue
        where = f"step {diff.step}" if diff.step is not None else "the end of the run"
        verdicts.append(f"instance {i}: differs at {where} ({diff.what})")
        if first is None:
            first = (diff, ours, theirs)
    if first is not None:
        diff, ours, theirs = first
        return Verdict(scenario.name, VerifyStatus.DIFFER, "; ".join(verdicts), diff, ours, theirs)
    return Verdict(scenario.name, VerifyStatus.IDENTICAL, "; ".join(verdicts))
