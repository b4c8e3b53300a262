"""The router's view of one instance's prefix cache, built from the KV events it publishes.

An instance publishes its ``kv_events`` (stored / removed / cleared per group and block hash) as it runs;
the view applies each event ``delay`` after it happened (seconds on the time clock, steps on the step
clock), so a router can be studied with a stale view, as a real KV-event subscriber (Dynamo's KV router,
llm-d's precise prefix-cache scorer) sees one.

Invariant: after :meth:`KVCacheView.advance` to time ``t`` the view holds, per group, exactly the cache
entries the instance held at time ``t - delay`` (an entry counted once per block that holds it: equal
content in two blocks is two entries, and it stays visible until both are removed).
"""

from __future__ import annotations

from collections import deque
from typing import Sequence

from sim.trace.recorder import KVEventColumns


class KVCacheView:
    """Cached block hashes per group, as published ``delay`` ago."""

    def __init__(self, num_groups: int, delay: float) -> None:
        self.delay = delay
        self._entries: list[dict[int, int]] = [{} for _ in range(num_groups)]
        #: Published but not yet visible: ``(time, kind, group, hash)`` in publication order.
        self._pending: deque[tuple[float, str, int, int]] = deque()

    def publish(self, log: KVEventColumns, now: float) -> None:
        """The instance's events recorded at time ``now``."""
        for kind, group, block_hash in zip(log.kind, log.group, log.block_hash):
            self._pending.append((now, kind, group, block_hash))

    def advance(self, now: float) -> None:
        """Apply every event published at or before ``now - delay``."""
        horizon = now - self.delay
        pending = self._pending
        while pending and pending[0][0] <= horizon:
            _, kind, group, block_hash = pending.popleft()
            entries = self._entries[group]
            if kind == "stored":
                entries[block_hash] = entries.get(block_hash, 0) + 1
            elif kind == "removed":
                left = entries.get(block_hash, 0) - 1
                if left > 0:
                    entries[block_hash] = left
                else:
                    entries.pop(block_hash, None)
            elif kind == "cleared":
                for table in self._entries:
                    table.clear()

    def holds(self, group: int, block_hash: int) -> bool:
        """Whether ``group`` holds an entry for ``block_hash`` in the view."""
        return block_hash in self._entries[group]

    def prefix_blocks(self, group: int, hashes: Sequence[int]) -> int:
        """How many leading blocks of ``hashes`` (the group's block hashes of a prompt) the group holds."""
        entries = self._entries[group]
        n = 0
        for block_hash in hashes:
            if block_hash not in entries:
                break
            n += 1
        return n
