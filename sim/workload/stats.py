"""Summary statistics of a built workload, including its ideal prefix-hit rate.

The *ideal* prefix-hit rate is what an infinite, full-attention-only prefix
cache would reach: requests are taken in arrival order; a request's hit is the
longest run of leading prompt blocks whose chained hash some earlier request
already produced, and every block a request computes (prompt and generated
tokens) is then remembered. As in vLLM, a request caches the full blocks of its
first ``num_prompt_tokens + output_len - 1`` tokens (the last sampled token is
never computed) and its hit is capped at ``num_prompt_tokens - 1`` tokens
(``KVCacheManager.get_computed_blocks`` recomputes at least the last prompt
token), so a lookup sees at most ``(P - 1) // block_size`` blocks. The rate is
hit tokens over prompt tokens.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from sim.core.kv.hashing import BlockHash, extend_block_hashes
from sim.core.kv.specs import prefill_checkpoint_position
from sim.core.policy.checkpoint import BaseCheckpointPolicy, PrefixFacts, extra_state_positions
from sim.core.request import Request
from sim.core.tokens import StreamSegment, output_stream


def _summary(values: np.ndarray) -> dict[str, float]:
    if values.size == 0:
        return {"mean": 0.0, "p50": 0.0, "p90": 0.0, "p99": 0.0, "max": 0.0}
    p50, p90, p99 = np.percentile(values, [50, 90, 99])
    return {
        "mean": float(values.mean()),
        "p50": float(p50),
        "p90": float(p90),
        "p99": float(p99),
        "max": float(values.max()),
    }


def ideal_hit_tokens(requests: Sequence[Request], block_size: int) -> list[int]:
    """Per request (in the order given, which must be arrival order), its ideal hit in tokens."""
    seen: set[BlockHash] = set()
    hits: list[int] = []
    for req in requests:
        hashes = _computed_hashes(req, block_size)
        lookup = (req.num_prompt_tokens - 1) // block_size
        hit = 0
        while hit < lookup and hashes[hit] in seen:
            hit += 1
        hits.append(hit * block_size)
        seen.update(hashes)
    return hits


def _computed_hashes(req: Request, block_size: int) -> list[BlockHash]:
    """The chained hashes of the full blocks a request computes (prompt and output, less the last token)."""
    segments = req.prompt + (StreamSegment(output_stream(req.request_id), 0, req.output_len),)
    hashes: list[BlockHash] = []
    extend_block_hashes(
        hashes, segments, req.num_prompt_tokens + req.output_len - 1, block_size, req.lora_name, req.cache_salt
    )
    return hashes


def placement_hit_tokens(
    requests: Sequence[Request],
    block_size: int,
    placement: BaseCheckpointPolicy | None,
    retention_interval: int | None = 0,
) -> list[int]:
    """Per request (arrival order), its hit with an infinite pool when a hit needs a Mamba state.

    The same infinite cache as :func:`ideal_hit_tokens` (every computed block
    is remembered, the lookup sees at most ``(P - 1) // block_size`` blocks),
    but a hit at ``p`` also needs a Mamba state saved at ``p`` by an earlier
    request: the request resumes at the deepest saved state within its
    full-attention hit. States are saved as vLLM's align mode saves them: at
    the prompt's own boundary ``floor((P - 1) / B) * B``, at the junction
    (the full-attention hit, when deeper than the resume point), every
    ``retention_interval`` tokens of the computed blocks (``None``: at every
    block; both an upper bound, since vLLM keeps only those that fall on a
    chunk end), plus ``placement``'s extra positions (``None``: vLLM's
    placement alone). ``placement`` hears every request's arrival in order
    (a stateful one must be fresh).
    """
    fa_seen: set[BlockHash] = set()
    states: set[BlockHash] = set()
    hits: list[int] = []
    for req in requests:
        hashes = _computed_hashes(req, block_size)
        prompt_state = prefill_checkpoint_position(req.num_prompt_tokens, block_size)
        lookup = prompt_state // block_size
        prompt_hashes = hashes[:lookup]
        if placement is not None:
            placement.on_arrival(req, prompt_hashes)
        fa = 0
        while fa < lookup and hashes[fa] in fa_seen:
            fa += 1
        resume = 0
        for i in range(fa, 0, -1):
            if hashes[i - 1] in states:
                resume = i
                break
        hits.append(resume * block_size)
        junction = fa * block_size if fa > resume else 0
        saves = [prompt_state, junction]
        if retention_interval is None:
            saves.extend(range(block_size, (len(hashes) + 1) * block_size, block_size))
        elif retention_interval:
            saves.extend(range(retention_interval, (len(hashes) + 1) * block_size, retention_interval))
        if placement is not None:
            facts = PrefixFacts(block_size, prompt_hashes, fa * block_size, resume * block_size, prompt_state, junction)
            saves.extend(extra_state_positions(placement, req, facts))
        for pos in saves:
            if pos and pos % block_size == 0 and pos // block_size <= len(hashes):
                states.add(hashes[pos // block_size - 1])
        fa_seen.update(hashes)
    return hits


def workload_stats(requests: Sequence[Request], block_size: int) -> dict:
    """Counts, timing, length percentiles and the ideal prefix-hit rate at ``block_size``.

    Keys: ``requests``, ``duration`` (last minus first arrival, in the clock's
    unit), ``rate`` (requests per unit, ``None`` for a zero duration),
    ``prompt_len`` / ``output_len`` (mean, p50, p90, p99, max),
    ``prompt_tokens`` (total), ``block_size``, ``ideal_hit_tokens`` and
    ``ideal_prefix_hit_rate``. Requests are not modified.
    """
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    ordered = sorted(requests, key=lambda r: r.arrival_time)  # stable: ties keep list order
    arrivals = np.array([r.arrival_time for r in ordered], dtype=float)
    prompt = np.array([r.num_prompt_tokens for r in ordered], dtype=np.int64)
    output = np.array([r.output_len for r in ordered], dtype=np.int64)
    duration = float(arrivals[-1] - arrivals[0]) if len(ordered) else 0.0
    hit_tokens = sum(ideal_hit_tokens(ordered, block_size))
    total_prompt = int(prompt.sum())
    return {
        "requests": len(ordered),
        "duration": duration,
        "rate": (len(ordered) / duration) if duration > 0 else None,
        "prompt_len": _summary(prompt),
        "output_len": _summary(output),
        "prompt_tokens": total_prompt,
        "block_size": block_size,
        "ideal_hit_tokens": int(hit_tokens),
        "ideal_prefix_hit_rate": (hit_tokens / total_prompt) if total_prompt else 0.0,
    }
