"""A request before the workload options are applied.

Every source (script, generator, trace reader) yields drafts; the options
(:mod:`sim.workload.options`) filter and re-time them, and only the survivors
become :class:`sim.core.request.Request` objects. ``order`` is the source's own
order (script position, generation order, trace line) and breaks arrival-time
ties, so the final sort is total and stable.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sim.core.request import Request
from sim.core.tokens import Segment


@dataclass(slots=True)
class RequestDraft:
    request_id: str
    arrival: float
    prompt: tuple[Segment, ...]
    max_tokens: int
    output_len: int
    order: int
    priority: int = 0
    lora_name: str | None = None
    cache_salt: str | None = None
    metadata: dict = field(default_factory=dict)
    #: ``(line number, byte offset)`` of the JSONL trace line it was read from (``None``: not read from one),
    #: where a streamed workload (:mod:`sim.workload.stream`) reads the line again when its request is made.
    source: tuple[int, int] | None = None

    def to_request(self) -> Request:
        return Request(
            self.request_id,
            self.prompt,
            self.max_tokens,
            self.arrival,
            output_len=self.output_len,
            priority=self.priority,
            lora_name=self.lora_name,
            cache_salt=self.cache_salt,
            metadata=self.metadata,
        )
