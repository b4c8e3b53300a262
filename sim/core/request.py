"""A request as the scheduler and the cache core see it (vLLM ``v1/request.py``).

Pure data plus the few derived quantities the core needs. Token content is a
tuple of :mod:`sim.core.tokens` segments; generated tokens are counted, not stored,
and live in the request's reserved output stream.

Invariants:

* ``num_tokens == num_prompt_tokens + num_output_tokens``.
* ``0 <= num_computed_tokens <= num_tokens``.
* ``block_hashes`` holds exactly the hashes of the full ``hash_block_size``
  blocks of the first ``num_tokens`` tokens once :meth:`update_block_hashes`
  has run (with the hasher bound by :meth:`set_block_hasher`); it only grows (vLLM appends hashes as output tokens arrive).
"""

from __future__ import annotations

import enum
from typing import Protocol, Sequence

from sim.core.tokens import Segment, StreamSegment, output_stream, total_length

#: A block hash (a 64-bit int; see :mod:`sim.core.kv.hashing`).
BlockHash = int


class BlockHasher(Protocol):
    """Extends a request's ``block_hashes`` with the hashes of its newly full blocks.

    Injected into the request by the scheduler (vLLM passes ``block_hasher``
    to ``Request``), so this module does not depend on the cache core;
    :class:`sim.core.kv.hashing.RequestBlockHasher` is the implementation.
    """

    @property
    def hash_block_size(self) -> int: ...

    def __call__(self, request: Request) -> None: ...


class RequestStatus(enum.IntEnum):
    """Lifecycle states we model (subset of vLLM's ``RequestStatus``)."""

    WAITING = enum.auto()
    WAITING_FOR_REMOTE_KVS = enum.auto()
    RUNNING = enum.auto()
    PREEMPTED = enum.auto()
    FINISHED_STOPPED = enum.auto()
    FINISHED_LENGTH_CAPPED = enum.auto()
    FINISHED_ABORTED = enum.auto()
    FINISHED_ERROR = enum.auto()

    @property
    def is_finished(self) -> bool:
        return self >= RequestStatus.FINISHED_STOPPED


class Request:
    """One inference request: prompt segments, output budget, scheduling state."""

    __slots__ = (
        "request_id",
        "prompt",
        "num_prompt_tokens",
        "max_tokens",
        "output_len",
        "arrival_time",
        "priority",
        "lora_name",
        "cache_salt",
        "status",
        "num_computed_tokens",
        "num_output_tokens",
        "block_hashes",
        "shared_prefix_boundary",
        "extra_state_positions",
        "num_preemptions",
        "prefix_cache_hit_limit",
        "num_in_flight_tokens",
        "num_cached_tokens",
        "num_external_computed_tokens",
        "metadata",
        "hash_block_size",
        "_block_hasher",
    )

    def __init__(
        self,
        request_id: str,
        prompt: Sequence[Segment],
        max_tokens: int,
        arrival_time: float = 0.0,
        *,
        output_len: int | None = None,
        priority: int = 0,
        lora_name: str | None = None,
        cache_salt: str | None = None,
        metadata: dict[str, object] | None = None,
    ) -> None:
        if max_tokens < 1:
            raise ValueError(f"request {request_id}: max_tokens must be >= 1")
        self.request_id = request_id
        self.prompt: tuple[Segment, ...] = tuple(prompt)
        self.num_prompt_tokens = total_length(self.prompt)
        if self.num_prompt_tokens < 1:
            raise ValueError(f"request {request_id}: empty prompt")
        self.max_tokens = max_tokens
        #: Tokens the request will generate before stopping (EOS or max_tokens).
        self.output_len = max_tokens if output_len is None else min(output_len, max_tokens)
        self.arrival_time = arrival_time
        self.priority = priority
        self.lora_name = lora_name
        self.cache_salt = cache_salt
        self.status = RequestStatus.WAITING
        self.num_computed_tokens = 0
        self.num_output_tokens = 0
        self.block_hashes: list[BlockHash] = []
        self.shared_prefix_boundary = 0
        #: Where a what-if checkpoint placement (sim.core.policy.checkpoint) has this prefill save extra
        #: Mamba states, sorted; set at each admission that looks the prefix up; () under vLLM's placement.
        self.extra_state_positions: tuple[int, ...] = ()
        self.num_preemptions = 0
        #: Leading tokens that may be read from the prefix cache (vLLM 0.34 ``Request.prefix_cache_hit_limit``,
        #: which replaced 0.33's ``skip_reading_prefix_cache``): ``None`` unbounded, ``0`` no cache read (0.33's
        #: ``skip_reading_prefix_cache=True``), ``N`` a hit of at most N tokens and no external KV.
        self.prefix_cache_hit_limit: int | None = None
        self.num_in_flight_tokens = 0
        #: Prefix-cache hit tokens at the first admission (-1 until admitted).
        self.num_cached_tokens = -1
        self.num_external_computed_tokens = 0
        self.metadata: dict[str, object] = metadata or {}
        #: Granularity of ``block_hashes`` (0 until the engine binds it); read-only outside this class.
        self.hash_block_size = 0
        self._block_hasher: BlockHasher | None = None

    @property
    def num_tokens(self) -> int:
        return self.num_prompt_tokens + self.num_output_tokens

    @property
    def num_tokens_with_spec(self) -> int:
        return self.num_tokens

    def segments(self) -> tuple[Segment, ...]:
        """All token content: the prompt, then the generated tokens so far."""
        if self.num_output_tokens == 0:
            return self.prompt
        return self.prompt + (StreamSegment(output_stream(self.request_id), 0, self.num_output_tokens),)

    def set_block_hasher(self, hasher: BlockHasher) -> None:
        """Bind the block hasher (once, by the scheduler) and hash the prompt."""
        self._block_hasher = hasher
        self.hash_block_size = hasher.hash_block_size
        self.block_hashes = []
        self.update_block_hashes()

    def update_block_hashes(self) -> None:
        """Hash any newly completed full blocks (with the injected block hasher)."""
        hbs = self.hash_block_size
        if hbs and (self.num_prompt_tokens + self.num_output_tokens) // hbs > len(self.block_hashes):
            assert self._block_hasher is not None
            self._block_hasher(self)

    def append_output_tokens(self, n: int) -> None:
        """Record ``n`` generated tokens and hash blocks they complete."""
        self.num_output_tokens += n
        self.update_block_hashes()

    def retire(self) -> None:
        """Let go of what only a running request needs (its prompt's segments, block hashes and hasher), once
        it has finished and nothing will read them again: a long run holds every request it was given, and
        these are most of one. The counts (prompt and output tokens, hits, preemptions) stay."""
        self.prompt = ()
        self.block_hashes = []
        self._block_hasher = None

    def get_max_cache_hit_length(self, bound: int | None = None) -> int:
        """The longest prefix-cache hit allowed: ``num_tokens - 1`` (the last token is always recomputed),
        tightened by :attr:`prefix_cache_hit_limit` and by ``bound`` when given (vLLM 0.34)."""
        limit = self.num_prompt_tokens + self.num_output_tokens - 1
        if self.prefix_cache_hit_limit is not None and self.prefix_cache_hit_limit < limit:
            limit = self.prefix_cache_hit_limit
        return bound if bound is not None and bound < limit else limit

    @property
    def skip_reading_external_kv(self) -> bool:
        """A hit-limited request reads no KV from a connector (its hits are not bounded by the limit)."""
        return self.prefix_cache_hit_limit is not None

    def is_finished(self) -> bool:
        return self.status.is_finished

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id!r}, prompt={self.num_prompt_tokens}, "
            f"out={self.num_output_tokens}/{self.output_len}, computed={self.num_computed_tokens}, "
            f"{self.status.name})"
        )
