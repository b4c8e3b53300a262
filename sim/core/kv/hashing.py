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
from typing import Final, Protocol, Sequence

from xxhash import xxh3_64_intdigest

from sim.core.tokens import (
    BlockPiece,
    Segment,
    block_contents,
    block_pieces,
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
        chain_pieces(hashes, block_pieces(segments, start_block, end_block, hash_block_size), hash_block_size)
        return end_block - start_block
    parent = hashes[-1] if hashes else None
    contents = block_contents(segments, start_block, end_block, hash_block_size)
    for i, content in enumerate(contents, start_block):
        parent = hash_block(parent, content, encode_extra_keys(lora_name, cache_salt, i))
        hashes.append(parent)
    return end_block - start_block


def chain_pieces(hashes: list[BlockHash], pieces: list[BlockPiece], block_size: int) -> None:
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


class RequestBlockHasher:
    """A request's block hasher (vLLM ``get_request_block_hasher``), injected into ``Request``.

    Calling it appends the hashes of the request's full ``hash_block_size``
    blocks not yet in ``request.block_hashes`` (:func:`extend_block_hashes`);
    existing hashes are never recomputed. The speed layer's
    :class:`sim.accel.hashing.SharedPrefixBlockHasher` gets the same hashes
    with less work.
    """

    __slots__ = ("hash_block_size",)

    def __init__(self, hash_block_size: int) -> None:
        if hash_block_size < 1:
            raise ValueError(f"hash_block_size must be >= 1, got {hash_block_size}")
        self.hash_block_size = hash_block_size

    def __call__(self, request: HashedRequest) -> None:
        extend_block_hashes(
            request.block_hashes,
            request.segments(),
            request.num_tokens,
            self.hash_block_size,
            request.lora_name,
            request.cache_salt,
        )


def group_key(block_hash: BlockHash, group_id: int) -> tuple[BlockHash, int]:
    """The prefix-cache key of a block in one KV-cache group."""
    return (block_hash, group_id)
