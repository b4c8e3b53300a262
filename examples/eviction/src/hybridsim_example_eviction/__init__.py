"""An example third-party eviction policy for hybridsim (a what-if, not vLLM).

``mamba_last``: among the ``window`` oldest free cached blocks, evict the
attention blocks first (oldest first), then the Mamba states; beyond the
window, vLLM's LRU order. Install with ``pip install -e examples/eviction`` and
select it with ``cache: {eviction_policy: mamba_last}``.
"""

from __future__ import annotations

from sim.core.kv import KVCacheBlock
from sim.core.kv.eviction import free_cached_blocks
from sim.core.kv.specs import MambaSpec
from sim.core.policy.eviction import BaseEvictionPolicy


class MambaLastPolicy(BaseEvictionPolicy):
    name = "mamba_last"

    def __init__(self, window: int = 64) -> None:
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ValueError(f"mamba_last: option window must be a positive integer, got {window!r}")
        self.window = window

    def select(self, num_blocks: int) -> list[KVCacheBlock]:
        mamba = {g for g, group in enumerate(self.config.groups) if isinstance(group.spec, MambaSpec)}
        first: list[KVCacheBlock] = []
        later: list[KVCacheBlock] = []
        for i, block in enumerate(free_cached_blocks(self.pool)):
            if i == self.window:
                break
            (later if block.block_hash[1] in mamba else first).append(block)  # type: ignore[index]
        chosen = (first + later)[:num_blocks]
        taken = {b.block_id for b in chosen}
        for block in free_cached_blocks(self.pool):  # fill up in LRU order past the window
            if len(chosen) == num_blocks:
                break
            if block.block_id not in taken:
                chosen.append(block)
        return chosen
