"""Token content without per-token Python objects.

A prompt is a sequence of *segments*. A :class:`StreamSegment` names a token
stream and a half-open range of positions in it: the token at position ``p`` of
stream ``s`` is a fixed function of ``(s, p)``, so two prompts that use the same
stream range hold the same tokens and therefore share prefix blocks. An
:class:`IdsSegment` holds explicit token ids (for traces that carry them). A
:class:`StreamBlocksSegment` is a compact spelling of many consecutive
``StreamSegment(prefix + str(id), 0, block)`` (a trace's hash blocks): it holds
exactly those tokens, and :func:`basic_segments` spells it out again.

Invariants:

* Token identity is injective within a kind: ``(stream, position)`` pairs are
  distinct tokens, and explicit ids are compared by value. A stream token never
  equals an explicit id (the two kinds never share a block).
* Output tokens live in the reserved stream ``output_stream(request_id)``, which
  no prompt can name, so an output token never equals a prompt token and an
  output can only be hashed into its own request's blocks (docs/design.md §7).
* :func:`block_content` returns a *canonical* byte string for a token range:
  adjacent runs of the same stream at consecutive positions are merged, and
  adjacent explicit-id runs are concatenated, so equal tokens give equal bytes
  however the segments were cut (or whether hash blocks are spelled as one
  :class:`StreamBlocksSegment` or one :class:`StreamSegment` each).
"""

from __future__ import annotations

import struct
from array import array
from dataclasses import dataclass
from typing import Final, Sequence, Union, cast

import numpy as np

OUTPUT_STREAM_PREFIX = "\x00out:"

#: A run's trace block ids: packed int64, or a tuple of ints when one is outside int64 (:func:`packed_ids`).
BlockIds = Union["array[int]", tuple[int, ...]]


def packed_ids(ids: Sequence[int]) -> BlockIds:
    """``ids`` as a packed int64 array, or as a tuple if one of them does not fit 64 bits."""
    if type(ids) is array and ids.typecode == "q":
        return ids
    try:
        return array("q", ids)
    except OverflowError:
        return tuple(ids)


@dataclass(frozen=True, slots=True)
class StreamSegment:
    """Tokens ``stream[start : start + length]``."""

    stream: str
    start: int
    length: int

    def __post_init__(self) -> None:
        if self.length < 0 or self.start < 0:
            raise ValueError(f"segment {self.stream!r}: start and length must be >= 0")


@dataclass(frozen=True, slots=True)
class IdsSegment:
    """Explicit token ids (an int64 array, never mutated)."""

    ids: np.ndarray

    @property
    def length(self) -> int:
        return int(self.ids.shape[0])

    def __hash__(self) -> int:  # pragma: no cover - segments are not dict keys
        return hash(self.ids.tobytes())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, IdsSegment) and np.array_equal(self.ids, other.ids)


@dataclass(frozen=True, slots=True, repr=False)
class StreamBlocksSegment:
    """Consecutive blocks of distinct streams, one object for a whole run of trace hash blocks.

    Block ``k`` holds tokens ``0 .. block - 1`` of stream ``prefix + str(ids[k])``,
    except the last, which holds the first ``length - (len(ids) - 1) * block``
    (between 1 and ``block``). The tokens, and so the canonical block bytes, are
    exactly those of the ``StreamSegment`` per block that :meth:`pieces` returns.

    ``ids`` is stored as a packed int64 ``array('q')`` (8 bytes an id, not a Python int each: a 1M-request
    trace holds about 25M of them), or as a tuple when some id does not fit 64 bits; the choice depends on
    the values only, so equal ids give equal segments. Indexing either gives Python ints.
    """

    prefix: str
    ids: BlockIds
    block: int
    length: int

    def __init__(self, prefix: str, ids: Sequence[int], block: int, length: int) -> None:
        # Written out: the dataclass keeps an __init__ the class defines (it validates the ids against the length).
        n = len(ids)
        if block < 1 or n < 1 or not (n - 1) * block < length <= n * block:
            raise ValueError(f"blocks {prefix!r}: {n} ids of {block} tokens cannot hold {length} tokens")
        object.__setattr__(self, "prefix", prefix)  # frozen: the generated __init__ sets fields so too
        object.__setattr__(self, "ids", packed_ids(ids))
        object.__setattr__(self, "block", block)
        object.__setattr__(self, "length", length)

    def __hash__(self) -> int:
        return hash((self.prefix, tuple(self.ids), self.block, self.length))

    def __repr__(self) -> str:
        return f"StreamBlocksSegment(prefix={self.prefix!r}, ids={tuple(self.ids)!r}, block={self.block}, length={self.length})"

    def pieces(self) -> tuple[StreamSegment, ...]:
        """The same tokens as one ``StreamSegment`` per block."""
        prefix, block = self.prefix, self.block
        out = [StreamSegment(f"{prefix}{h}", 0, block) for h in self.ids]
        tail = self.length - (len(self.ids) - 1) * block
        if tail != block:
            out[-1] = StreamSegment(f"{prefix}{self.ids[-1]}", 0, tail)
        return tuple(out)


Segment = Union[StreamSegment, IdsSegment, StreamBlocksSegment]


def basic_segments(segments: Sequence[Segment]) -> tuple[Union[StreamSegment, IdsSegment], ...]:
    """``segments`` with every :class:`StreamBlocksSegment` spelled out as its per-block pieces (same tokens)."""
    out: list[Union[StreamSegment, IdsSegment]] = []
    for seg in segments:
        if type(seg) is StreamBlocksSegment:
            out.extend(seg.pieces())
        else:
            out.append(seg)  # type: ignore[arg-type]  # not a StreamBlocksSegment
    return tuple(out)


def output_stream(request_id: str) -> str:
    """The reserved stream of a request's generated tokens."""
    return OUTPUT_STREAM_PREFIX + request_id


def is_reserved_stream(name: str) -> bool:
    return name.startswith("\x00")


_POS: Final = struct.Struct("<qq")


#: A canonical run without the dataclass: ``(stream, start, length)`` or an int64 id array.
_Run = Union[tuple[str, int, int], np.ndarray]


def stream_head(stream: str) -> bytes:
    """The bytes that open every canonical run of ``stream`` (``b"S" + stream + b"\\0"``, UTF-8); its start
    and length follow (``_POS``, two little-endian int64)."""
    return b"S" + stream.encode() + b"\x00"


def _encode_runs(runs: list[_Run]) -> bytes:
    parts: list[bytes] = []
    for run in runs:
        if type(run) is tuple:
            stream, start, length = run
            parts.append(stream_head(stream) + _POS.pack(start, length))
        else:
            parts.append(b"T" + run.astype("<i8", copy=False).tobytes())  # type: ignore[union-attr]  # not a tuple
    return b"".join(parts)


def slice_runs(segments: Sequence[Segment], start: int, end: int) -> list[Segment]:
    """The canonical runs covering tokens ``[start, end)`` of ``segments``.

    ``segments`` must cover at least ``end`` tokens.
    """
    return [
        StreamSegment(*run) if type(run) is tuple else IdsSegment(run)  # type: ignore[arg-type]  # not a tuple
        for run in _runs_from(segments, 0, 0, start, end)[0]
    ]


def _append_stream(runs: list[_Run], stream: str, start: int, length: int) -> None:
    """Append stream tokens ``stream[start : start + length]`` to ``runs``, merging with a run they continue."""
    prev = runs[-1] if runs else None
    if type(prev) is tuple and prev[0] == stream and prev[1] + prev[2] == start:
        runs[-1] = (stream, prev[1], prev[2] + length)
    else:
        runs.append((stream, start, length))


def _runs_from(
    segments: Sequence[Segment], index: int, offset: int, start: int, end: int
) -> tuple[list[_Run], int, int]:
    """The canonical runs of tokens ``[start, end)``, scanning from ``segments[index]`` (which begins at ``offset``).

    Returns ``(runs, index, offset)`` where the returned cursor is the first
    segment that may hold tokens at or after ``end`` (so consecutive ranges
    are sliced in one pass over the segments). Adjacent pieces of one stream
    at consecutive positions merge; adjacent id arrays concatenate.
    """
    runs: list[_Run] = []
    num_segments = len(segments)
    while index < num_segments:
        seg = segments[index]
        seg_len = seg.length
        seg_end = offset + seg_len
        if seg_end <= start:
            offset = seg_end
            index += 1
            continue
        if offset >= end:
            break
        lo = (start if start > offset else offset) - offset
        hi = (end if end < seg_end else seg_end) - offset
        if type(seg) is StreamSegment:
            _append_stream(runs, seg.stream, seg.start + lo, hi - lo)
        elif type(seg) is StreamBlocksSegment:
            block = seg.block
            pos = lo
            while pos < hi:  # one piece per block touched, as the per-block segments would give
                k = pos // block
                piece_end = (k + 1) * block
                if piece_end > hi:
                    piece_end = hi
                _append_stream(runs, f"{seg.prefix}{seg.ids[k]}", pos - k * block, piece_end - pos)
                pos = piece_end
        else:
            ids = cast(IdsSegment, seg).ids[lo:hi]  # neither stream kind: an IdsSegment
            prev = runs[-1] if runs else None
            if prev is not None and type(prev) is not tuple:
                runs[-1] = np.concatenate([prev, ids])
            else:
                runs.append(ids)
        if seg_end > end:
            break  # this segment continues past ``end``: the next range starts in it
        offset = seg_end
        index += 1
    covered = sum(r[2] if type(r) is tuple else r.shape[0] for r in runs)  # type: ignore[union-attr,misc]  # not a tuple
    if covered != end - start:
        raise ValueError(f"token range [{start}, {end}) is beyond the content ({offset} tokens)")
    return runs, index, offset


def _blocks_of_run(seg: StreamBlocksSegment, start: int, num_blocks: int, block_size: int) -> list[bytes]:
    """Canonical bytes of ``num_blocks`` consecutive ``block_size``-token blocks that lie wholly in
    ``seg``, the first at its position ``start``.

    One walk over the trace blocks they touch, so each trace block's run head is
    encoded once even when two blocks share it. The runs never merge: each after
    the first starts at position 0 of its own stream.
    """
    block, prefix, ids, length = seg.block, seg.prefix, seg.ids, seg.length
    whole = _POS.pack(0, block)  # the run of a trace block covered from its first to its last token
    k_end = (start // block + 1) * block  # where the trace block holding ``pos`` ends
    head = stream_head(f"{prefix}{ids[start // block]}")
    pos = start
    out: list[bytes] = []
    for _ in range(num_blocks):
        end = pos + block_size
        parts: list[bytes] = []
        while k_end <= end:  # the trace block ends inside this block: its run stops at ``k_end``
            parts.append(head + (whole if pos == k_end - block else _POS.pack(pos - k_end + block, k_end - pos)))
            pos = k_end
            if pos < length:
                head = stream_head(f"{prefix}{ids[pos // block]}")
                k_end += block
            if pos == end:
                break
        if pos < end:  # the trace block continues past this block
            parts.append(head + _POS.pack(pos - k_end + block, end - pos))
            pos = end
        out.append(b"".join(parts))
    return out


#: :class:`BlockPiece` kinds.
PIECE_STREAM: Final = 0
PIECE_TRACE: Final = 1
PIECE_BYTES: Final = 2


class BlockPiece:
    """Consecutive full blocks whose canonical bytes follow one rule, so they can be made (or hashed) together.

    * ``PIECE_STREAM``: ``count`` blocks wholly inside one stream; block ``j`` is the single run
      ``head + _POS.pack(start + j * block_size, block_size)`` (``head`` is the stream's run head).
    * ``PIECE_TRACE``: ``count`` blocks wholly inside ``trace``, a :class:`StreamBlocksSegment`, the
      first at its position ``start`` (:func:`_blocks_of_run`).
    * ``PIECE_BYTES``: one block of any other shape, its bytes in ``content``.

    :meth:`contents` gives exactly the bytes :func:`block_content` gives for those blocks.
    """

    __slots__ = ("kind", "count", "start", "head", "trace", "content")

    def __init__(
        self, kind: int, count: int, start: int, head: bytes, trace: StreamBlocksSegment | None, content: bytes
    ) -> None:
        self.kind = kind
        self.count = count
        self.start = start
        self.head = head
        self.trace = trace
        self.content = content

    def contents(self, block_size: int) -> list[bytes]:
        """The canonical bytes of each of the piece's blocks, in order."""
        if self.kind == PIECE_STREAM:
            head, start = self.head, self.start
            return [head + _POS.pack(start + j * block_size, block_size) for j in range(self.count)]
        if self.kind == PIECE_TRACE:
            trace = self.trace
            assert trace is not None
            return _blocks_of_run(trace, self.start, self.count, block_size)
        return [self.content]


def block_pieces(segments: Sequence[Segment], start_block: int, end_block: int, block_size: int) -> list[BlockPiece]:
    """Blocks ``start_block .. end_block - 1`` of ``segments`` as :class:`BlockPiece` s, in order, in one pass."""
    out: list[BlockPiece] = []
    index = offset = 0
    num_segments = len(segments)
    head_of = -1  # index of the stream segment whose run head ``head`` is
    head = b""
    i = start_block
    while i < end_block:
        lo = i * block_size
        # Skip the segments that end before this block (as _runs_from would).
        while index < num_segments and offset + segments[index].length <= lo:
            offset += segments[index].length
            index += 1
        seg = segments[index] if index < num_segments else None
        if seg is not None:
            seg_end = offset + seg.length
            # The blocks from here that lie wholly inside this segment.
            n = min(seg_end // block_size, end_block) - i
            if n > 0 and type(seg) is StreamSegment:
                if head_of != index:
                    head_of, head = index, stream_head(seg.stream)
                out.append(BlockPiece(PIECE_STREAM, n, seg.start + lo - offset, head, None, b""))
                i += n
                continue
            if n > 0 and type(seg) is StreamBlocksSegment:
                out.append(BlockPiece(PIECE_TRACE, n, lo - offset, b"", seg, b""))
                i += n
                continue
        runs, index, offset = _runs_from(segments, index, offset, lo, lo + block_size)
        out.append(BlockPiece(PIECE_BYTES, 1, 0, b"", None, _encode_runs(runs)))
        i += 1
    return out


def block_contents(segments: Sequence[Segment], start_block: int, end_block: int, block_size: int) -> list[bytes]:
    """:func:`block_content` of blocks ``start_block .. end_block - 1``, in one pass over ``segments``."""
    out: list[bytes] = []
    for piece in block_pieces(segments, start_block, end_block, block_size):
        out.extend(piece.contents(block_size))
    return out


def block_content(segments: Sequence[Segment], start: int, end: int) -> bytes:
    """Canonical bytes of tokens ``[start, end)``: equal tokens give equal bytes."""
    return _encode_runs(_runs_from(segments, 0, 0, start, end)[0])


def total_length(segments: Sequence[Segment]) -> int:
    return sum(seg.length for seg in segments)
