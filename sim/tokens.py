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
from typing import Sequence, Union

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


def _encode_runs(runs: list[Segment]) -> bytes:
    parts: list[bytes] = []
    for run in runs:
        if isinstance(run, StreamSegment):
            parts.append(b"S" + run.stream.encode() + b"\x00" + _POS.pack(run.start, run.length))
        else:
            parts.append(b"T" + run.ids.astype("<i8", copy=False).tobytes())
    return b"".join(parts)


def slice_runs(segments: Sequence[Segment], start: int, end: int) -> list[Segment]:
    """The canonical runs covering tokens ``[start, end)`` of ``segments``.

    ``segments`` must cover at least ``end`` tokens.
    """
    runs: list[Segment] = []
    offset = 0
    for seg in segments:
        seg_len = seg.length
        seg_end = offset + seg_len
        if seg_end <= start:
            offset = seg_end
            continue
        if offset >= end:
            break
        lo = max(start, offset) - offset
        hi = min(end, seg_end) - offset
        if isinstance(seg, StreamSegment):
            piece: Segment = StreamSegment(seg.stream, seg.start + lo, hi - lo)
            prev = runs[-1] if runs else None
            if (
                isinstance(prev, StreamSegment)
                and prev.stream == seg.stream
                and prev.start + prev.length == piece.start
            ):
                runs[-1] = StreamSegment(prev.stream, prev.start, prev.length + piece.length)
            else:
                runs.append(piece)
        else:
            ids = seg.ids[lo:hi]
            prev = runs[-1] if runs else None
            if isinstance(prev, IdsSegment):
                runs[-1] = IdsSegment(np.concatenate([prev.ids, ids]))
            else:
                runs.append(IdsSegment(ids))
        offset = seg_end
    covered = sum(r.length for r in runs)
    if covered != end - start:
        raise ValueError(f"token range [{start}, {end}) is beyond the content ({offset} tokens)")
    return runs


def block_content(segments: Sequence[Segment], start: int, end: int) -> bytes:
    """Canonical bytes of tokens ``[start, end)``: equal tokens give equal bytes."""
    return _encode_runs(slice_runs(segments, start, end))


def total_length(segments: Sequence[Segment]) -> int:
    return sum(seg.length for seg in segments)
