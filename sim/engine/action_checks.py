"""What a scenario's actions must satisfy, checked before a run is built (``validate`` refuses what ``run``
refuses): an ``evict`` action names a request of the workload, a KV-cache group and block indices within the
request's full prompt blocks; a ``connector_fault`` action targets a connector that takes faults, with options
it accepts. No engine object is needed (this module imports no simpy): :mod:`sim.engine.actions` binds the
checked actions to a run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable

from sim.config import ScenarioError
from sim.connector.protocol import FaultInjector

if TYPE_CHECKING:  # pragma: no cover
    from sim.config.scenario import ActionSpec, Scenario


def _target_groups(group: int | str, group_kinds: list[str]) -> list[int]:
    if isinstance(group, int):
        return [group]
    return [i for i, kind in enumerate(group_kinds) if kind == group]


def evict_target(
    spec: Any, scenario: "Scenario", requests: dict[str, Any], config: Any, index: int
) -> tuple[Any, list[int]]:
    """The request and the groups an ``evict`` action names (``requests``: the run's requests and the rejected
    ones, by id), each block index within the request's full prompt blocks in every group (else a
    :class:`ScenarioError` naming the action's key)."""
    request = requests.get(spec.prefix_of)
    if request is None:
        script = scenario.workload.requests
        dropped = script is not None and any(r.id == spec.prefix_of for r in script)
        raise ScenarioError(
            f"actions.{index}.evict.prefix_of: no request {spec.prefix_of!r} in the workload"
            + (" (the script's request was dropped by workload.time_window, sample or limit)" if dropped else "")
        )
    group_kinds = [g.spec.kind for g in config.groups]
    groups = _target_groups(spec.group, group_kinds)
    if not groups or max(groups) >= len(group_kinds):
        raise ScenarioError(
            f"actions.{index}.evict.group: {spec.group!r} names no KV-cache group "
            f"(groups: {', '.join(f'{i}={k}' for i, k in enumerate(group_kinds))})"
        )
    for g in groups:
        full_blocks = request.num_prompt_tokens // config.groups[g].spec.block_size
        for i in spec.blocks:
            if i >= full_blocks:
                raise ScenarioError(
                    f"actions.{index}.evict.blocks: block {i} is beyond request {spec.prefix_of!r}'s "
                    f"{full_blocks} full prompt blocks in group {g}"
                )
    return request, groups


def fault_options(spec: "ActionSpec", scenario: "Scenario", connector: Any, index: int) -> dict[str, Any]:
    """A ``connector_fault`` action's options, checked by the connector's fault wrapper."""
    if not isinstance(connector, FaultInjector):
        raise ScenarioError(
            f"actions.{index}.connector_fault: connector {scenario.connector.type!r} takes no faults "
            "(use connector type 'faulty' wrapping it)"
        )
    assert spec.connector_fault is not None  # an action is exactly one of evict, reset_prefix_cache, connector_fault
    options = dict(spec.connector_fault.model_extra or {})
    try:
        connector.check_fault(options)
    except ValueError as exc:
        raise ScenarioError(f"actions.{index}.{exc}") from None
    return options


def check_actions(
    scenario: "Scenario", requests: Iterable[Any], rejected: Iterable[Any], config: Any, connector: Any
) -> None:
    """Everything :func:`sim.engine.actions.build_actions` refuses, checked before a run is built (so
    ``validate`` refuses what ``run`` refuses)."""
    if not scenario.actions:
        return
    by_id = {r.request_id: r for r in (*requests, *rejected)}
    for i, spec in enumerate(scenario.actions):
        if spec.evict is not None:
            evict_target(spec.evict, scenario, by_id, config, i)
        elif spec.connector_fault is not None:
            fault_options(spec, scenario, connector, i)
