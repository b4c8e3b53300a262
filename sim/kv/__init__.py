"""The block-level KV-cache core (mirrors vLLM 0.33 ``vllm/v1/core``); pure Python, no clock."""

_EXPORTS = {
    "BlockPool": "sim.kv.pool",
    "FreeKVCacheBlockQueue": "sim.kv.pool",
    "FullAttentionManager": "sim.kv.managers",
    "FullAttentionSpec": "sim.kv.specs",
    "HybridKVCacheCoordinator": "sim.kv.coordinator",
    "KVCacheBlock": "sim.kv.pool",
    "KVCacheBlocks": "sim.kv.manager",
    "KVCacheConfig": "sim.kv.specs",
    "KVCacheCoordinator": "sim.kv.coordinator",
    "KVCacheCoordinatorNoPrefixCache": "sim.kv.coordinator",
    "KVCacheGroupSpec": "sim.kv.specs",
    "KVCacheManager": "sim.kv.manager",
    "KVEvent": "sim.kv.pool",
    "MambaManager": "sim.kv.managers",
    "MambaSpec": "sim.kv.specs",
    "SingleTypeKVCacheManager": "sim.kv.managers",
    "SlidingWindowManager": "sim.kv.managers",
    "SlidingWindowSpec": "sim.kv.specs",
    "UnitaryKVCacheCoordinator": "sim.kv.coordinator",
    "check_invariants": "sim.kv.manager",
    "get_kv_cache_coordinator": "sim.kv.coordinator",
    "kv_cache_config_from_groups": "sim.kv.specs",
    "kv_cache_config_from_model": "sim.kv.specs",
}

__all__ = [
    "BlockPool",
    "FreeKVCacheBlockQueue",
    "FullAttentionManager",
    "FullAttentionSpec",
    "HybridKVCacheCoordinator",
    "KVCacheBlock",
    "KVCacheBlocks",
    "KVCacheConfig",
    "KVCacheCoordinator",
    "KVCacheCoordinatorNoPrefixCache",
    "KVCacheGroupSpec",
    "KVCacheManager",
    "KVEvent",
    "MambaManager",
    "MambaSpec",
    "SingleTypeKVCacheManager",
    "SlidingWindowManager",
    "SlidingWindowSpec",
    "UnitaryKVCacheCoordinator",
    "check_invariants",
    "get_kv_cache_coordinator",
    "kv_cache_config_from_groups",
    "kv_cache_config_from_model",
]


def __getattr__(name: str):
    """Import the public names lazily: ``sim.request`` imports ``sim.kv.hashing``, and the
    coordinator imports ``sim.request``, so eager imports here would form a cycle."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'sim.kv' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
