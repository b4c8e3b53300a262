"""Scenario → the objects of one run (cache config, manager, scheduler, connector, workload).

Every choice that can be wrong in a scenario is checked here, before the first
step, and reported as a ``ScenarioError`` naming the key and what would be
valid. Randomness: one ``numpy.random.Generator`` per run from the scenario's
seed, split into independent children per component (workload, connector) by
:func:`run_rngs`, the one seeding path (``hybridsim workload stats`` draws the
workload through :func:`scenario_workload`, so it describes the run's
requests), so adding draws in one component never shifts another's.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar, Union

import numpy as np

from sim.accel import CountingKVCacheManager, QuietDecodeScheduler, QuietKVCacheManager, SharedPrefixBlockHasher
from sim.config import ScenarioError
from sim.config.scenario import Scenario, check_connector_request_ids
from sim.connector.protocol import Connector
from sim.core.admission_truth import make_truth_checker
from sim.core.kv.kv_cache_manager import KVCacheManager
from sim.core.kv.specs import (
    KVCacheConfig,
    MambaSpec,
    SlidingWindowSpec,
    cdiv,
    kv_cache_config_from_groups,
    kv_cache_config_from_model,
)
from sim.core.request import Request
from sim.core.scheduler import Scheduler, SchedulerConfig
from sim.engine.action_checks import check_actions
from sim.trace.recorder import Recorder
from sim.workload.build import build_requests
from sim.workload.errors import WorkloadError
from sim.workload.stream import StreamedTrace

if TYPE_CHECKING:
    from sim.core.policy.checkpoint import BaseCheckpointPolicy
    from sim.engine.timing import StepTimeModel

T = TypeVar("T")


#: A run's requests: a list, or a streamed trace (:mod:`sim.workload.stream`).
_Workload = Union[list[Request], StreamedTrace]


@dataclass
class Components:
    """What a run is made of; built once per run by :func:`build_components`."""

    scenario: Scenario
    kv_cache_config: KVCacheConfig
    kv_manager: KVCacheManager
    scheduler: Scheduler
    connector: Connector | None
    recorder: Recorder
    #: The runnable requests in arrival order; a :class:`~sim.workload.stream.StreamedTrace` (each request
    #: made when the engine takes it) when built with ``streamed``.
    requests: list[Request] | StreamedTrace
    step_time_model: StepTimeModel | None
    group_kinds: list[str]
    connector_rng: np.random.Generator
    #: Requests longer than ``max_model_len`` under ``workload.too_long: reject``: never given to the
    #: scheduler (vLLM's input processor refuses them), recorded with outcome ``rejected``.
    rejected: list[Request] = field(default_factory=list)


@dataclass(frozen=True)
class RunRngs:
    """The run's random generators, one independent child of the scenario's seed per component."""

    workload: np.random.Generator
    connector: np.random.Generator


def run_rngs(seed: int) -> RunRngs:
    """Every random generator of a run of seed ``seed``, drawn here and nowhere else (a new component takes a
    new child at the end, so the existing ones keep their streams)."""
    workload, connector = np.random.default_rng(seed).spawn(2)
    return RunRngs(workload=workload, connector=connector)


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


def _check_block_limit(config: KVCacheConfig) -> KVCacheConfig:
    from sim.limits import limit, over

    if config.num_blocks > limit("num_blocks"):
        raise _err(
            "cache.kv_memory_gb",
            over("num_blocks", config.num_blocks, f"the memory budget makes {config.num_blocks} blocks"),
        )
    return config


class CapacityWarning(UserWarning):
    """A scenario vLLM would run, but whose block pool cannot hold some request even when empty
    (with an explicit ``num_blocks``, vLLM has no such gate: it admits or waits, and may crash)."""


def blocks_for_one_request(config: KVCacheConfig, num_tokens: int) -> int:
    """Blocks one request of ``num_tokens`` tokens needs at admission in an empty pool, over all groups.

    Full attention: every block; sliding window: the window plus one block;
    Mamba: one state block, plus one when states are kept at block
    boundaries (align mode). Below this bound the request can never run,
    however empty the pool (used for a warning only).
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


def _check_kv_cache_sizing(scenario: Scenario, config: KVCacheConfig, max_model_len: int, in_flight: int) -> None:
    """vLLM's startup check (``check_enough_kv_cache_memory``), for blocks derived from memory only.

    vLLM refuses to start when the KV-cache memory, less one block (the null
    block), cannot hold one request of ``max_model_len`` tokens: the sum over
    layers of each spec's maximum usage. With an explicit ``num_blocks`` (a
    hand-built ``KVCacheConfig``, as vLLM's scheduler tests and ``hybridsim
    verify`` use) there is no such gate, so none here either.
    """
    memory = scenario.kv_memory_bytes()
    if memory is None or config.bytes_per_block is None:
        return
    needed = 0
    for group in config.groups:
        spec = group.spec
        page = spec.page_size_bytes or 0
        needed += len(group.layer_ids) * spec.max_blocks_per_request(max_model_len, in_flight) * page
    available = memory - config.bytes_per_block
    if needed > available:
        key = "cache.kv_memory_gb" if scenario.cache.kv_memory_gb is not None else "hardware.gpu_memory_utilization"
        gib = float(1 << 30)
        raise _err(
            key,
            f"one request of the max seq len ({max_model_len}) needs {needed} bytes ({needed / gib:.3f} GiB) of KV "
            f"cache, more than the {available} bytes ({available / gib:.3f} GiB) available besides the null block "
            "(vLLM's startup check); give more KV-cache memory or a smaller scheduler.max_model_len",
        )


def _warn_if_never_fits(config: KVCacheConfig, requests: list[Request] | StreamedTrace, max_model_len: int) -> None:
    """A warning (never a refusal) when some request cannot fit even an empty pool."""
    if isinstance(requests, StreamedTrace):
        sizes = np.minimum(requests.prompt_tokens + requests.output_len, max_model_len)
        longest = requests.take(int(np.argmax(sizes)))  # the first of the longest, as max() picks
    else:
        longest = max(requests, key=lambda r: min(r.num_prompt_tokens + r.output_len, max_model_len))
    tokens = min(longest.num_prompt_tokens + longest.output_len, max_model_len)
    need = blocks_for_one_request(config, tokens)
    usable = config.num_blocks - 1
    if need > usable:
        warnings.warn(
            f"cache.num_blocks: {config.num_blocks} blocks ({usable} usable) cannot hold request "
            f"{longest.request_id!r} ({tokens} tokens need {need} blocks across {len(config.groups)} groups); "
            "as in vLLM, it may wait forever or crash (the run goes on)",
            CapacityWarning,
            stacklevel=3,
        )


def _split_too_long(requests: _Workload, max_model_len: int, mode: str) -> tuple[_Workload, list[Request]]:
    """(runnable, rejected): a prompt longer than ``max_model_len`` is rejected as vLLM rejects it
    (``too_long: reject``) or is an error naming both fixes (``too_long: error``)."""
    if isinstance(requests, StreamedTrace):
        long = requests.prompt_tokens > max_model_len
        too_long = [requests.take(i) for i in np.flatnonzero(long).tolist()]
    else:
        too_long = [r for r in requests if r.num_prompt_tokens > max_model_len]
    if too_long and (mode == "error" or len(too_long) == len(requests)):
        first = too_long[0]
        why = "every request is" if len(too_long) == len(requests) else f"{len(too_long)} request(s) are"
        raise _err(
            "scheduler.max_model_len",
            f"{max_model_len} is shorter than the {first.num_prompt_tokens}-token prompt of request "
            f"{first.request_id!r} ({why} too long); use a model with a longer context, or raise "
            "scheduler.max_model_len"
            + (
                ""
                if mode == "error"
                else "; with workload.too_long: reject such requests are rejected, but at least one must fit"
            ),
        )
    if not too_long:
        return requests, []
    if isinstance(requests, StreamedTrace):
        return requests.subset(~long), too_long
    ids = {r.request_id for r in too_long}
    return [r for r in requests if r.request_id not in ids], too_long


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
    from sim.core.policy.prefix import get_prefix_policy

    try:
        return get_prefix_policy(scenario.scheduler.prefix_policy)
    except ValueError as exc:
        raise ScenarioError(str(exc)) from None


def build_checkpoint_policy(scenario: Scenario, config: KVCacheConfig) -> BaseCheckpointPolicy | None:
    """A fresh instance of the scenario's Mamba checkpoint placement (``None`` for ``vllm``); a what-if
    placement on a layout without align-mode Mamba groups is a bad-input error."""
    from sim.core.policy.checkpoint import create_checkpoint_policy

    cache = scenario.cache
    try:
        policy = create_checkpoint_policy(cache.mamba_checkpoint_policy, cache.mamba_checkpoint_options)
    except ValueError as exc:
        raise ScenarioError(str(exc)) from None
    if policy is not None and not config.needs_mamba_block_aligned_split:
        raise _err(
            "cache.mamba_checkpoint_policy",
            f"{cache.mamba_checkpoint_policy!r} places Mamba states: it needs a mamba group with prefix caching "
            "on (align mode); use vllm",
        )
    return policy


def _build_eviction(
    scenario: Scenario,
    connector: Connector | None,
    step_time_model: StepTimeModel | None,
    placement: BaseCheckpointPolicy | None = None,
):
    """The scenario's eviction policy (``None`` for ``lru``) and what it may know (:class:`EvictionContext`).

    Under a what-if checkpoint ``placement`` ``lru`` is
    :class:`~sim.core.policy.eviction.ExtraStatesFirstLRU` (the pool must tag extra states)."""
    from sim.core.kv.eviction import EvictionContext
    from sim.core.policy.eviction import create_eviction_policy, eviction_policy_for_placement

    cache = scenario.cache
    try:
        policy = create_eviction_policy(cache.eviction_policy, cache.eviction_options)
    except ValueError as exc:
        raise ScenarioError(str(exc)) from None
    if policy is None and placement is not None:
        policy = eviction_policy_for_placement(None)
    if policy is None:
        return None, None
    timing = step_time_model
    if timing is None and scenario.model is not None and scenario.model.preset_obj is not None and scenario.hardware:
        from sim.engine.timing import StepTimeModel

        timing = StepTimeModel.from_presets(scenario.model.preset_obj, scenario.hardware.preset_obj())
    flops = None
    if timing is not None:
        memo: dict[int, float] = {}
        prefill_flops = timing.prefill_flops

        def flops(num_tokens: int) -> float:
            """FLOPs of prefilling ``num_tokens`` prompt tokens from an empty context."""
            value = memo.get(num_tokens)
            if value is None:
                value = memo[num_tokens] = prefill_flops(num_tokens)
            return value

    attached = connector is not None and scenario.connector.type != "none"
    context = EvictionContext(connector_attached=attached, prefill_flops=flops)
    try:
        policy.check_context(context)
    except ValueError as exc:
        raise ScenarioError(f"cache.eviction_policy: {exc}") from None
    return policy, context


def _build_workload(
    scenario: Scenario,
    config: KVCacheConfig,
    rng: np.random.Generator,
    max_model_len: int,
    read_at_most: int | None = None,
    streamed: bool = False,
) -> tuple[_Workload, list[Request]]:
    """The workload's requests, hashed at the layout's hash block size: ``(kept, rejected as too long)``;
    with ``streamed`` a trace that streams is a :class:`~sim.workload.stream.StreamedTrace` (only for a run
    without a connector: its per-request options are not checked against it)."""
    try:
        requests = build_requests(
            scenario.workload,
            base_dir=Path.cwd(),
            rng=rng,
            hash_block_size=config.hash_block_size,
            clock=scenario.clock,
            read_at_most=read_at_most,
            stream=streamed,
        )
    except WorkloadError as exc:
        text = str(exc)
        raise ScenarioError(text if text.startswith("workload") else f"workload: {text}") from None
    if not len(requests):
        raise _err("workload", "the workload has no requests (check limit, time_window and sample)")
    if scenario.workload.requests is None and not isinstance(requests, StreamedTrace):
        # (scripted workloads are checked by the scenario model)
        try:
            check_connector_request_ids(scenario.connector.options(), [r.request_id for r in requests])
        except ValueError as exc:
            raise ScenarioError(str(exc).lstrip("@")) from None
    return _split_too_long(requests, max_model_len, scenario.workload.too_long)


def scenario_workload(scenario: Scenario, *, read_at_most: int | None = None) -> tuple[list[Request], list[Request]]:
    """The requests a run of ``scenario`` gets, drawn as the run draws them (:func:`run_rngs`):
    ``(kept, rejected as too long)``. ``read_at_most`` stops reading a trace early (``workload stats --limit``;
    the run reads it whole)."""
    config = build_kv_cache_config(scenario)
    max_model_len = _resolved(scenario.scheduler.max_model_len, "scheduler.max_model_len")
    requests, rejected = _build_workload(
        scenario, config, run_rngs(scenario.seed).workload, max_model_len, read_at_most
    )
    assert isinstance(requests, list)  # (not streamed)
    return requests, rejected


def _scheduler_config(scenario: Scenario, max_model_len: int) -> SchedulerConfig:
    sched = scenario.scheduler
    return SchedulerConfig(
        max_num_seqs=_resolved(sched.max_num_seqs, "scheduler.max_num_seqs"),
        max_num_batched_tokens=_resolved(sched.max_num_batched_tokens, "scheduler.max_num_batched_tokens"),
        max_model_len=max_model_len,
        long_prefill_token_threshold=sched.long_prefill_token_threshold,
        policy=sched.policy,
        watermark=sched.watermark,
        # vLLM 0.34's knobs (None under 0.33, which has none: the defaults are 0.33's behaviour).
        cache_aware_admission_window=sched.cache_aware_admission_window or 0,
        cache_aware_admission_threshold=(
            0.5 if sched.cache_aware_admission_threshold is None else sched.cache_aware_admission_threshold
        ),
        max_num_inflight_kv_loads=sched.max_num_inflight_kv_loads,
        assert_no_external_kv_in_mamba_split=sched.assert_no_external_kv_in_mamba_split,
    )


def _build_step_time_model(scenario: Scenario) -> StepTimeModel | None:
    """The step-time model of a ``clock: time`` run (none on the step clock: a step lasts one unit; its module
    is imported only here)."""
    if scenario.clock != "time":
        return None
    from sim.engine.timing import StepTimeModel

    hw = _resolved(scenario.hardware, "hardware")
    model = _resolved(_resolved(scenario.model, "model").preset_obj, "model.preset")
    return StepTimeModel.from_presets(model, hw.preset_obj(), hw.overrides.given() if hw.overrides else None)


def build_components(
    scenario: Scenario,
    *,
    dry_run: bool = False,
    fast_paths: bool = True,
    workload: tuple[list[Request], list[Request]] | None = None,
    streamed: bool = False,
) -> Components | None:
    """Build (or, with ``dry_run``, only check) everything a run needs.

    Everything that can be refused is checked before anything stateful is
    built: the cache layout, the workload, the sizing, the policy, the
    connector, the step-time model and the eviction policy. ``fast_paths``
    chooses, once, the block hasher (:class:`~sim.accel.SharedPrefixBlockHasher` or the core's), the
    KV-cache manager and the scheduler: the speed layer's
    :class:`~sim.accel.QuietKVCacheManager` and
    :class:`~sim.accel.QuietDecodeScheduler` where the manager supports the
    layout, else its :class:`~sim.accel.CountingKVCacheManager` (counters for the
    steps table) and the plain :class:`Scheduler`; with ``fast_paths`` False the plain
    :class:`KVCacheManager` and :class:`Scheduler`. The tables are identical
    (tests/test_fastpath_differential.py).
    ``streamed``: a trace that streams is read as a
    :class:`~sim.workload.stream.StreamedTrace` (for a run that takes its requests from the loop one at a time
    and lets them go: no connector, actions, sessions; :func:`sim.engine.run.build_run` decides).
    """
    config = _check_block_limit(build_kv_cache_config(scenario))
    rngs = run_rngs(scenario.seed)
    max_model_len = _resolved(scenario.scheduler.max_model_len, "scheduler.max_model_len")
    # ``workload``: requests already drawn for this layout (a cluster's instances share one workload).
    requests, rejected = workload or _build_workload(scenario, config, rngs.workload, max_model_len, streamed=streamed)
    scheduler_config = _scheduler_config(scenario, max_model_len)
    _check_kv_cache_sizing(scenario, config, max_model_len, scheduler_config.max_in_flight_tokens)
    _warn_if_never_fits(config, requests, max_model_len)
    policy = _check_policy(scenario)
    connector = _build_connector(scenario, config)
    step_time_model = _build_step_time_model(scenario)
    placement = build_checkpoint_policy(scenario, config)
    eviction_policy, eviction_context = _build_eviction(scenario, connector, step_time_model, placement)
    check_actions(scenario, requests, rejected, config, connector)
    if dry_run:
        return None

    # As vLLM's Scheduler does, hand the manager the in-flight token bound (sliding-window admission cap).
    manager_cls: type[KVCacheManager] = KVCacheManager
    if fast_paths:
        manager_cls = QuietKVCacheManager if QuietKVCacheManager.supports(config) else CountingKVCacheManager
    kv_manager = manager_cls(
        config,
        max_in_flight_tokens=scheduler_config.max_in_flight_tokens,
        watermark=scenario.scheduler.watermark,
        corrected_mamba_accounting=scenario.cache.corrected_mamba_accounting,
        eviction_policy=eviction_policy,
        eviction_context=eviction_context,
    )
    from sim.trace.spill import ArrowSpill

    # The steps rows go to disk a row group at a time as they fill one (a long run's largest table).
    recorder = Recorder(len(config.groups), record_schedule=bool(scenario.outputs.schedule_table), spill=ArrowSpill())
    # The speed layer's scheduler goes with its manager (it reads the manager's quiet horizons).
    scheduler_cls = QuietDecodeScheduler if isinstance(kv_manager, QuietKVCacheManager) else Scheduler
    scheduler = scheduler_cls(
        scheduler_config,
        kv_manager,
        connector=connector,
        prefix_policy=policy,
        recorder=recorder,
        admission_checker=make_truth_checker(kv_manager, connector),
        on_crash=scenario.on_crash,
        checkpoint_policy=placement,
        block_hasher=SharedPrefixBlockHasher(config.hash_block_size) if fast_paths else None,
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
        connector_rng=rngs.connector,
        rejected=rejected,
    )
