"""Token content without per-token Python objects.

A prompt is a sequence of *segments*. A :class:`StreamSegment` names a token
stream and a half-open range of positions in it: the token at position ``p`` of
stream ``s`` is a fixed function of ``(s, p)``, so two prompts that use the same
stream range hold the same tokens and therefore share prefix blocks. An
:class:`IdsSegment` holds explicit token ids (for traces that carry them).

Invariants:

* Token identity is injective within a kind: ``(stream, position)`` pairs are
  distinct tokens, and explicit ids are compared by value. A stream token never
  equals an explicit id (the two kinds never share a block).
* Output tokens live in the reserved stream ``output_stream(request_id)``, which
  no prompt can name, so an output token never equals a prompt token and an
  output can only be hashed into its own request's blocks (DESIGN.md §6).
* :func:`block_content` returns a *canonical* byte string for a token range:
  adjacent runs of the same stream at consecutive positions are merged, and
  adjacent explicit-id runs are concatenated, so equal tokens give equal bytes
  however the segments were cut.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Iterator, Sequence, Union

import numpy as np

OUTPUT_STREAM_PREFIX = "\x00out:"


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


Segment = Union[StreamSegment, IdsSegment]


def output_stream(request_id: str) -> str:
    """The reserved stream of a request's generated tokens."""
    return OUTPUT_STREAM_PREFIX + request_id


def is_reserved_stream(name: str) -> bool:
    return name.startswith("\x00")


_POS = struct.Struct("<qq")


#: A canonical run without the dataclass: ``(stream, start, length)`` or an int64 id array.
_Run = Union[tuple[str, int, int], np.ndarray]


def _encode_runs(runs: list[_Run]) -> bytes:
    parts: list[bytes] = []
    for run in runs:
        if type(run) is tuple:
            stream, start, length = run
            parts.append(b"S" + stream.encode() + b"\x00" + _POS.pack(start, length))
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
        prev = runs[-1] if runs else None
        if type(seg) is StreamSegment:
            stream = seg.stream
            piece_start = seg.start + lo
            if type(prev) is tuple and prev[0] == stream and prev[1] + prev[2] == piece_start:
                runs[-1] = (stream, prev[1], prev[2] + hi - lo)
            else:
                runs.append((stream, piece_start, hi - lo))
        else:
            ids = seg.ids[lo:hi]  # type: ignore[union-attr]  # `type(seg) is StreamSegment` failed above
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


def block_contents(segments: Sequence[Segment], start_block: int, end_block: int, block_size: int) -> Iterator[bytes]:
    """:func:`block_content` of blocks ``start_block .. end_block - 1``, in one pass over ``segments``."""
    index = offset = 0
    num_segments = len(segments)
    for i in range(start_block, end_block):
        lo = i * block_size
        hi = lo + block_size
        # Skip the segments that end before this block (as _runs_from would).
        while index < num_segments and offset + segments[index].length <= lo:
            offset += segments[index].length
            index += 1
        seg = segments[index] if index < num_segments else None
        if type(seg) is StreamSegment and offset + seg.length >= hi:
            # The block lies inside one stream segment: it is a single canonical run.
            yield b"S" + seg.stream.encode() + b"\x00" + _POS.pack(seg.start + lo - offset, block_size)
            continue
        runs, index, offset = _runs_from(segments, index, offset, lo, hi)
        yield _encode_runs(runs)


def block_content(segments: Sequence[Segment], start: int, end: int) -> bytes:
    """Canonical bytes of tokens ``[start, end)``: equal tokens give equal bytes."""
    return _encode_runs(_runs_from(segments, 0, 0, start, end)[0])


def total_length(segments: Sequence[Segment]) -> int:
    return sum(seg.length for seg in segments)
