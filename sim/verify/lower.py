"""Scenario -> lowered script for :mod:`sim.verify.vllm_side` (the one place hybridsim keys meet vLLM's).

:func:`not_verifiable_reason` says why a scenario cannot be checked against
vLLM (``None`` when it can); :func:`lower` builds the run's components the
way hybridsim does (so the layout, block sizes and requests are exactly the
ones hybridsim runs) and writes them down as a plain dict.

Token ids: hybridsim's prompt content is ``(stream, position)`` pairs or
explicit ids, and the lowering gives vLLM one token id per distinct token,
densely. Explicit ids are kept as they are: they fill ``[0, E)``, ``E`` one past
the largest. Every stream then gets a contiguous range of ids as long as its
*extent* (the furthest position any prompt of the workload reaches in it, or a
request's ``output_len`` for its reserved output stream): first every request's
output stream, in arrival order, then every other stream in order of first
appearance (a trace's hash blocks: one stream each, so each distinct block
hash gets its own ids, first seen first). Position ``p`` of a stream with first
id ``b`` is ``b + p``; request ``i``'s ``j``-th generated token is its output
stream's ``b + j``, which is also what a later prompt quoting that output
(hybridsim's reserved output stream, e.g. a multi-turn chat's history) is
lowered to. So the lowering is injective on tokens: equal content gives equal
ids, distinct content distinct ids, a stream token never equals an explicit
id, and an output never equals a prompt token or another request's output, as
docs/design.md §7 requires. The ids used are the workload's distinct tokens
(the whole Mooncake conversation trace: its 182,790 hash blocks of 512 tokens
plus its outputs, about 98M); every id must fit a signed 32-bit integer (vLLM
0.34 keeps a request's tokens in an int32 buffer), and a workload whose
distinct tokens do not is not verifiable.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from sim.config.scenario import Scenario
from sim.connector.scripted import ScriptedConnector
from sim.core.kv.specs import MambaSpec, SlidingWindowSpec
from sim.core.policy.checkpoint import checkpoint_not_verifiable_reason
from sim.core.tokens import IdsSegment, StreamSegment, basic_segments, output_stream
from sim.engine.build import Components, build_components
from sim.verify.vllm_side import (
    SCRIPT_VERSION,
    ActionScript,
    ConnectorScript,
    GroupScript,
    LoweredScript,
    ReplayScript,
    RequestScript,
)

#: vLLM 0.34 stores token ids as int32 (``vllm.v1.token_buffer.TokenBuffer``).
MAX_TOKEN_ID = (1 << 31) - 1

VERIFIABLE_POLICIES = ("pr48425", "max_per_group")
VERIFIABLE_CONNECTORS = ("none", "scripted")


def not_verifiable_reason(scenario: Scenario, replayed: bool = False) -> str | None:
    """Why vLLM cannot be run on ``scenario`` (``None``: it can); ``replayed``: its connector's answers are
    replayed from a recording (:mod:`sim.verify.replay`), so any connector type is taken.

    Refused: the time clock (vLLM's scheduler has no simulated time), prefix
    policies other than ``pr48425`` (vLLM as shipped) and ``max_per_group``
    (the emulated pre-#48425 lookup), connectors other than ``none`` and
    ``scripted``, eviction policies other than ``lru``, Mamba checkpoint
    placements other than ``vllm``, what-if options vLLM
    lacks (``cache.corrected_mamba_accounting``,
    ``scheduler.assert_no_external_kv_in_mamba_split``), connector faults, LoRA and
    cache salts, a scripted connector that does not declare HMA support
    (vLLM refuses such a connector with the hybrid KV-cache manager on), and
    closed-loop sessions (a turn arrives when the run finishes its parent; the
    lowered script holds fixed arrival steps). A ``cluster`` is not one engine: ``hybridsim verify`` takes it
    instance by instance (:func:`sim.verify.cluster.cluster_not_verifiable_reason`).
    """
    if scenario.cluster is not None:
        return (
            "cluster: several engines, not one (hybridsim verify takes a cluster instance by instance; for one "
            "engine's scenario, shrink a crashed cluster: it keeps the crashing instance alone)"
        )
    if scenario.clock != "steps":
        return "clock: time (vLLM's scheduler has no simulated time; verify needs clock: steps)"
    policy = scenario.scheduler.prefix_policy
    if policy not in VERIFIABLE_POLICIES:
        return f"scheduler.prefix_policy: {policy!r} is not in vLLM (verifiable: {', '.join(VERIFIABLE_POLICIES)})"
    ctype = scenario.connector.type
    if ctype not in VERIFIABLE_CONNECTORS and not replayed:
        return f"connector.type: {ctype!r} has no vLLM counterpart in the harness (verifiable: none, scripted)"
    eviction = scenario.cache.model_dump().get("eviction_policy", "lru")
    if eviction != "lru":
        return f"cache.eviction_policy: {eviction!r} is a what-if; vLLM evicts in free-queue (lru) order"
    try:
        placement_reason = checkpoint_not_verifiable_reason(scenario.cache.mamba_checkpoint_policy)
    except ValueError:  # an unknown name: building the run reports it as bad input
        placement_reason = None
    if placement_reason is not None:
        return placement_reason
    if scenario.cache.corrected_mamba_accounting:
        return "cache.corrected_mamba_accounting: true is a what-if option vLLM does not have"
    if scenario.scheduler.assert_no_external_kv_in_mamba_split:
        return (
            "scheduler.assert_no_external_kv_in_mamba_split: true is a what-if (vLLM 0.22.1's assertion, "
            "gone since 0.23)"
        )
    if ctype == "scripted" and scenario.connector.options().get("supports_hma", True) is False:
        return "connector.supports_hma: false (vLLM refuses a connector without HMA support on a hybrid layout)"
    for i, action in enumerate(scenario.actions):
        if action.connector_fault is not None:
            return f"actions.{i}.connector_fault: the harness's scripted connector takes no faults"
    sessions = scenario.workload.sessions
    if sessions is not None and sessions.mode == "closed":
        return (
            "workload.sessions: closed-loop arrivals depend on the run (a turn arrives when its parent finishes); "
            "the vLLM side replays fixed arrival steps"
        )
    return None


class NotVerifiable(ValueError):
    """The scenario cannot be run through vLLM (message: why)."""


@dataclass(frozen=True)
class LoweredTokens:
    """Token ids of a workload as vLLM is given them: each prompt, each stream's first id (its position ``p``
    is ``stream_base[stream] + p``), and where each request's outputs start (its ``j``-th generated token is
    ``output_base[id] + j``); ``end``: one past the largest id assigned."""

    stream_base: dict[str, int]
    output_base: dict[str, int]
    prompts: dict[str, list[int]]
    end: int


def stream_bases(requests: list[Any]) -> tuple[dict[str, int], int]:
    """Each stream's first token id for ``requests`` (in arrival order) and one past the last id assigned, by
    the module docstring's rule; :class:`NotVerifiable` when the ids do not fit 32 bits or an explicit id is
    negative. A quoted output of a request not in ``requests`` (a cluster instance's turn whose parent ran on
    another instance) is numbered as any other stream, at its first appearance: its tokens are distinct from
    every other token, which is all an engine's decisions see of them."""
    extent = {output_stream(r.request_id): int(r.output_len) for r in requests}
    explicit = 0
    for r in requests:
        for seg in basic_segments(r.prompt):
            if isinstance(seg, StreamSegment):
                extent[seg.stream] = max(extent.get(seg.stream, 0), seg.start + seg.length)
            else:
                assert isinstance(seg, IdsSegment)
                if seg.length:
                    low, high = int(seg.ids.min()), int(seg.ids.max())
                    if low < 0:
                        raise NotVerifiable(f"request {r.request_id}: explicit token ids must not be negative")
                    explicit = max(explicit, high + 1)
    base: dict[str, int] = {}
    end = explicit
    for stream, length in extent.items():
        base[stream] = end
        end += length
    if end - 1 > MAX_TOKEN_ID:
        raise NotVerifiable(
            f"{len(extent)} token streams hold {end - explicit} distinct tokens, which with {explicit} explicit "
            f"ids do not fit vLLM's 32-bit token ids (at most {MAX_TOKEN_ID})"
        )
    return base, end


def lowered_token_ids(everyone: list[Any], lowered: list[Any] | None = None) -> LoweredTokens:
    """The token ids of ``lowered`` (default: all of ``everyone``), numbered over ``everyone`` in arrival order
    (the module docstring's rule; :class:`NotVerifiable` when they do not fit)."""
    everyone = sorted(everyone, key=lambda r: r.arrival_time)
    stream_base, end = stream_bases(everyone)
    output_base = {r.request_id: stream_base[output_stream(r.request_id)] for r in everyone}
    prompts = {r.request_id: _token_ids(r, stream_base) for r in (everyone if lowered is None else lowered)}
    return LoweredTokens(stream_base, output_base, prompts, end)


def _token_ids(request: Any, stream_base: dict[str, int]) -> list[int]:
    """Token ids of ``request``'s prompt, every stream it names having its first id in ``stream_base``."""
    ids: list[int] = []
    for seg in basic_segments(request.prompt):
        if isinstance(seg, StreamSegment):
            base = stream_base[seg.stream] + seg.start
            ids.extend(range(base, base + seg.length))
        else:
            assert isinstance(seg, IdsSegment)
            ids.extend(int(x) for x in seg.ids)
    return ids


def _groups(components: Components) -> list[GroupScript]:
    out: list[GroupScript] = []
    for g in components.kv_cache_config.groups:
        spec = g.spec
        out.append(
            {
                "type": spec.kind,  # type: ignore[typeddict-item]
                "block_size": spec.block_size,
                "window": spec.window if isinstance(spec, SlidingWindowSpec) else None,
                "prefill_checkpoints": bool(isinstance(spec, MambaSpec) and spec.prefill_checkpoints),
            }
        )
    return out


def _connector(components: Components) -> ConnectorScript | None:
    conn = components.connector
    if conn is None:
        return None
    if not isinstance(conn, ScriptedConnector):
        raise NotVerifiable(f"connector {type(conn).__name__} has no vLLM counterpart in the harness")
    load_async = conn.load_async if isinstance(conn.load_async, bool) else dict(conn.load_async)
    return {
        "matched_tokens": dict(conn.matched_tokens),
        "holds": dict(conn.holds),
        "load_async": load_async,
        "async_load_steps": conn.async_load_steps,
        "supports_divergent_local_hybrid_hits": bool(conn.supports_divergent_local_hybrid_hits),
    }


def _actions(scenario: Scenario, components: Components) -> list[ActionScript]:
    kinds = list(components.group_kinds)
    rejected = {r.request_id for r in components.rejected}
    out: list[ActionScript] = []
    for i, action in enumerate(scenario.actions):
        at = int(action.at)
        if action.reset_prefix_cache:
            out.append({"at_step": at, "kind": "reset_prefix_cache"})
            continue
        ev = action.evict
        assert ev is not None
        if ev.prefix_of in rejected:
            raise NotVerifiable(
                f"actions.{i}.evict.prefix_of: request {ev.prefix_of} is rejected as longer than max_model_len; "
                "the lowered script holds only the requests vLLM's scheduler sees"
            )
        groups = [ev.group] if isinstance(ev.group, int) else [i for i, k in enumerate(kinds) if k == ev.group]
        out.append(
            {
                "at_step": at,
                "kind": "evict",
                "request": ev.prefix_of,
                "groups": groups,
                "block_indices": list(ev.blocks),
            }
        )
    return out


def max_steps_bound(script: LoweredScript) -> int:
    """A step bound no run that makes progress reaches: a stalled run stops there."""
    tokens = sum(len(r["prompt_token_ids"]) + r["max_tokens"] for r in script["requests"])
    last = max([r["arrival_step"] for r in script["requests"]] + [a["at_step"] for a in script["actions"]] + [0])
    return last + 4 * tokens + 100


def lower(
    scenario: Scenario,
    built: Components | None = None,
    replay: ReplayScript | None = None,
    arrival_steps: Mapping[str, int] | None = None,
) -> LoweredScript:
    """The lowered script of a verifiable scenario (raises :class:`NotVerifiable` otherwise);
    ``built``: the scenario's components if already built; ``replay``: the connector's recorded answers
    (the script's connector is then the harness's replaying one, whatever the scenario's);
    ``arrival_steps``: the step each request entered the scheduler, where that is not its arrival."""
    reason = not_verifiable_reason(scenario, replayed=replay is not None)
    if reason is not None:
        raise NotVerifiable(reason)
    components = built if built is not None else build_components(scenario)
    assert components is not None
    config = components.kv_cache_config
    s = scenario.scheduler
    assert s.max_num_seqs is not None and s.max_num_batched_tokens is not None and s.max_model_len is not None
    # Output streams are numbered over every request (a later prompt that quotes one, a multi-turn
    # chat's history, then names the very ids vLLM's request generated).
    # (The engine's order: a stable sort by arrival time; requests arriving before one step join in it.)
    everyone = sorted(components.requests, key=lambda r: r.arrival_time)
    # A prompt longer than max_model_len never reaches vLLM's scheduler (its input processor rejects it).
    ordered = [r for r in everyone if r.num_prompt_tokens <= s.max_model_len]
    if arrival_steps is not None:  # in the order they entered the scheduler
        rank = {rid: k for k, rid in enumerate(arrival_steps)}
        ordered.sort(key=lambda r: (arrival_steps.get(r.request_id, int(r.arrival_time)), rank.get(r.request_id, -1)))
    tokens = lowered_token_ids(everyone, ordered)
    output_base, prompts = tokens.output_base, tokens.prompts
    requests: list[RequestScript] = []
    for r in ordered:
        if arrival_steps is not None and r.request_id in arrival_steps:
            arrival = arrival_steps[r.request_id]
        elif r.arrival_time != int(r.arrival_time):
            raise NotVerifiable(f"request {r.request_id}: arrival {r.arrival_time} is not a whole step")
        else:
            arrival = int(r.arrival_time)
        for lora in (r.lora_name, r.cache_salt):
            if lora:
                raise NotVerifiable(f"request {r.request_id}: LoRA names and cache salts are not lowered")
        requests.append(
            {
                "id": r.request_id,
                "arrival_step": arrival,
                "prompt_token_ids": prompts[r.request_id],
                "max_tokens": int(r.output_len),
                "priority": int(r.priority),
                "output_token_base": output_base[r.request_id],
            }
        )
    script: LoweredScript = {
        "version": SCRIPT_VERSION,
        "name": scenario.name,
        "vllm_version": scenario.vllm_version,
        "token_id_end": tokens.end,
        "groups": _groups(components),
        "num_blocks": config.num_blocks,
        "scheduler_block_size": config.scheduler_block_size,
        "hash_block_size": config.hash_block_size,
        "enable_prefix_caching": config.enable_prefix_caching,
        "retention_interval": config.retention_interval,
        "max_num_seqs": s.max_num_seqs,
        "max_num_batched_tokens": s.max_num_batched_tokens,
        "max_model_len": s.max_model_len,
        "long_prefill_token_threshold": s.long_prefill_token_threshold,
        "scheduling_policy": s.policy,
        "watermark": float(s.watermark),
        "cache_aware_admission_window": s.cache_aware_admission_window,
        "cache_aware_admission_threshold": s.cache_aware_admission_threshold,
        "max_num_inflight_kv_loads": s.max_num_inflight_kv_loads,
        "prefix_policy": s.prefix_policy,  # type: ignore[typeddict-item]
        "connector": replay if replay is not None else _connector(components),
        "requests": requests,
        "actions": _actions(scenario, components),
        "max_steps": 0,
    }
    script["max_steps"] = max_steps_bound(script)
    if replay is not None:
        last = max([b for _, b in replay["steps"]] + [int(f[0]) for f in replay["finished"]] + [0])
        script["max_steps"] = max(script["max_steps"], last + 100)
    return script
