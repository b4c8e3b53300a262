"""A copyable third-party connector: a store that always holds a shared system prompt.

Every request whose prompt starts with ``prefix_tokens`` tokens of the stream
``content`` can load that prefix from the store, in whole blocks, at most
``num_tokens - 1`` tokens, synchronously (no transfer; the load is part of the
step). It keeps nothing else and never delays a free.
"""

from __future__ import annotations

from typing import Any

from sim.connector.base import KVConnector
from sim.core.request import Request
from sim.core.tokens import StreamSegment


class SystemPromptConnector(KVConnector):
    name = "system_prompt"
    supports_hma = True

    def __init__(self, content: str, prefix_tokens: int) -> None:
        if not isinstance(prefix_tokens, int) or prefix_tokens < 1:
            raise ValueError(f"connector.prefix_tokens: expected a positive token count, got {prefix_tokens!r}")
        self.content = content
        self.prefix_tokens = prefix_tokens
        self.queries = 0
        self.hit_tokens = 0

    def _holds_prefix(self, request: Request) -> bool:
        first = request.prompt[0]
        return isinstance(first, StreamSegment) and first.stream == self.content and first.start == 0 and first.length >= self.prefix_tokens

    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> tuple[int | None, bool]:
        self.queries += 1
        if not self._holds_prefix(request):
            return 0, False
        block = self.ctx.scheduler_block_size if self.ctx is not None else 1
        held = min(self.prefix_tokens, request.num_tokens - 1)
        held -= held % block
        ext = max(0, held - num_computed_tokens)
        self.hit_tokens += ext
        return ext, False

    def metrics(self) -> dict[str, Any]:
        return {"queries": self.queries, "hit_tokens": self.hit_tokens}

    def step_columns(self) -> dict[str, float | int]:
        return {}
