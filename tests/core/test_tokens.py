"""Canonical block bytes: the one-pass block walk equals a per-token reference encoding."""

import random
import struct

import numpy as np
import pytest

from sim.core.tokens import IdsSegment, StreamSegment, block_content, block_contents, slice_runs


def _reference_bytes(segments, start: int, end: int) -> bytes:
    """Expand to one entry per token, then merge runs: the definition of the canonical encoding."""
    tokens = []
    for seg in segments:
        if isinstance(seg, StreamSegment):
            tokens += [("S", seg.stream, seg.start + i) for i in range(seg.length)]
        else:
            tokens += [("T", None, int(v)) for v in seg.ids]
    parts, i = [], start
    while i < end:
        kind, stream, pos = tokens[i]
        j = i + 1
        if kind == "S":
            while j < end and tokens[j][0] == "S" and tokens[j][1] == stream and tokens[j][2] == pos + (j - i):
                j += 1
            parts.append(b"S" + stream.encode() + b"\x00" + struct.pack("<qq", pos, j - i))
        else:
            while j < end and tokens[j][0] == "T":
                j += 1
            parts.append(b"T" + np.array([t[2] for t in tokens[i:j]], dtype="<i8").tobytes())
        i = j
    return b"".join(parts)


def _random_segments(rng: random.Random, ids_share: float = 0.3):
    segments = []
    for _ in range(rng.randint(1, 8)):
        if rng.random() < ids_share:
            segments.append(IdsSegment(np.array([rng.randint(0, 5) for _ in range(rng.randint(1, 7))], dtype=np.int64)))
        else:
            segments.append(StreamSegment(rng.choice("ab"), rng.randint(0, 3), rng.randint(1, 7)))
    return segments


@pytest.mark.parametrize("ids_share", [0.3, 0.0])  # 0.0: stream segments only (block_contents' own path)
def test_block_contents_equal_reference_encoding(ids_share):
    rng = random.Random(7)
    checked = 0
    for _ in range(1500):
        segments = _random_segments(rng, ids_share)
        total = sum(s.length for s in segments)
        bs = rng.randint(1, 6)
        if total < bs:
            continue
        first = rng.randint(0, total // bs - 1)
        got = list(block_contents(segments, first, total // bs, bs))
        want = [_reference_bytes(segments, i * bs, (i + 1) * bs) for i in range(first, total // bs)]
        assert got == want
        assert got == [block_content(segments, i * bs, (i + 1) * bs) for i in range(first, total // bs)]
        checked += 1
    assert checked > 1000


def test_runs_merge_across_segment_cuts_and_reject_short_content():
    segments = [
        StreamSegment("a", 0, 3),
        StreamSegment("a", 3, 2),
        IdsSegment(np.array([7, 8])),
        IdsSegment(np.array([9])),
    ]
    runs = slice_runs(segments, 1, 8)
    assert runs[0] == StreamSegment("a", 1, 4)
    assert isinstance(runs[1], IdsSegment) and runs[1].ids.tolist() == [7, 8, 9]
    with pytest.raises(ValueError, match=r"token range \[6, 9\) is beyond the content \(8 tokens\)"):
        block_content(segments, 6, 9)
