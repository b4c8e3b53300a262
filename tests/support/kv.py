"""Small builders shared by the cache-core tests."""

from __future__ import annotations

from sim.core.kv.block_pool import KVEvent, KVEventLog
from sim.core.kv.hashing import RequestBlockHasher
from sim.core.kv.kv_cache_manager import KVCacheManager
from sim.core.kv.specs import kv_cache_config_from_groups
from sim.core.request import Request
from sim.core.tokens import StreamSegment


def make_request(rid: str, *segments: tuple[str, int], block_size: int = 16, max_tokens: int = 1) -> Request:
    """A request whose prompt is the given ``(stream, tokens)`` runs, each from position 0."""
    req = Request(rid, [StreamSegment(s, 0, n) for s, n in segments], max_tokens)
    req.set_block_hasher(RequestBlockHasher(block_size))
    return req


def make_manager(groups, num_blocks: int, block_size: int = 16, retention_interval=None, **kw) -> KVCacheManager:
    """As vLLM's unit tests: explicit groups, dense retention unless given."""
    config = kv_cache_config_from_groups(
        groups, block_size=block_size, num_blocks=num_blocks, retention_interval=retention_interval
    )
    return KVCacheManager(config, **kw)


def ids(blocks) -> tuple[list[int], ...]:
    return blocks.get_block_ids()


def event_log(*events: KVEvent) -> KVEventLog:
    """A pool's event log holding ``events``, in order (what the recorder is given)."""
    log = KVEventLog()
    log.extend(events)
    return log
