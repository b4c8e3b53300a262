"""Chained block hashes, the prefix-cache identity of a block.

Mirrors vLLM 0.33 ``kv_cache_utils.hash_block_tokens`` /
``get_request_block_hasher``: the hash of block ``i`` covers the hash of block
``i - 1`` (or a fixed root for block 0), the block's tokens and the block's
extra keys (cache salt on the first block only; LoRA name on every block).
Only *full* blocks of ``hash_block_size`` tokens are hashed.

Differences from vLLM, on purpose:

* The hash is XXH3-64 (the ``xxhash`` library, one of vLLM's own
  ``prefix_caching_hash_algo`` choices) over a canonical byte encoding, seeded
  with the parent's hash, returned as a Python ``int`` (vLLM's default: sha256
  over a pickle, as ``bytes``). It is deterministic across processes and runs
  (no ``PYTHONHASHSEED``), and an int makes dictionary keys cheap. With 64 bits
  a collision among the ~10^7 blocks of a large replay has probability ~10^-5;
  vLLM's 64-bit ``xxhash`` option accepts the same risk.
* Tokens are described by :mod:`sim.core.tokens` runs instead of token-id tuples;
  equal tokens give equal bytes, so equal content gives equal hashes.

A cache key is ``(hash, group_id)`` (vLLM: ``BlockHashWithGroupId``), built by
:func:`group_key`; each group therefore caches and evicts on its own.
"""

from __future__ import annotations

import struct
from typing import Final, Protocol, Sequence, cast

from xxhash import xxh3_64_intdigest

from sim.core.tokens import (
    PIECE_STREAM,
    BlockPiece,
    Segment,
    StreamBlocksSegment,
    StreamSegment,
    block_contents,
    block_pieces,
    output_stream,
    stream_head,
)

BlockHash = int

#: What precedes a block's token bytes in its hash input: the content length.
_HEAD: Final = struct.Struct("<Q")

#: Parent of block 0 (vLLM's ``NONE_HASH`` from a fixed seed).
NONE_HASH: BlockHash = xxh3_64_intdigest(b"hybridsim-none-hash")


def hash_block(parent: BlockHash | None, content: bytes, extra: bytes = b"") -> BlockHash:
    """Hash of one full block given its parent's hash, token bytes and extra keys.

    XXH3-64 of ``u64 len(content) | content | extra`` (little-endian) seeded with the parent's hash
    (:data:`NONE_HASH` for block 0).
    """
    return xxh3_64_intdigest(_HEAD.pack(len(content)) + content + extra, NONE_HASH if parent is None else parent)


def encode_extra_keys(lora_name: str | None, cache_salt: str | None, block_index: int) -> bytes:
    """Extra-key bytes of a block: LoRA name on every block, cache salt on block 0 only."""
    parts = b""
    if lora_name:
        parts += b"L" + lora_name.encode() + b"\x00"
    if cache_salt and block_index == 0:
        parts += b"C" + cache_salt.encode() + b"\x00"
    return parts


def extend_block_hashes(
    hashes: list[BlockHash],
    segments: Sequence[Segment],
    num_tokens: int,
    hash_block_size: int,
    lora_name: str | None = None,
    cache_salt: str | None = None,
) -> int:
    """Append the hashes of the full blocks of ``segments[:num_tokens]`` not yet in ``hashes``.

    ``hashes`` is a request's running hash list (vLLM: ``request.block_hashes``);
    it is extended in place, never recomputed. Returns the number appended.
    """
    start_block = len(hashes)
    end_block = num_tokens // hash_block_size
    if not lora_name and not (cache_salt and start_block == 0):  # no extra keys on any of these blocks
        _chain_pieces(hashes, block_pieces(segments, start_block, end_block, hash_block_size), hash_block_size)
        return end_block - start_block
    parent = hashes[-1] if hashes else None
    contents = block_contents(segments, start_block, end_block, hash_block_size)
    for i, content in enumerate(contents, start_block):
        parent = hash_block(parent, content, encode_extra_keys(lora_name, cache_salt, i))
        hashes.append(parent)
    return end_block - start_block


def _chain_pieces(hashes: list[BlockHash], pieces: list[BlockPiece], block_size: int) -> None:
    """Append the chained hashes of these pieces' blocks, which carry no extra keys
    (:func:`hash_block` inlined: the hot path)."""
    pack = _HEAD.pack
    chained = hashes[-1] if hashes else NONE_HASH
    for piece in pieces:
        for content in piece.contents(block_size):
            chained = xxh3_64_intdigest(pack(len(content)) + content, chained)
            hashes.append(chained)


class HashedRequest(Protocol):
    """What :class:`RequestBlockHasher` reads of a request (``sim.core.request.Request`` has it)."""

    request_id: str
    block_hashes: list[BlockHash]
    lora_name: str | None
    cache_salt: str | None
    num_prompt_tokens: int

    @property
    def num_tokens(self) -> int: ...

    def segments(self) -> tuple[Segment, ...]: ...


#: What a prompt's hashes are reused under: ``(lora_name, cache_salt)`` and the first one or two stream
#: segments' ``(stream, start, length)``, flattened (plain tuples hash and compare in C).
_PrefixKey = tuple[object, ...]


class RequestBlockHasher:
    """A request's block hasher (vLLM ``get_request_block_hasher``), injected into ``Request``.

    Calling it appends the hashes of the request's full ``hash_block_size``
    blocks not yet in ``request.block_hashes``; existing hashes are never
    recomputed.

    Two simulator speed-ups, not vLLM features; the result is exactly what
    hashing every block through :func:`extend_block_hashes` gives:

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

    __slots__ = ("hash_block_size", "_prefixes")

    def __init__(self, hash_block_size: int) -> None:
        if hash_block_size < 1:
            raise ValueError(f"hash_block_size must be >= 1, got {hash_block_size}")
        self.hash_block_size = hash_block_size
        #: prefix key -> (prompt segments, block hashes) of the last request hashed with that start;
        #: the hash list is the request's own (it only grows, so its head stays valid).
        self._prefixes: dict[_PrefixKey, tuple[tuple[Segment, ...], list[BlockHash]]] = {}

    def __call__(self, request: HashedRequest) -> None:
        hashes = request.block_hashes
        block = self.hash_block_size
        done = len(hashes) * block
        if done and done >= request.num_prompt_tokens and not request.lora_name:
            num_blocks = request.num_tokens // block - len(hashes)
            if num_blocks > 0:
                head = stream_head(output_stream(request.request_id))
                piece = BlockPiece(PIECE_STREAM, num_blocks, done - request.num_prompt_tokens, head, None, b"")
                _chain_pieces(hashes, [piece], block)
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
        for key in keys:
            self._prefixes[key] = (segments, hashes)

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


def group_key(block_hash: BlockHash, group_id: int) -> tuple[BlockHash, int]:
    """The prefix-cache key of a block in one KV-cache group."""
    return (block_hash, group_id)
