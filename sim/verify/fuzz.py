"""Seeded random step-clock scenarios for differential testing against vLLM (``hybridsim fuzz``).

:func:`generate` returns scenario ``index`` of seed ``seed`` as a plain dict
(ordinary scenario YAML once dumped); it depends only on ``(seed, index)``
through one ``numpy.random.Generator`` seeded with ``[seed, index]``, so a
differing scenario can be regenerated alone. The dimensions drawn:

* layout (explicit ``cache.groups``): FA, FA+Mamba, FA+SWA, FA+Mamba+SWA,
  FA+2 Mamba; block size 8 or 16; SWA window; Mamba ``prefill_checkpoints``;
* ``retention_interval`` 0 / null / N (N a multiple of the block size, only
  with a Mamba or SWA group); prefix caching off one time in ten
  (Mamba layouts included);
* a tight pool: ``num_blocks`` from one block above what the longest request
  needs alone in an empty pool up to about three times that, and now and then
  a few blocks below it (vLLM has no gate there: it admits and may crash);
* chunked prefill: small ``max_num_batched_tokens``, a
  ``long_prefill_token_threshold`` now and then, ``max_num_seqs`` 1-4;
* requests sharing prefixes of a few documents, with unique suffixes, some
  quoting an earlier request's answer; arrival steps 0-24; 1-6 output tokens;
* the scripted connector (none, ``matched_tokens`` or ``holds``; sync or
  async with 1-3 load steps; with or without
  ``supports_divergent_local_hybrid_hits``);
* ``evict`` actions on a request's prompt blocks in a group (by type or index);
* prefix policy ``pr48425`` or ``max_per_group``;
* one time in three, a *narrow* scenario (drawn after the connector and the
  actions, so the draws above are unchanged): a token budget of 24-64 tokens,
  often not a multiple of the block size (chunked prefills of Mamba requests,
  block-aligned in align mode), a pool of 1.0-1.5 times what the longest
  request needs alone, and a Mamba layout tends to get the scripted
  connector's divergent-hits flag;
* for ``vllm_version`` 0.34, its scheduler knobs, drawn after everything
  else (so scenario ``i`` of a seed is the same under both releases but for
  its ``scheduler`` section and, with a window, its arrival steps):
  ``cache_aware_admission_window`` (none half the time, else 1-8 or 64) with
  ``cache_aware_admission_threshold`` (0, 0.25, 0.5 or 0.9) and, most of the
  time each with a window, ``max_num_seqs`` 1 and arrivals eight times closer
  (a queue forms, so there is something to reorder);
  ``max_num_inflight_kv_loads`` (none, or 1-3; drawn more often with an
  asynchronous connector, where it bites).

Every scenario is verifiable (:func:`sim.verify.lower.not_verifiable_reason`
is ``None``) unless hybridsim refuses it at build time.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sim.config.vllm_versions import NEWEST, at_least
from sim.core.kv.specs import cdiv

LAYOUTS: tuple[tuple[str, ...], ...] = (
    ("full_attention",),
    ("full_attention", "mamba"),
    ("full_attention", "sliding_window"),
    ("full_attention", "mamba", "sliding_window"),
    ("full_attention", "mamba", "mamba"),
)


def _pick(rng: np.random.Generator, options: Any) -> Any:
    return options[int(rng.integers(len(options)))]


def _blocks_alone(groups: list[dict[str, Any]], block_size: int, tokens: int, caching: bool) -> int:
    """Blocks one request of ``tokens`` tokens needs in an empty pool (as ``sim.engine.build`` counts them)."""
    total = 0
    for g in groups:
        if g["type"] == "mamba":
            total += 2 if caching else 1
        elif g["type"] == "sliding_window":
            total += min(cdiv(tokens, block_size), cdiv(g["window"] - 1, block_size) + 1)
        else:
            total += cdiv(tokens, block_size)
    return total


def generate(seed: int, index: int, vllm_version: str = NEWEST) -> dict[str, Any]:
    """Scenario ``index`` of ``seed`` for ``vllm_version`` as a dict (deterministic)."""
    rng = np.random.default_rng([seed, index])
    layout = _pick(rng, LAYOUTS)
    block_size = int(_pick(rng, (8, 16, 16)))
    # Prefix caching off one time in ten, Mamba layouts included (vLLM then hashes at the LCM block size).
    caching = bool(rng.random() < 0.9)
    groups: list[dict[str, Any]] = []
    for kind in layout:
        if kind == "sliding_window":
            groups.append({"type": kind, "window": int(rng.integers(block_size, 5 * block_size))})
        elif kind == "mamba":
            groups.append({"type": kind, "prefill_checkpoints": bool(rng.random() < 0.3)})
        else:
            groups.append({"type": kind})
    sparse = len(layout) > 1
    retention: int | None = 0
    if sparse and caching:
        retention = _pick(rng, (0, None, block_size * int(rng.integers(1, 4))))

    # Requests: prefixes of a few documents, unique tails, some quoting an earlier answer.
    num_docs = int(rng.integers(1, 3))
    num_requests = int(rng.integers(2, 7))
    requests: list[dict[str, Any]] = []
    for i in range(num_requests):
        prompt: list[dict[str, Any]] = []
        doc = f"doc{int(rng.integers(num_docs))}"
        prompt.append({"content": doc, "tokens": int(rng.integers(1, 13)) * block_size + int(rng.integers(0, 3))})
        if requests and rng.random() < 0.2:
            prev = requests[int(rng.integers(len(requests)))]
            prompt.append({"output_of": prev["id"], "tokens": int(rng.integers(1, prev["max_tokens"] + 1))})
        if rng.random() < 0.7:
            prompt.append({"content": f"tail{i}", "tokens": int(rng.integers(1, 3 * block_size))})
        requests.append(
            {"id": f"r{i}", "at": int(rng.integers(0, 25)), "prompt": prompt, "max_tokens": int(rng.integers(1, 7))}
        )
    # A quoted answer must come from a request that arrived earlier.
    arrival = {r["id"]: r["at"] for r in requests}
    for r in requests:
        for seg in r["prompt"]:
            if "output_of" in seg and arrival[seg["output_of"]] >= r["at"]:
                r["at"] = arrival[seg["output_of"]] + int(rng.integers(1, 15))
                arrival[r["id"]] = r["at"]
    longest = max(sum(s["tokens"] for s in r["prompt"]) + r["max_tokens"] for r in requests)
    need = _blocks_alone(groups, block_size, longest, caching)
    if rng.random() < 0.15:
        # Below what the longest request needs alone: vLLM admits and may crash (no build-time gate).
        num_blocks = max(2, need + 1 - int(rng.integers(1, 4)))
    else:
        num_blocks = need + 1 + int(rng.integers(0, 2 * need + 1))

    batch = int(_pick(rng, (block_size * 2, block_size * 4, 64, 128, 256, 2048)))
    scheduler: dict[str, Any] = {
        "max_num_seqs": int(rng.integers(1, 5)),
        "max_num_batched_tokens": batch,
        "prefix_policy": _pick(rng, ("pr48425", "max_per_group")),
    }
    if rng.random() < 0.25:
        scheduler["long_prefill_token_threshold"] = int(rng.integers(1, 5)) * block_size

    connector: dict[str, Any] = {"type": "none"}
    mode = _pick(rng, ("none", "matched_tokens", "holds"))
    if mode != "none":
        chosen = [r["id"] for r in requests if rng.random() < 0.5] or [requests[-1]["id"]]
        table: dict[str, int] = {}
        for rid in chosen:
            r = next(q for q in requests if q["id"] == rid)
            size = sum(s["tokens"] for s in r["prompt"])
            if mode == "holds":
                table[rid] = int(rng.integers(1, size + 1))
            else:
                table[rid] = int(_pick(rng, (0, block_size, 2 * block_size, int(rng.integers(1, size + 1)))))
        connector = {"type": "scripted", mode: table, "supports_divergent_local_hybrid_hits": bool(rng.random() < 0.6)}
        if rng.random() < 0.5:
            connector["load_async"] = True
            connector["async_load_steps"] = int(rng.integers(1, 4))

    actions: list[dict[str, Any]] = []
    for _ in range(int(_pick(rng, (0, 0, 1, 2, 3))) if caching else 0):
        r = requests[int(rng.integers(len(requests)))]
        size = sum(s["tokens"] for s in r["prompt"])
        full = size // block_size
        if full == 0:
            continue
        group: Any = _pick(rng, (*sorted(set(layout)), *range(len(layout))))
        blocks = sorted({int(b) for b in rng.integers(0, full, size=int(rng.integers(1, 4)))})
        actions.append(
            {
                "at": int(r["at"] + rng.integers(1, 30)),
                "evict": {"prefix_of": r["id"], "group": group, "blocks": blocks},
            }
        )
    actions.sort(key=lambda a: a["at"])

    if rng.random() < 1 / 3:
        # Narrow: small budgets chunk Mamba prefills (issue 29's unreproduced KV-event difference had 48 tokens,
        # a pool about 1.2x the largest request, max_per_group, align mode and divergent hits).
        scheduler["max_num_batched_tokens"] = int(_pick(rng, (24, 32, 40, 48, 48, 56, 64)))
        num_blocks = max(2, int(need * (1.0 + 0.5 * rng.random())) + 1)
        if connector["type"] == "scripted" and "mamba" in layout and rng.random() < 0.7:
            connector["supports_divergent_local_hybrid_hits"] = True

    cache: dict[str, Any] = {
        "block_size": block_size,
        "num_blocks": num_blocks,
        "groups": groups,
        "enable_prefix_caching": caching,
        "retention_interval": retention,
    }
    if at_least(vllm_version, "0.34"):
        scheduler.update(_knobs_034(rng, bool(connector.get("load_async"))))
        if "cache_aware_admission_window" in scheduler:
            if rng.random() < 0.7:
                scheduler["max_num_seqs"] = 1
            if rng.random() < 0.7:
                _bunch_arrivals(requests)
    return {
        "name": f"fuzz-{seed}-{index}",
        "seed": seed,
        "clock": "steps",
        "vllm_version": vllm_version,
        "cache": cache,
        "scheduler": scheduler,
        "connector": connector,
        "workload": {"requests": requests},
        "actions": actions,
        "on_crash": "stop",
        "outputs": {"plots": False},
    }


def _bunch_arrivals(requests: list[dict[str, Any]]) -> None:
    """Arrivals eight times closer; a request quoting an earlier answer still arrives after it."""
    arrival: dict[str, int] = {}
    for r in requests:
        r["at"] = r["at"] // 8
        for seg in r["prompt"]:
            if "output_of" in seg and arrival[seg["output_of"]] >= r["at"]:
                r["at"] = arrival[seg["output_of"]] + 1
        arrival[r["id"]] = r["at"]


def _knobs_034(rng: np.random.Generator, load_async: bool) -> dict[str, Any]:
    """vLLM 0.34's admission and async-load knobs (drawn last: the rest of the scenario does not depend on them)."""
    knobs: dict[str, Any] = {}
    if rng.random() < 0.5:
        knobs["cache_aware_admission_window"] = int(_pick(rng, (1, 2, 3, 4, 8, 64)))
        knobs["cache_aware_admission_threshold"] = float(_pick(rng, (0.0, 0.0, 0.25, 0.5, 0.9)))
    if rng.random() < (0.6 if load_async else 0.2):
        knobs["max_num_inflight_kv_loads"] = int(rng.integers(1, 4))
    return knobs


def scenario_yaml(data: dict[str, Any]) -> str:
    """The scenario as YAML text (keys in the order built)."""
    import yaml

    return yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=120)


__all__ = ["LAYOUTS", "generate", "scenario_yaml"]
