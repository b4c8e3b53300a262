"""The vLLM releases a scenario can name (``vllm_version``), and what each one changes at the scenario level.

hybridsim mirrors vLLM's v1 scheduler and KV-cache manager release by
release (docs/porting.md). A scenario names the release whose semantics it
runs under with ``vllm_version`` (default :data:`NEWEST`). What a release
adds to a scenario:

* keys that exist only from that release on (:data:`KEYS_SINCE`, named as
  vLLM names them); giving one in a scenario for an older release is an error
  naming the key and the version;
* the defaults it fills in for those keys (:data:`KEY_DEFAULTS`, vLLM's);
* vLLM's ``CacheConfig.DEFAULT_BLOCK_SIZE`` (:data:`DEFAULT_BLOCK_SIZE`), what
  ``cache.block_size: null`` resolves to (hybridsim's own default stays 16).

With its new knobs at their defaults, 0.34 decides as 0.33 (vLLM's own
scheduler does, on every workload measured; hybridsim is held to both by
``hybridsim fuzz --vllm``), so a scenario's decisions do not depend on
``vllm_version`` until it turns a new knob.
"""

from __future__ import annotations

from typing import Any, Literal, get_args

#: A release a scenario can name.
VllmVersion = Literal["0.33", "0.34"]
#: Supported releases, oldest first (the harness ``sim.verify.vllm_side`` drives the same ones).
SUPPORTED: tuple[str, ...] = get_args(VllmVersion)
#: The default ``vllm_version``: the newest release hybridsim mirrors.
NEWEST: VllmVersion = "0.34"

#: ``CacheConfig.DEFAULT_BLOCK_SIZE`` per release (before an attention backend's preference).
DEFAULT_BLOCK_SIZE: dict[str, int] = {"0.33": 16, "0.34": 64}

#: Scenario keys (dotted paths) that exist only from a release on.
KEYS_SINCE: dict[str, str] = {
    "scheduler.cache_aware_admission_window": "0.34",
    "scheduler.cache_aware_admission_threshold": "0.34",
    "scheduler.max_num_inflight_kv_loads": "0.34",
}

#: What those keys default to in a release that has them (vLLM's ``SchedulerConfig`` defaults).
KEY_DEFAULTS: dict[str, Any] = {
    "scheduler.cache_aware_admission_window": 0,
    "scheduler.cache_aware_admission_threshold": 0.5,
    "scheduler.max_num_inflight_kv_loads": None,
}


def at_least(version: str, release: str) -> bool:
    """Whether ``version`` is ``release`` or newer (both supported releases)."""
    return SUPPORTED.index(version) >= SUPPORTED.index(release)


def normalize(value: Any) -> Any:
    """``0.34`` (a YAML float) or ``"0.34"`` -> ``"0.34"``; anything else is returned as it is, for the validator
    to refuse."""
    if isinstance(value, float):
        text = repr(value)
        return text if text in SUPPORTED else value
    return value


__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "KEYS_SINCE",
    "KEY_DEFAULTS",
    "NEWEST",
    "SUPPORTED",
    "VllmVersion",
    "at_least",
    "normalize",
]
