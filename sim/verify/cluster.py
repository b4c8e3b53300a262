"""``hybridsim verify`` on a cluster scenario: each instance's decisions against vLLM's (docs/cluster.md).

The cluster runs once in hybridsim. Each instance is then one vLLM engine fed exactly the requests the router
sent it, at the steps they reached it: the instance's scenario (:func:`sim.cluster.instances.instance_scenarios`)
with the workload cut to those requests is lowered as any scenario (:func:`sim.verify.lower.lower`) and run
through vLLM's scheduler, and its decision trace is compared with the instance's rows of the cluster's tables.
The router itself is hybridsim's (vLLM has none): what is verified is that every engine decides as vLLM does
given its arrivals.

Not verifiable: what a one-instance scenario cannot verify, a shared tier (``cluster.tier``: its answers
depend on every instance's stores, and the harness replays only the none and scripted connectors), prefill and
decode instances (for the same reason), and a cluster that crashed (the crash stops every
instance at once, which no single vLLM engine does; verify the crashing instance through its replay bundle).
"""

from __future__ import annotations

import warnings

from sim.api import RunOptions, run_scenario
from sim.cluster.instances import instance_scenarios
from sim.config.scenario import Scenario
from sim.engine.build import CapacityWarning, build_components, scenario_workload
from sim.results.cluster import select_instance
from sim.verify import vllm_side
from sim.verify.compare import first_difference
from sim.verify.decisions import decision_trace
from sim.verify.lower import lower, not_verifiable_reason
from sim.verify.run import Verdict, VerifyStatus


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
    if scenario.cluster.tier is not None:
        return Verdict(
            scenario.name,
            VerifyStatus.NOT_VERIFIABLE,
            "cluster.tier: the shared tier's answers depend on every instance's stores, and the harness replays "
            "only the none and scripted connectors (verify the cluster without cluster.tier)",
        )
    if scenario.cluster.disaggregated:
        return Verdict(
            scenario.name,
            VerifyStatus.NOT_VERIFIABLE,
            "cluster.instances: prefill/decode roles: a decode instance's arrivals wait on another engine's "
            "prefill and its connector pulls what that engine computed; the harness replays only the none and "
            "scripted connectors (verify the colocated cluster)",
        )
    instances = instance_scenarios(run)
    for i, instance in enumerate(instances):
        reason = not_verifiable_reason(instance)
        if reason is not None:
            return Verdict(scenario.name, VerifyStatus.NOT_VERIFIABLE, f"instance {i}: {reason}")
    vllm_side.check_release(scenario.vllm_version)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CapacityWarning)
        result = run_scenario(run, None, options=RunOptions(write_plots=False))
    if result.summary.get("crash") is not None:
        where = result.summary["crash"].get("instance")
        return Verdict(
            scenario.name,
            VerifyStatus.NOT_VERIFIABLE,
            f"the cluster crashed on instance {where}; a crash stops every instance at once, which no single "
            "vLLM engine does (verify that instance's replay bundle)",
        )
    requests = result.tables["requests"]
    home = {str(r): int(i) for r, i in zip(requests["request_id"], requests["instance"])}
    fresh, _ = scenario_workload(instances[0])
    verdicts: list[str] = []
    for i, instance in enumerate(instances):
        mine = [r for r in fresh if home.get(r.request_id) == i]
        if not mine:
            verdicts.append(f"instance {i}: no requests")
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", CapacityWarning)
            components = build_components(instance, workload=(mine, []))
        assert components is not None
        theirs = vllm_side.run_script(lower(instance, components))
        own = select_instance(result, i)
        ours = decision_trace(own.tables, result.summary["instances"][i])
        diff = first_difference(ours, theirs)
        if diff is not None:
            return Verdict(scenario.name, VerifyStatus.DIFFER, f"instance {i} differs", diff, ours, theirs)
        verdicts.append(f"instance {i}: identical ({len(mine)} requests)")
    return Verdict(scenario.name, VerifyStatus.IDENTICAL, "; ".join(verdicts))
