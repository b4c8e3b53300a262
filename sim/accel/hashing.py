"""A block hasher that shares the work of common prompt starts (a speed mechanism, not vLLM).

Chosen by the engine's build with the rest of the speed layer (``fast_paths``); the core's plain
:class:`~sim.core.kv.hashing.RequestBlockHasher` hashes every block of every request.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Final, Sequence, cast

from sim.core.kv.hashing import BlockHash, HashedRequest, RequestBlockHasher, chain_pieces, extend_block_hashes
from sim.core.tokens import (
    PIECE_STREAM,
    BlockPiece,
    Segment,
    StreamBlocksSegment,
    StreamSegment,
    output_stream,
    stream_head,
)

#: How many prompt starts :class:`SharedPrefixBlockHasher` remembers (a conversation's next turn comes
#: within minutes; the Mooncake trace starts about 24 000 an hour at two keys a request).
MAX_PREFIXES: Final = 1 << 16

#: What a prompt's hashes are reused under: ``(lora_name, cache_salt)`` and the first one or two stream
#: segments' ``(stream, start, length)``, flattened (plain tuples hash and compare in C).
_PrefixKey = tuple[object, ...]


class SharedPrefixBlockHasher(RequestBlockHasher):
    """The core's :class:`~sim.core.kv.hashing.RequestBlockHasher` with less work: the same hashes
    (``tests/accel/test_shared_prefix_hasher.py``, and the plain-vs-accel differential test).

    Two simulator speed-ups, not vLLM features; the result is exactly what
    hashing every block through :func:`~sim.core.kv.hashing.extend_block_hashes` gives:

    * Prompts that start with the same segments hold the same tokens there, so
      the chained hashes of the blocks that lie wholly inside the common
      segments are equal (with the same LoRA name and cache salt). When a
      request is hashed for the first time, the hasher takes those hashes from
      the last request hashed whose prompt began with the same two segments
      (else the same first one), and hashes only the blocks after them.
      :class:`~sim.core.tokens.StreamSegment` prefixes are compared segment by
      segment; a prompt of trace hash blocks
      (:class:`~sim.core.tokens.StreamBlocksSegment`: a conversation's next turn
      repeats the ids of the turn before) is found under its first two ids and
      shares the tokens of its common leading ids.
    * Once every prompt block is hashed, the blocks left are wholly in the
      request's output stream (:func:`~sim.core.tokens.output_stream`), so they
      are hashed from their positions in it without building the segment list
      (without a LoRA name: its key goes on every block).
    """

    __slots__ = ("_prefixes",)

    def __init__(self, hash_block_size: int) -> None:
        super().__init__(hash_block_size)
        #: prefix key -> (prompt segments, block hashes) of the last request hashed with that start;
        #: the hash list is the request's own (it only grows, so its head stays valid). At most
        #: :data:`MAX_PREFIXES` keys, the least recently hashed dropped first: each holds a request's prompt and
        #: hashes, and a long trace's starts are mostly distinct (a dropped start is only hashed again).
        self._prefixes: OrderedDict[_PrefixKey, tuple[tuple[Segment, ...], list[BlockHash]]] = OrderedDict()

    def __call__(self, request: HashedRequest) -> None:
        hashes = request.block_hashes
        block = self.hash_block_size
        done = len(hashes) * block
        if done and done >= request.num_prompt_tokens and not request.lora_name:
            num_blocks = request.num_tokens // block - len(hashes)
            if num_blocks > 0:
                head = stream_head(output_stream(request.request_id))
                piece = BlockPiece(PIECE_STREAM, num_blocks, done - request.num_prompt_tokens, head, None, b"")
                chain_pieces(hashes, [piece], block)
            return
        segments = request.segments()
        keys: list[_PrefixKey] = []
        if not hashes and len(segments) > 0 and type(segments[0]) in _REUSABLE_STARTS:  # hashed for the first time
            keys = self._prefix_keys(segments, request.lora_name, request.cache_salt)
            self._reuse_prefix(hashes, segments, keys, request.num_tokens)
        extend_block_hashes(
            hashes,
            segments,
            request.num_tokens,
            block,
            request.lora_name,
            request.cache_salt,
        )
        if keys:
            prefixes = self._prefixes
            for key in keys:
                prefixes[key] = (segments, hashes)
                prefixes.move_to_end(key)
            while len(prefixes) > MAX_PREFIXES:
                prefixes.popitem(last=False)

    @staticmethod
    def _prefix_keys(segments: Sequence[Segment], lora_name: str | None, cache_salt: str | None) -> list[_PrefixKey]:
        """The keys a prompt starting with a stream or trace-blocks segment is found under, the longer first."""
        first = segments[0]
        if type(first) is StreamBlocksSegment:
            start: _PrefixKey = (lora_name, cache_salt, "blocks", first.prefix, first.block, first.ids[0])
            return [(*start, first.ids[1]), start] if len(first.ids) > 1 else [start]
        stream = cast(StreamSegment, first)
        one: _PrefixKey = (lora_name, cache_salt, stream.stream, stream.start, stream.length)
        second = segments[1] if len(segments) > 1 else None
        if type(second) is StreamSegment:
            return [(*one, second.stream, second.start, second.length), one]
        return [one]

    def _reuse_prefix(
        self, hashes: list[BlockHash], segments: Sequence[Segment], keys: list[_PrefixKey], num_tokens: int
    ) -> None:
        """Seed an empty ``hashes`` with the hashes of the blocks inside the tokens this prompt
        shares with the last prompt hashed under its longest known key."""
        entry = None
        for key in keys:
            entry = self._prefixes.get(key)
            if entry is not None:
                break
        if entry is None:
            return
        previous, previous_hashes = entry
        block = self.hash_block_size
        reuse = min(_shared_tokens(segments, previous), num_tokens) // block
        if reuse > len(previous_hashes):
            reuse = len(previous_hashes)
        hashes.extend(previous_hashes[:reuse])


#: The first-segment kinds a prompt's hashes are reused under.
_REUSABLE_STARTS: Final = (StreamSegment, StreamBlocksSegment)


def _shared_tokens(mine: Sequence[Segment], theirs: Sequence[Segment]) -> int:
    """How many leading tokens two prompts provably share: equal stream segments, then (for runs of
    trace blocks with the same stream prefix and block size) the tokens of their common leading ids,
    which are the same streams from position 0 (however long either run's last trace block is)."""
    shared = 0
    for a, b in zip(mine, theirs):
        if type(a) is StreamSegment and type(b) is StreamSegment:
            if a.stream != b.stream or a.start != b.start or a.length != b.length:
                break
            shared += a.length
            continue
        if type(a) is StreamBlocksSegment and type(b) is StreamBlocksSegment:
            if a.prefix != b.prefix or a.block != b.block:
                break
            if a.ids == b.ids and a.length == b.length:
                shared += a.length
                continue
            common = 0
            for x, y in zip(a.ids, b.ids):
                if x != y:
                    break
                common += 1
            shared += min(common * a.block, a.length, b.length)
        break
    return shared
