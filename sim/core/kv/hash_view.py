"""A request's block hashes seen at a KV-cache group's (coarser) block size.

``Request.block_hashes`` is computed at the hash block size (the GCD of the
group block sizes). A group whose blocks are ``k`` hash blocks long keys its
block ``i`` with fine hash ``k * (i + 1) - 1``: hashes are chained, so the hash
at the last hash-block boundary inside a block fingerprints the whole prefix up
to the block's end (vLLM ``BlockHashListWithBlockSize``, chosen by
``resolve_block_hashes``; one rule for every group).

The view is lazy and holds the request's own list, which only grows, so it
never goes stale and costs O(1) to build: lookups and caching index it
directly instead of copying a coarse list per call.
"""

from __future__ import annotations

from typing import Sequence, cast

from sim.core.kv.hashing import BlockHash
from sim.core.kv.specs import KVCacheConfig


class BlockHashesAtBlockSize:
    """``hashes`` (at ``hash_block_size``) indexed in blocks of ``block_size``."""

    __slots__ = ("_hashes", "_ratio")

    def __init__(self, hashes: Sequence[BlockHash], hash_block_size: int, block_size: int) -> None:
        if block_size % hash_block_size:
            raise ValueError(f"block size {block_size} is not a multiple of the hash block size {hash_block_size}")
        self._hashes = hashes
        self._ratio = block_size // hash_block_size

    def __len__(self) -> int:
        """Full blocks of ``block_size`` covered by the hashes so far."""
        return len(self._hashes) // self._ratio

    def __getitem__(self, index: int) -> BlockHash:
        if not 0 <= index < len(self):
            raise IndexError(f"block {index} is beyond the {len(self)} hashed blocks")
        return self._hashes[(index + 1) * self._ratio - 1]


def block_hashes_at(hashes: Sequence[BlockHash], hash_block_size: int, block_size: int) -> Sequence[BlockHash]:
    """``hashes`` itself when the sizes agree (the common case), else the lazy view.

    Callers use the result as a read-only sequence through ``len`` and integer
    indexing only, which is all the view implements (hence the cast).
    """
    if block_size == hash_block_size:
        return hashes
    return cast(Sequence[BlockHash], BlockHashesAtBlockSize(hashes, hash_block_size, block_size))


def cached_block_hashes(hashes: Sequence[BlockHash], config: KVCacheConfig, block_size: int) -> Sequence[BlockHash]:
    """The hashes under which a group of ``block_size`` can hold a request's blocks in the cache.

    With prefix caching off nothing is ever cached, so there are none; vLLM
    then also hashes at the scheduler block size (the LCM of the group block
    sizes, not their GCD), which a smaller group's blocks cannot be viewed at.
    """
    if not config.enable_prefix_caching:
        return ()
    return block_hashes_at(hashes, config.hash_block_size, block_size)
