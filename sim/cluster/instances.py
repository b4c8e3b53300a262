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
    cluster then wires both to its P/D proxy, :mod:`sim.cluster.pd`)."""
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
        if cluster.tier is not None:  # every instance's connector is the offload connector on the shared tier
            data["connector"] = {"type": "offload", **cluster.tier.connector_options()}
        elif spec.role == "decode":  # NIXL's decode side, pulling from the prefill instances (sim.cluster.pd)
            data["connector"] = {"type": "remote", **(cluster.pd or PDLinkSection()).connector_options()}
        elif spec.role == "prefill":  # NIXL's prefill side: no request of its own is prefilled elsewhere
            data["connector"] = {"type": "remote", "requests": []}
        try:
            out.append(Scenario.model_validate(data))
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(p) for p in err["loc"]) or "<root>"
            raise ScenarioError(f"cluster.instances.{i}: {where}: {err['msg']}") from None
    return out
