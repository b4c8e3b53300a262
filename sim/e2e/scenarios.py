"""Seeded random scenarios over every dimension a user can reach (``hybridsim fuzz --e2e``).

:func:`generate` returns scenario ``index`` of seed ``seed`` as a plain dict (ordinary scenario YAML once
dumped) plus the extra files it reads (a small trace); it depends only on ``(seed, index)`` through one
``numpy.random.Generator`` seeded with ``[seed, index, E2E_STREAM]``. Three kinds:

* **step** (about half): a ``hybridsim fuzz`` scenario (:func:`sim.verify.fuzz.generate`: every layout,
  block size, retention, tight pool, chunked prefill, scripted connector with per-request maps, evict
  actions) widened with what ``fuzz`` leaves out: every built-in prefix policy and ``group_coherent``
  eviction, ``on_crash: record``, per-request ``load_async`` maps, a ``faulty`` wrapper with per-request
  fault lists and ``connector_fault`` actions, ``reset_prefix_cache`` actions, sessions (``after`` links,
  open or closed loop, with concurrency), CSV tables and invariant checks;
* **time**: a model and hardware preset on the time clock with a small generator workload (each structure),
  a small pool, every built-in prefix and eviction policy (``marconi`` included), and no, the ``offload``,
  the ``remote``, a ``faulty`` or a ``multi`` (``remote`` then ``offload``) connector, sessions for
  conversations;
* **trace**: the same on a small Mooncake-format trace written next to the scenario (``trace.jsonl``), with
  ``limit``, ``sample`` and ``time_window``.

About a quarter of the scenarios of every kind then run on a **cluster** (:func:`_cluster`): 1 to 4
instances (a count, or per-instance cache and scheduler overrides), every built-in router with its options
(``group_aware``, ``load_weight``, a stale ``view_delay``), and a shared tier or prefill/decode roles with
their links, or both (each instance then runs a ``multi`` connector). A cluster takes no scripted actions,
and with a tier or P/D roles no connector of its own, so those are dropped. The cluster is drawn from a stream of its own (:data:`CLUSTER_STREAM`): a scenario that
stays on one instance is the one the same seed gave before the cluster layer existed.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from sim.config.presets import HARDWARE_PRESETS, MODEL_PRESETS
from sim.config.vllm_versions import NEWEST
from sim.core.policy.eviction import builtin_eviction_policy_names
from sim.core.policy.prefix import builtin_prefix_policy_names
from sim.verify import fuzz

#: Mixed into the seed so that e2e scenario ``i`` of seed ``s`` differs from ``fuzz`` scenario ``i`` of ``s``.
E2E_STREAM = 0xE2E
#: The stream the cluster layer draws from (``[seed, index, E2E_STREAM, CLUSTER_STREAM]``).
CLUSTER_STREAM = 0xC1
#: Share of the scenarios that run on a cluster.
CLUSTER_SHARE = 0.25
#: Routers the generator configures (every built-in one; a test checks it covers the registry's).
ROUTERS = ("round_robin", "least_loaded", "session_affinity", "prefix_aware")
#: The trace file a ``trace`` scenario reads, written next to it.
TRACE_FILE = "trace.jsonl"
#: Connectors the generator configures (every built-in one; a test checks it covers the registry's).
CONNECTORS = ("none", "scripted", "offload", "remote", "faulty", "multi")
#: Eviction policies that need the step-time model (a preset model and hardware).
TIMED_EVICTION = ("marconi",)


def _pick(rng: np.random.Generator, options: Any) -> Any:
    return options[int(rng.integers(len(options)))]


def _chance(rng: np.random.Generator, p: float) -> bool:
    return bool(rng.random() < p)


def generate(seed: int, index: int, vllm_version: str = NEWEST) -> tuple[dict[str, Any], dict[str, str]]:
    """Scenario ``index`` of ``seed`` for ``vllm_version`` and the extra files it reads (``{file name: text}``),
    deterministic."""
    rng = np.random.default_rng([seed, index, E2E_STREAM])
    kind = _pick(rng, ("step", "step", "step", "time", "time", "trace"))
    files: dict[str, str] = {}
    if kind == "step":
        data = _step(rng, seed, index, vllm_version)
    else:
        data = _timed(rng, kind, files)
        data["vllm_version"] = vllm_version
    data["name"] = f"e2e-{seed}-{index}"
    data["seed"] = int(rng.integers(0, 2**31))
    data["on_crash"] = _pick(rng, ("stop", "stop", "record"))
    outputs = data.setdefault("outputs", {})
    outputs["plots"] = False
    if _chance(rng, 0.2):
        outputs["tables_format"] = "csv"
    if _chance(rng, 0.2):
        data["check_invariants"] = True
    cluster_rng = np.random.default_rng([seed, index, E2E_STREAM, CLUSTER_STREAM])
    if _chance(cluster_rng, CLUSTER_SHARE):
        _cluster(cluster_rng, data)
    return data, files


# --------------------------------------------------------------------------- cluster


def _cluster(rng: np.random.Generator, data: dict[str, Any]) -> None:
    """Put ``data`` on a cluster (module docstring): instances, a router, and a shared tier or P/D roles."""
    data.pop("actions", None)  # a cluster takes no scripted actions (they act on one engine's cache)
    count = int(rng.integers(1, 5))
    shape = _pick(rng, ("plain", "plain", "tier", "pd")) if count >= 2 else _pick(rng, ("plain", "tier"))
    cluster: dict[str, Any] = {}
    if shape == "pd":
        prefill = int(rng.integers(1, count))
        cluster["instances"] = [{"role": "prefill"}] * prefill + [{"role": "decode"}] * (count - prefill)
        if _chance(rng, 0.5):
            cluster["pd"] = _link(rng)
    elif _chance(rng, 0.4):
        cluster["instances"] = [_instance_overrides(rng, data) for _ in range(count)]
    else:
        cluster["instances"] = count
    router: dict[str, Any] = {"policy": _pick(rng, ROUTERS)}
    if router["policy"] == "prefix_aware":
        router["group_aware"] = _chance(rng, 0.5)
        if _chance(rng, 0.3):
            router["load_weight"] = float(_pick(rng, (0.0, 0.5, 4.0)))
    if _chance(rng, 0.3):
        router["view_delay"] = float(_pick(rng, (1, 3, 10))) if data.get("clock") == "steps" else 0.05
    cluster["router"] = router
    if shape == "tier" or (shape == "pd" and _chance(rng, 0.4)):
        tier: dict[str, Any] = {
            "capacity_gb": float(_pick(rng, (0.0005, 0.01, 1.0))),
            "store": _pick(rng, ("on_compute", "on_finish")),
            **_link(rng),
        }
        groups = data.get("cache", {}).get("groups")
        if groups and _chance(rng, 0.3):  # a share of the store per group (explicit layouts: their count is known)
            tier["group_capacity"] = [0.9 / len(groups)] * len(groups)
        cluster["tier"] = tier
    if shape in ("tier", "pd"):
        data["connector"] = {"type": "none"}
    data["cluster"] = cluster


def _link(rng: np.random.Generator) -> dict[str, Any]:
    """A tier's or a P/D link's transfer options."""
    out: dict[str, Any] = {"transfer_steps": int(rng.integers(0, 3))}
    if _chance(rng, 0.3):
        out["concurrency"] = int(rng.integers(1, 3))
    if _chance(rng, 0.3):
        out["latency_us"] = float(_pick(rng, (0.0, 500.0)))
    return out


def _instance_overrides(rng: np.random.Generator, data: dict[str, Any]) -> dict[str, Any]:
    """One instance's overrides: its pool size, its batch limits, its prefix policy (or none)."""
    out: dict[str, Any] = {}
    if _chance(rng, 0.5):
        blocks = int(data.get("cache", {}).get("num_blocks") or 100)
        out["cache"] = {"num_blocks": max(4, int(blocks * float(_pick(rng, (0.5, 1.0, 2.0)))))}
    if _chance(rng, 0.3):
        out["scheduler"] = {"max_num_seqs": int(rng.integers(1, 8))}
    if _chance(rng, 0.2):
        out.setdefault("scheduler", {})["prefix_policy"] = _pick(rng, builtin_prefix_policy_names())
    return out


# --------------------------------------------------------------------------- step clock


def _step(rng: np.random.Generator, seed: int, index: int, vllm_version: str) -> dict[str, Any]:
    data = fuzz.generate(seed, index, vllm_version)
    data.pop("name", None)
    requests: list[dict[str, Any]] = data["workload"]["requests"]
    ids = [r["id"] for r in requests]
    scheduler = data["scheduler"]
    if _chance(rng, 0.35):
        scheduler["prefix_policy"] = _pick(rng, builtin_prefix_policy_names())
    cache = data["cache"]
    if _chance(rng, 0.2) and cache.get("enable_prefix_caching", True):
        cache["eviction_policy"] = _pick(rng, [p for p in builtin_eviction_policy_names() if p not in TIMED_EVICTION])
    connector = data["connector"]
    if connector["type"] == "scripted" and connector.get("load_async") is None and _chance(rng, 0.4):
        connector["load_async"] = {rid: _chance(rng, 0.5) for rid in ids if _chance(rng, 0.5)}
        connector["async_load_steps"] = int(rng.integers(1, 4))
    if connector["type"] == "scripted" and _chance(rng, 0.3):
        data["connector"] = {"type": "faulty", "wraps": connector, **_faults(rng, ids)}
        if _chance(rng, 0.5):
            data["actions"].append({"at": int(rng.integers(0, 30)), "connector_fault": _faults(rng, ids)})
    if _chance(rng, 0.15):
        data["actions"].append({"at": int(rng.integers(0, 40)), "reset_prefix_cache": True})
    data["actions"].sort(key=lambda a: a["at"])
    if _chance(rng, 0.3):
        _add_sessions(rng, data["workload"])
    return data


def _faults(rng: np.random.Generator, ids: list[str]) -> dict[str, Any]:
    """Fault options: a probability or two and per-request lists and maps."""
    out: dict[str, Any] = {}
    if _chance(rng, 0.5):
        out["load_failure_prob"] = float(_pick(rng, (0.1, 0.3, 0.5)))
    if _chance(rng, 0.3):
        out["mamba_drop_prob"] = float(_pick(rng, (0.2, 0.5)))
    some = [rid for rid in ids if _chance(rng, 0.3)]
    if some:
        out[_pick(rng, ("fail_loads", "drop_mamba"))] = some
    if _chance(rng, 0.3):
        out["partial_loads"] = {rid: float(_pick(rng, (0.25, 0.5))) for rid in ids if _chance(rng, 0.3)}
    if _chance(rng, 0.3):
        out["slow"] = {rid: float(_pick(rng, (2, 3))) for rid in ids if _chance(rng, 0.3)}
    return out


def _add_sessions(rng: np.random.Generator, workload: dict[str, Any]) -> None:
    """``after`` links to earlier-arriving requests (with think times) and an open or closed replay."""
    requests = sorted(workload["requests"], key=lambda r: r["at"])
    for i, r in enumerate(requests):
        if i and _chance(rng, 0.5):
            r["after"] = [requests[int(rng.integers(i))]["id"]]
            r["think"] = int(rng.integers(0, 4))
    sessions: dict[str, Any] = {"mode": _pick(rng, ("open", "closed"))}
    if sessions["mode"] == "closed" and _chance(rng, 0.4):
        sessions["concurrency"] = int(rng.integers(1, 3))
    workload["sessions"] = sessions


# --------------------------------------------------------------------------- time clock


def _timed(rng: np.random.Generator, kind: str, files: dict[str, str]) -> dict[str, Any]:
    model = _pick(rng, list(MODEL_PRESETS))
    data: dict[str, Any] = {
        "clock": "time",
        "model": {"preset": model},
        "hardware": {"preset": _pick(rng, list(HARDWARE_PRESETS))},
        "cache": {"num_blocks": int(rng.integers(12, 200))},
        "scheduler": {
            "prefix_policy": _pick(rng, builtin_prefix_policy_names()),
            "max_num_batched_tokens": int(_pick(rng, (256, 1024, 2048, 8192))),
            "max_num_seqs": int(_pick(rng, (4, 16, 64))),
            "max_model_len": 32768,
        },
    }
    if _chance(rng, 0.4):
        data["cache"]["eviction_policy"] = _pick(rng, builtin_eviction_policy_names())
    if kind == "trace":
        files[TRACE_FILE] = _trace(rng)
        data["workload"] = {"trace": {"format": "mooncake", "path": TRACE_FILE, "allow_merged_blocks": True}}
        workload = data["workload"]
        if _chance(rng, 0.5):
            workload["limit"] = int(rng.integers(5, 30))
        if _chance(rng, 0.3):
            workload["sample"] = float(_pick(rng, (0.5, 0.8)))
        if _chance(rng, 0.3):
            workload["time_window"] = [0.0, float(rng.integers(5, 40))]
        if _chance(rng, 0.3):
            workload["sessions"] = {"mode": _pick(rng, ("open", "closed")), "orphans": "root"}
    else:
        data["workload"] = {"generator": _generator(rng)}
        if data["workload"]["generator"]["structure"]["kind"] in ("multi_turn", "fanout") and _chance(rng, 0.4):
            data["workload"]["sessions"] = {"mode": "closed", "concurrency": int(rng.integers(1, 4))}
    data["connector"] = _timed_connector(rng)
    return data


def _dist(rng: np.random.Generator, low: int, high: int) -> dict[str, Any]:
    if _chance(rng, 0.5):
        return {"dist": "uniform", "low": low, "high": high}
    return {"dist": "lognormal", "mean": (low + high) / 2, "sigma": 0.5}


def _generator(rng: np.random.Generator) -> dict[str, Any]:
    structure_kind = _pick(rng, ("unique", "shared_system", "multi_turn", "fanout", "rag"))
    system = {"num_prompts": int(rng.integers(1, 4)), "length": _dist(rng, 100, 2000)}
    structure: dict[str, Any] = {"kind": structure_kind}
    if structure_kind == "unique":
        structure["prompt"] = _dist(rng, 50, 3000)
    elif structure_kind == "shared_system":
        structure |= {"system": system, "user_len": _dist(rng, 20, 500)}
    elif structure_kind == "multi_turn":
        structure |= {
            "system": system,
            "turns": {"dist": "uniform", "low": 1, "high": 4},
            "first_len": _dist(rng, 50, 1500),
            "user_len": _dist(rng, 20, 300),
            "think_time": {"dist": "exponential", "mean": 1.0},
        }
    elif structure_kind == "fanout":
        structure |= {
            "context_len": _dist(rng, 100, 2000),
            "branches": {"dist": "uniform", "low": 1, "high": 4},
            "branch_len": _dist(rng, 20, 300),
            "join_len": _dist(rng, 20, 200),
        }
    else:
        structure |= {
            "num_documents": 6,
            "doc_len": _dist(rng, 100, 800),
            "docs_per_prompt": int(rng.integers(1, 4)),
            "query_len": _dist(rng, 20, 200),
        }
    return {
        "arrivals": {"process": "poisson", "rate": float(_pick(rng, (1.0, 4.0, 20.0)))},
        "count": int(rng.integers(3, 16)),
        "structure": structure,
        "output": {"dist": "uniform", "low": 1, "high": int(_pick(rng, (4, 32, 128)))},
    }


def _timed_connector(rng: np.random.Generator) -> dict[str, Any]:
    kind = _pick(rng, ("none", "none", "offload", "remote", "faulty"))
    if kind == "offload":
        return {"type": "offload", "capacity_gb": float(_pick(rng, (0.5, 4.0, 64.0)))}
    if kind == "remote":
        if _chance(rng, 0.4):  # vLLM's MultiConnector: NIXL first, then a CPU tier
            return {"type": "multi", "connectors": [{"type": "remote"}, {"type": "offload", "capacity_gb": 4.0}]}
        return {"type": "remote"}
    if kind == "faulty":
        inner = _pick(rng, ({"type": "offload", "capacity_gb": 4.0}, {"type": "remote"}))
        return {"type": "faulty", "wraps": inner, "load_failure_prob": 0.2, "mamba_drop_prob": 0.2, "slow_prob": 0.2}
    return {"type": "none"}


def _trace(rng: np.random.Generator) -> str:
    """A small Mooncake-format trace: conversations whose turns extend their parent's hash ids."""
    lines: list[str] = []
    next_id = 1
    t = 0
    convs: list[list[int]] = []
    for _ in range(int(rng.integers(8, 40))):
        t += int(rng.integers(0, 2000))
        if convs and _chance(rng, 0.5):
            base = convs[int(rng.integers(len(convs)))]
            ids = base + list(range(next_id, next_id + int(rng.integers(1, 3))))
        else:
            ids = [0] + list(range(next_id, next_id + int(rng.integers(1, 4))))
        next_id = max(next_id, max(ids) + 1)
        convs.append(ids)
        length = 512 * (len(ids) - 1) + int(rng.integers(1, 513))
        record = {"timestamp": t, "input_length": length, "output_length": int(rng.integers(1, 64)), "hash_ids": ids}
        lines.append(json.dumps(record))
    return "\n".join(lines) + "\n"


__all__ = ["CONNECTORS", "ROUTERS", "TRACE_FILE", "generate"]
