"""Scenario → the objects of one run (cache config, manager, scheduler, connector, workload).

Every choice that can be wrong in a scenario is checked here, before the first
step, and reported as a ``ScenarioError`` naming the key and what would be
valid. Randomness: one ``numpy.random.Generator`` per run from the scenario's
seed, split into independent children per component (workload, connector),
so adding draws in one component never shifts another's.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import numpy as np

from sim.config import ScenarioError
from sim.config.scenario import Scenario
from sim.kv.specs import KVCacheConfig, MambaSpec, SlidingWindowSpec, cdiv, kv_cache_config_from_groups, kv_cache_config_from_model
from sim.connector.protocol import Connector
from sim.engine.timing import StepTimeModel
from sim.kv.manager import KVCacheManager
from sim.request import Request
from sim.scheduler import Scheduler
from sim.trace.recorder import Recorder
from sim.workload.build import build_requests
from sim.workload.errors import WorkloadError

T = TypeVar("T")


@dataclass
class Components:
    """What a run is made of; built once per run by :func:`build_components`."""

    scenario: Scenario
    kv_cache_config: KVCacheConfig
    kv_manager: KVCacheManager
    scheduler: Scheduler
    connector: Connector | None
    recorder: Recorder
    requests: list[Request]
    step_time_model: StepTimeModel | None
    group_kinds: list[str]
    connector_rng: np.random.Generator


def _err(key: str, message: str) -> ScenarioError:
    return ScenarioError(f"{key}: {message}")


def _resolved(value: T | None, key: str) -> T:
    """A scenario value its validators always fill (``None`` only in a scenario that skipped validation)."""
    if value is None:
        raise _err(key, "is not set (build from a validated Scenario: sim.load_scenario)")
    return value


def build_kv_cache_config(scenario: Scenario) -> KVCacheConfig:
    """The KV-cache layout: explicit groups (no page unification) or the model's (vLLM's derivation)."""
    cache = scenario.cache
    try:
        if cache.groups is not None:
            if cache.num_blocks is None:
                raise _err("cache.num_blocks", "required with explicit cache.groups (pages have no byte size there)")
            return kv_cache_config_from_groups(
                [g.model_dump() for g in cache.groups],
                block_size=cache.block_size,
                num_blocks=cache.num_blocks,
                enable_prefix_caching=cache.enable_prefix_caching,
                mamba_cache_mode=cache.mamba_cache_mode,
                retention_interval=cache.retention_interval,
                max_model_len=_resolved(scenario.scheduler.max_model_len, "scheduler.max_model_len"),
            )
        shape = _resolved(scenario.model_shape(), "model")
        return kv_cache_config_from_model(
            shape,
            block_size=cache.block_size,
            enable_prefix_caching=cache.enable_prefix_caching,
            mamba_cache_mode=cache.mamba_cache_mode,
            retention_interval=cache.retention_interval,
            kv_memory_bytes=scenario.kv_memory_bytes(),
            num_blocks=cache.num_blocks,
        )
    except ScenarioError:
        raise
    except ValueError as exc:
        raise _err("cache", str(exc)) from None


def blocks_for_one_request(config: KVCacheConfig, num_tokens: int) -> int:
    """Blocks one request of ``num_tokens`` tokens needs at admission in an empty pool, over all groups.

    Full attention: every block; sliding window: the window plus one block;
    Mamba: one state block, plus one when states are kept at block
    boundaries (align mode). This is the bound below which the request can
    never run, however empty the pool.
    """
    total = 0
    for group in config.groups:
        spec = group.spec
        if isinstance(spec, MambaSpec):
            total += 2 if spec.mamba_cache_mode == "align" else 1
        elif isinstance(spec, SlidingWindowSpec):
            total += min(cdiv(num_tokens, spec.block_size), spec.blocks_for_hit + 1)
        else:
            total += cdiv(num_tokens, spec.block_size)
    return total


def _check_fits(config: KVCacheConfig, requests: list[Request], max_model_len: int) -> None:
    if not requests:
        return
    longest = max(requests, key=lambda r: min(r.num_prompt_tokens + r.output_len, max_model_len))
    tokens = min(longest.num_prompt_tokens + longest.output_len, max_model_len)
    need = blocks_for_one_request(config, tokens)
    usable = config.num_blocks - 1
    if need > usable:
        raise _err(
            "cache.num_blocks",
            f"{config.num_blocks} blocks ({usable} usable) cannot hold request {longest.request_id!r} "
            f"({tokens} tokens need {need} blocks across {len(config.groups)} groups); "
            f"give at least num_blocks: {need + 1}",
        )
    too_long = [r.request_id for r in requests if r.num_prompt_tokens > max_model_len]
    if too_long:
        raise _err(
            "scheduler.max_model_len",
            f"{max_model_len} is shorter than the prompt of request {too_long[0]!r} "
            f"({len(too_long)} request(s) too long)",
        )


def _build_connector(scenario: Scenario, config: KVCacheConfig) -> Connector:
    """The scenario's connector, HMA-checked; the registry's errors already name ``connector.type``."""
    from sim.connector import create_connector
    from sim.connector.context import check_connector_compatible

    try:
        connector = create_connector(scenario.connector.type, **scenario.connector.options())
        check_connector_compatible(connector, config)
    except ValueError as exc:
        raise ScenarioError(str(exc)) from None
    return connector


def _check_policy(scenario: Scenario):
    """The scenario's prefix policy; an unknown name lists the valid ones."""
    from sim.policy.prefix import get_prefix_policy

    try:
        return get_prefix_policy(scenario.scheduler.prefix_policy)
    except ValueError as exc:
        raise ScenarioError(str(exc)) from None


def build_components(
    scenario: Scenario,
    *,
    dry_run: bool = False,
) -> Components | None:
    """Build (or, with ``dry_run``, only check) everything a run needs."""
    from sim.admission_truth import make_truth_checker  # divergence helper: admission truth checker
    from sim.scheduler import SchedulerConfig

    config = build_kv_cache_config(scenario)
    root = np.random.default_rng(scenario.seed)
    workload_rng, connector_rng = root.spawn(2)
    try:
        requests = build_requests(
            scenario.workload,
            base_dir=Path.cwd(),
            rng=workload_rng,
            hash_block_size=config.hash_block_size,
            clock=scenario.clock,
        )
    except WorkloadError as exc:
        text = str(exc)
        raise ScenarioError(text if text.startswith("workload") else f"workload: {text}") from None
    if not requests:
        raise _err("workload", "the workload has no requests (check limit, time_window and sample)")
    max_model_len = _resolved(scenario.scheduler.max_model_len, "scheduler.max_model_len")
    _check_fits(config, requests, max_model_len)
    policy = _check_policy(scenario)
    connector = _build_connector(scenario, config)
    step_time_model = None
    if scenario.clock == "time":
        from sim.engine.timing import StepTimeModel

        hw = _resolved(scenario.hardware, "hardware")
        model = _resolved(_resolved(scenario.model, "model").preset_obj, "model.preset")
        step_time_model = StepTimeModel.from_presets(model, hw.preset_obj(), hw.overrides.given() if hw.overrides else None)
    if dry_run:
        return None

    sched_cfg = scenario.scheduler
    kv_manager = KVCacheManager(
        config,
        watermark=sched_cfg.watermark,
        corrected_mamba_accounting=scenario.cache.corrected_mamba_accounting,
    )
    recorder = Recorder(len(config.groups), record_schedule=bool(scenario.outputs.schedule_table))
    scheduler = Scheduler(
        SchedulerConfig(
            max_num_seqs=_resolved(sched_cfg.max_num_seqs, "scheduler.max_num_seqs"),
            max_num_batched_tokens=_resolved(sched_cfg.max_num_batched_tokens, "scheduler.max_num_batched_tokens"),
            max_model_len=max_model_len,
            long_prefill_token_threshold=sched_cfg.long_prefill_token_threshold,
            policy=sched_cfg.policy,
            watermark=sched_cfg.watermark,
        ),
        kv_manager,
        connector=connector,
        prefix_policy=policy,
        recorder=recorder,
        admission_checker=make_truth_checker(kv_manager, connector),  # divergence helper: admission truth checker
        on_crash=scenario.on_crash,
    )
    return Components(
        scenario=scenario,
        kv_cache_config=config,
        kv_manager=kv_manager,
        scheduler=scheduler,
        connector=connector if scheduler.connector is not None else None,  # `none` is no connector
        recorder=recorder,
        requests=requests,
        step_time_model=step_time_model,
        group_kinds=[g.spec.kind for g in config.groups],
        connector_rng=connector_rng,
    )
