"""Rewrite a scenario into an equivalent, more explicit one (candidates the shrink driver tests).

* :func:`to_step_script`: a ``clock: time`` replay (trace, generator or
  script) becomes a ``clock: steps`` script: each request that arrived during
  the original run, with its prompt as ``content`` / ``output_of`` segments and
  ``at:`` the step it arrived at, and ``cache.num_blocks`` fixed to the run's.
  The scheduler decides step by step, so this is exact for everything but the
  connector's transfer timing (a transfer in seconds becomes
  ``async_load_steps``), which is why the driver keeps it only when the
  property still holds.
* :func:`to_explicit_groups`: a model preset's KV-cache layout becomes
  explicit ``cache.groups`` (no model, no hardware), which lets the driver drop
  groups and ``export vllm-test`` lower the scenario.

Both work on the JSON-able dict of a resolved scenario and return a new dict,
or ``None`` when the rewrite does not apply.
"""

from __future__ import annotations

import copy
from typing import Any

from sim.core.kv.specs import KVCacheConfig, MambaSpec, SlidingWindowSpec
from sim.core.request import Request
from sim.core.tokens import OUTPUT_STREAM_PREFIX, StreamSegment, basic_segments


def _segment(seg: Any) -> dict | None:
    if not isinstance(seg, StreamSegment):
        return None  # explicit token ids: a step script cannot name them
    if seg.stream.startswith(OUTPUT_STREAM_PREFIX):
        return {"output_of": seg.stream[len(OUTPUT_STREAM_PREFIX) :], "start": seg.start, "tokens": seg.length}
    return {"content": seg.stream, "start": seg.start, "tokens": seg.length}


def request_entry(step: int, request: Request) -> dict | None:
    """The script entry of ``request`` arriving at ``step`` (``None`` if its prompt holds explicit ids)."""
    prompt = [_segment(s) for s in basic_segments(request.prompt) if s.length > 0]
    if any(p is None for p in prompt):
        return None
    entry: dict[str, Any] = {"id": request.request_id, "at": step, "prompt": prompt, "max_tokens": request.max_tokens}
    if request.output_len != request.max_tokens:
        entry["output_len"] = request.output_len
    if request.priority:
        entry["priority"] = request.priority
    if request.lora_name is not None:
        entry["lora"] = request.lora_name
    if request.cache_salt is not None:
        entry["cache_salt"] = request.cache_salt
    return entry


def to_step_script(data: dict, arrivals: list[tuple[int, Request]], num_blocks: int) -> dict | None:
    """``data`` (a ``clock: time`` scenario) as a step script of the requests in ``arrivals``."""
    if data.get("clock") != "time" or any(True for _ in data.get("actions", [])):
        return None  # timed actions have no recorded step
    requests = [request_entry(step, r) for step, r in arrivals]
    if any(r is None for r in requests) or not requests:
        return None
    out = copy.deepcopy(data)
    out["clock"] = "steps"
    out["workload"] = {"requests": requests}
    out["cache"]["num_blocks"] = num_blocks
    out["cache"].pop("kv_memory_gb", None)
    out.setdefault("outputs", {}).pop("schedule_table", None)
    return out


def to_explicit_groups(data: dict, config: KVCacheConfig) -> dict | None:
    """``data`` with its model's layout as explicit ``cache.groups`` (``None`` if already explicit)."""
    if data.get("model") is None or data["cache"].get("groups") is not None or data.get("clock") != "steps":
        return None
    sizes = [g.spec.block_size for g in config.groups]
    base = max(set(sizes), key=sizes.count)
    groups: list[Any] = []
    for g in config.groups:
        spec = g.spec
        item: dict[str, Any] = {"type": spec.kind}
        if isinstance(spec, SlidingWindowSpec):
            item["window"] = spec.window
        if isinstance(spec, MambaSpec) and spec.prefill_checkpoints:
            item["prefill_checkpoints"] = True
        if spec.block_size != base:
            item["block_size"] = spec.block_size
        groups.append(item if len(item) > 1 else spec.kind)
    out = copy.deepcopy(data)
    out.pop("model", None)
    out.pop("hardware", None)
    out["cache"]["groups"] = groups
    out["cache"]["block_size"] = base
    out["cache"]["num_blocks"] = config.num_blocks
    out["cache"].pop("kv_memory_gb", None)
    return out
