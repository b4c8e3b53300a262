"""``sim.core.kv.hashing``: the block hash every golden depends on, and the plain hasher's chain
(the speed layer's shared-prefix hasher is tested against it in tests/accel/test_shared_prefix_hasher.py)."""

from __future__ import annotations

import struct

import xxhash

from sim.core.kv import hashing
from sim.core.kv.hashing import RequestBlockHasher
from sim.core.request import Request
from sim.core.tokens import StreamSegment, block_contents


def _request(rid: str, *segments, lora: str | None = None, salt: str | None = None) -> Request:
    return Request(rid, segments, max_tokens=40, lora_name=lora, cache_salt=salt)


def test_block_hash_is_xxh3_64_of_length_content_and_extra_seeded_with_the_parent():
    """The spec every golden block hash depends on (docs/kv-core.md): XXH3-64 of ``u64 len(content) |
    content | extra`` (little-endian), seeded with the parent's hash, ``NONE_HASH`` before block 0."""
    assert hashing.NONE_HASH == xxhash.xxh3_64_intdigest(b"hybridsim-none-hash")
    for parent in (None, 0, 1, 2**64 - 1):
        for content, extra in ((b"", b""), (b"x", b""), (bytes(range(256)) * 3, b"L\x00")):
            seed = hashing.NONE_HASH if parent is None else parent
            expected = xxhash.xxh3_64_intdigest(struct.pack("<Q", len(content)) + content + extra, seed)
            assert hashing.hash_block(parent, content, extra) == expected
    # the chain's hot path (no extra keys) gives hash_block's ints, block by block
    request = _request("a", StreamSegment("doc", 0, 70))
    request.set_block_hasher(RequestBlockHasher(16))
    parent = None
    for content, got in zip(block_contents(request.prompt, 0, 4, 16), request.block_hashes, strict=True):
        parent = hashing.hash_block(parent, content)
        assert got == parent
