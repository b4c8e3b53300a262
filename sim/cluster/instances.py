"""Each instance's scenario: the cluster scenario with that instance's overrides (``cluster.instances``)."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from sim.config.cluster import PDLinkSection
from sim.config.scenario import Scenario
from sim.config.yamlio import ScenarioError

#: Cache keys that size the pool; an instance giving one drops the scenario's other.
_POOL_SIZE_KEYS = ("num_blocks", "kv_memory_gb")


def instance_scenarios(scenario: Scenario) -> list[Scenario]:
    """One scenario per instance, without ``cluster``; instance 0 of a cluster without overrides is the
    scenario itself (so a one-instance cluster runs exactly as the plain scenario). With ``cluster.tier``
    each instance's connector is the offload connector with the tier's options (the cluster then gives it
    the shared store, :mod:`sim.cluster.tier`); a ``decode`` instance's is the ``remote`` connector with
    ``cluster.pd``'s link, a ``prefill`` instance's the ``remote`` connector prefilling nothing remotely (the
    cluster then wires both to its P/D proxy, :mod:`sim.cluster.pd`).

    With both, an instance runs the two under vLLM's ``MultiConnector`` (:mod:`sim.connector.multi`): a decode
    instance ``[remote, offload]``, so a request's own prefill is pulled from its prefill instance whenever
    there is any of it to pull and the tier serves only what NIXL does not (a re-admission after a preemption,
    whose one pull is spent), while every request still stores to the tier; a prefill instance ``[offload,
    remote]``, the tier serving its lookups (its ``remote`` connector never answers a non-zero count) and both
    keeping a finished leg's blocks, the tier until its stores land, NIXL until the decode instance pulled."""
    cluster = scenario.cluster
    assert cluster is not None
    base = scenario.model_dump(mode="json", exclude={"cluster"})
    out: list[Scenario] = []
    for i, spec in enumerate(cluster.instance_specs()):
        data: dict[str, Any] = {key: (dict(value) if isinstance(value, dict) else value) for key, value in base.items()}
        for section, overrides in spec.overrides().items():
            merged = dict(data.get(section) or {})
            if section == "cache" and any(k in overrides for k in _POOL_SIZE_KEYS):
                for key in _POOL_SIZE_KEYS:
                    merged.pop(key, None)
            merged.update(overrides)
            data[section] = merged
        connectors = []
        if spec.role == "decode":  # NIXL's decode side, pulling from the prefill instances (sim.cluster.pd)
            connectors.append({"type": "remote", **(cluster.pd or PDLinkSection()).connector_options()})
        elif spec.role == "prefill":  # NIXL's prefill side: no request of its own is prefilled elsewhere
            connectors.append({"type": "remote", "requests": []})
        if cluster.tier is not None:  # the offload connector on the shared tier
            tier = {"type": "offload", **cluster.tier.connector_options()}
            # P/D and a tier: vLLM's MultiConnector, the pull first on a decode instance (docstring).
            connectors.insert(0 if spec.role == "prefill" else len(connectors), tier)
        if len(connectors) == 1:
            data["connector"] = connectors[0]
        elif connectors:
            data["connector"] = {"type": "multi", "connectors": connectors}
        try:
            out.append(Scenario.model_validate(data))
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(p) for p in err["loc"]) or "<root>"
            raise ScenarioError(f"cluster.instances.{i}: {where}: {err['msg']}") from None
    return out
