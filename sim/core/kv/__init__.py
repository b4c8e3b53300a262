"""The block-level KV-cache core (mirrors vLLM 0.33 ``vllm/v1/core``); pure Python, no clock."""

from sim.core.kv.block_pool import BlockPool, FreeKVCacheBlockQueue, KVCacheBlock, KVEvent
from sim.core.kv.kv_cache_coordinator import (
    HybridKVCacheCoordinator,
    KVCacheCoordinator,
    KVCacheCoordinatorNoPrefixCache,
    UnitaryKVCacheCoordinator,
    get_kv_cache_coordinator,
)
from sim.core.kv.kv_cache_manager import KVCacheBlocks, KVCacheManager, check_invariants
from sim.core.kv.single_type_kv_cache_manager import (
    FullAttentionManager,
    MambaManager,
    SingleTypeKVCacheManager,
    SlidingWindowManager,
)
from sim.core.kv.specs import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    MambaSpec,
    SlidingWindowSpec,
    kv_cache_config_from_groups,
    kv_cache_config_from_model,
)

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
