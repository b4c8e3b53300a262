"""Scripted interventions (docs/design.md §7 ``actions``), applied by the engine before a step.

* ``evict: {prefix_of: R, group: G, blocks: [i, ...]}`` removes the cache
  entries of request R's prompt blocks ``i`` (indices at the group's block
  size; for Mamba: the state after block ``i``) in every group G names (a type
  names all its groups, an integer one group): every block cached under that
  hash in that group (equal content computed twice sits in two blocks, and
  vLLM does not de-duplicate), group by group, in the order of ``blocks``,
  then by ascending block id, the way vLLM's ``BlockPool.evict_blocks`` does it with
  those block ids: one ``removed`` event per entry, and the
  block does not move (a free block stays in place in the free queue, an
  owned block stays owned). An entry that is not cached is skipped.
* ``reset_prefix_cache: true`` calls the pool's prefix-cache reset, which (as
  in vLLM) only succeeds when every block is free.
* ``connector_fault: {...}`` hands the options to the connector's
  ``inject_fault`` (the ``faulty`` connector has one).

The hashes of R's prompt are computed from its content, so an action may
target a request that has not arrived yet, has finished, or was rejected as
longer than ``max_model_len`` (its prompt still names cacheable content).
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any

from sim.connector.protocol import FaultInjector
from sim.core.kv.hash_view import cached_block_hashes
from sim.core.kv.hashing import extend_block_hashes
from sim.engine.action_checks import evict_target, fault_options
from sim.engine.loop import Action

if TYPE_CHECKING:  # pragma: no cover
    from sim.config.scenario import ActionSpec, Scenario
    from sim.engine.build import Components


def _evict_action(spec: Any, scenario: "Scenario", components: "Components", index: int) -> Action:
    requests = {r.request_id: r for r in (*components.requests, *components.rejected)}
    request, groups = evict_target(spec, scenario, requests, components.kv_cache_config, index)
    config = components.kv_cache_config
    fine: list[int] = []
    extend_block_hashes(
        fine, request.prompt, request.num_prompt_tokens, config.hash_block_size, request.lora_name, request.cache_salt
    )
    targets: list[tuple[int, int]] = []
    for g in groups:
        block_size = config.groups[g].spec.block_size
        # With prefix caching off there are no cached hashes: the action evicts nothing (as vLLM's
        # evict_blocks finds no entry).
        group_hashes = cached_block_hashes(fine, config, block_size)
        targets.extend((group_hashes[i], g) for i in spec.blocks if i < len(group_hashes))
    kv_manager = components.kv_manager

    def apply() -> None:
        ids: list[int] = []
        for block_hash, g in targets:
            ids.extend(i for i in kv_manager.cached_block_ids(block_hash, g) if i not in ids)
        if ids:
            kv_manager.evict_blocks(ids, request_id=spec.prefix_of, cause="evict_action")

    desc = f"evict {spec.prefix_of} blocks {list(spec.blocks)} in group {spec.group}"
    return Action(at=None, at_s=None, apply=apply, description=desc)


def _fault_action(spec: "ActionSpec", scenario: "Scenario", components: "Components", index: int) -> Action:
    """A ``connector_fault`` action: the ``faulty`` connector's fault options change at ``at``."""
    connector = components.connector
    options = fault_options(spec, scenario, connector, index)
    assert isinstance(connector, FaultInjector)
    return Action(None, None, partial(connector.inject_fault, options), f"connector_fault {sorted(options)}")


def build_actions(scenario: "Scenario", components: "Components") -> list[Action]:
    """The scenario's actions, bound to this run's objects, each due at its step (or time)."""
    actions: list[Action] = []
    for i, spec in enumerate(scenario.actions):
        if spec.evict is not None:
            action = _evict_action(spec.evict, scenario, components, i)
        elif spec.reset_prefix_cache:
            manager = components.kv_manager
            action = Action(None, None, manager.reset_prefix_cache, "reset_prefix_cache")
        else:
            action = _fault_action(spec, scenario, components, i)
        if scenario.clock == "steps":
            action.at = int(spec.at)
        else:
            action.at_s = float(spec.at)
        actions.append(action)
    return actions
