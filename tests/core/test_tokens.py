"""Canonical block bytes: the one-pass block walk equals a per-token reference encoding."""

import random
import struct
from array import array

import numpy as np
import pytest

from sim.core.tokens import (
    IdsSegment,
    StreamBlocksSegment,
    StreamSegment,
    basic_segments,
    block_content,
    block_contents,
    slice_runs,
)


def _reference_bytes(segments, start: int, end: int) -> bytes:
    """Expand to one entry per token, then merge runs: the definition of the canonical encoding."""
    tokens = []
    for seg in segments:
        if isinstance(seg, StreamSegment):
            tokens += [("S", seg.stream, seg.start + i) for i in range(seg.length)]
        elif isinstance(seg, StreamBlocksSegment):  # block k: stream prefix+ids[k] from position 0
            tokens += [("S", f"{seg.prefix}{seg.ids[i // seg.block]}", i % seg.block) for i in range(seg.length)]
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


def _random_blocks(rng: random.Random) -> StreamBlocksSegment:
    """A run of hash blocks; ids repeat (and can name streams "a"/"b" with prefix "") so pieces may merge."""
    block = rng.randint(1, 5)
    ids = tuple(rng.randint(0, 3) for _ in range(rng.randint(1, 4)))
    return StreamBlocksSegment(
        rng.choice(["", "h:"]), ids, block, rng.randint((len(ids) - 1) * block + 1, len(ids) * block)
    )


def _random_segments(rng: random.Random, ids_share: float = 0.3, blocks_share: float = 0.0):
    segments = []
    for _ in range(rng.randint(1, 8)):
        if rng.random() < ids_share:
            segments.append(IdsSegment(np.array([rng.randint(0, 5) for _ in range(rng.randint(1, 7))], dtype=np.int64)))
        elif rng.random() < blocks_share:
            segments.append(_random_blocks(rng))
        elif rng.random() < blocks_share:  # a stream a run's block may continue or be continued by
            segments.append(StreamSegment(str(rng.randint(0, 3)), rng.randint(0, 3), rng.randint(1, 7)))
        else:
            segments.append(StreamSegment(rng.choice("ab"), rng.randint(0, 3), rng.randint(1, 7)))
    return segments


@pytest.mark.parametrize(
    "ids_share,blocks_share",
    [(0.3, 0.0), (0.0, 0.0), (0.3, 0.4), (0.0, 0.5)],  # ids_share 0.0: stream kinds only (block_contents' own path)
)
def test_block_contents_equal_reference_encoding(ids_share, blocks_share):
    rng = random.Random(7)
    checked = 0
    for _ in range(1500):
        segments = _random_segments(rng, ids_share, blocks_share)
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


def test_blocks_segment_has_the_tokens_of_one_stream_segment_per_block():
    """The compact spelling of trace hash blocks gives the bytes (so the hashes) of the per-block one."""
    rng = random.Random(11)
    checked = 0
    for _ in range(600):
        before = (
            [StreamSegment(rng.choice(["h:1", "x"]), rng.randint(0, 2), rng.randint(1, 4))]
            if rng.random() < 0.5
            else []
        )
        run = _random_blocks(rng)
        compact = [*before, run]
        spelled = [*before, *run.pieces()]
        assert basic_segments(compact) == tuple(spelled)
        total = sum(s.length for s in spelled)
        assert sum(s.length for s in compact) == total
        for bs in range(1, 7):  # sizes below, equal to and spanning several trace blocks
            for first in range(0, total // bs):
                assert list(block_contents(compact, first, total // bs, bs)) == list(
                    block_contents(spelled, first, total // bs, bs)
                )
                checked += 1
        lo = rng.randint(0, total - 1)
        hi = rng.randint(lo + 1, total)
        assert slice_runs(compact, lo, hi) == slice_runs(spelled, lo, hi)
        assert block_content(compact, lo, hi) == block_content(spelled, lo, hi)
    assert checked > 1000


def test_blocks_segment_pieces_and_bounds():
    run = StreamBlocksSegment("mc:", (4, 4, 9), 512, 1100)
    assert run.pieces() == (StreamSegment("mc:4", 0, 512), StreamSegment("mc:4", 0, 512), StreamSegment("mc:9", 0, 76))
    assert StreamBlocksSegment("mc:", (4,), 512, 512).pieces() == (StreamSegment("mc:4", 0, 512),)
    # A repeated id is the same tokens again, not a continuation: two blocks, never one merged run.
    assert slice_runs([run], 0, 1024) == [StreamSegment("mc:4", 0, 512), StreamSegment("mc:4", 0, 512)]
    for ids, length in [((1, 2), 1024 + 1), ((1, 2), 512), ((), 0)]:
        with pytest.raises(ValueError, match="cannot hold"):
            StreamBlocksSegment("mc:", ids, 512, length)


def test_blocks_segment_written_init_keeps_the_dataclass():
    """The hand-written __init__ sets the same fields as the generated one: keywords, equality, hash, frozen."""
    import dataclasses

    run = StreamBlocksSegment(prefix="mc:", ids=(4, 9), block=512, length=600)
    assert run == StreamBlocksSegment("mc:", (4, 9), 512, 600) and hash(run) == hash(
        StreamBlocksSegment("mc:", (4, 9), 512, 600)
    )
    assert run != StreamBlocksSegment("mc:", (4, 9), 512, 601)
    assert dataclasses.astuple(run) == ("mc:", array("q", [4, 9]), 512, 600)
    assert repr(run) == "StreamBlocksSegment(prefix='mc:', ids=(4, 9), block=512, length=600)"
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.length = 1  # type: ignore[misc]
    assert dataclasses.replace(run, length=1024) == StreamBlocksSegment("mc:", (4, 9), 512, 1024)


def test_blocks_segment_packs_ids_into_int64():
    """Trace ids are held as 8 bytes each (a 1M-line trace has ~25M of them), not as Python ints; an id
    outside int64 keeps the tuple, and the tokens are the same either way."""
    run = StreamBlocksSegment("mc:", [4, 2**63 - 1], 512, 600)
    assert type(run.ids) is array and run.ids.itemsize == 8 and list(run.ids) == [4, 2**63 - 1]
    big = StreamBlocksSegment("mc:", [4, 2**64], 512, 600)
    assert big.ids == (4, 2**64) and big.pieces()[1] == StreamSegment(f"mc:{2**64}", 0, 88)
    assert block_content([big], 0, 600) == block_content(list(big.pieces()), 0, 600)
    assert hash(run) != hash(big) and run != big
