"""The compiled build's C chained hashing (``sim.native._chainhash``) gives exactly the Python code's hashes.

Needs the compiled build (``hybridsim native build``): without a fresh one these
tests skip, unless ``HYBRIDSIM_REQUIRE_NATIVE=1`` (CI), where they fail. Each test
hashes through both backends of the one seam (``chain=``: None for the Python code,
the C extension) and compares.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import random
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from sim.core.kv.hashing import NONE_HASH, extend_block_hashes
from sim.core.tokens import IdsSegment, Segment, StreamBlocksSegment, StreamSegment, block_pieces
from sim.native import decide, read_manifest


@pytest.fixture(scope="module")
def chainhash() -> ModuleType:
    status = decide(read_manifest(), env={})
    if not status.compiled:
        if os.environ.get("HYBRIDSIM_REQUIRE_NATIVE") == "1":
            pytest.fail(f"HYBRIDSIM_REQUIRE_NATIVE=1 but {status.reason}")
        pytest.skip(status.reason)
    return importlib.import_module("sim.native._chainhash")


def test_digest_is_blake2b_64_little_endian_at_every_length(chainhash: ModuleType) -> None:
    rng = random.Random(3)
    # every length around the 128-byte block boundaries, where the final-block handling differs
    for n in [*range(0, 300), 383, 384, 385, 4096]:
        data = rng.randbytes(n)
        assert chainhash.digest(data) == int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little"), n


def _random_segments(rng: random.Random) -> list[Segment]:
    """Stream, trace-block and explicit-id segments, with the id forms the C side formats itself
    (negative, 64-bit and beyond) and non-ASCII stream names."""
    out: list[Segment] = []
    for _ in range(rng.randint(1, 6)):
        roll = rng.random()
        if roll < 0.35:
            n = rng.randint(1, 5)
            ids = tuple(
                rng.choice([rng.randint(0, 9), rng.randint(-5, 5), 2**63 + rng.randint(0, 9), 10**30, -(2**70)])
                for _ in range(n)
            )
            block = rng.randint(1, 9)
            out.append(
                StreamBlocksSegment(
                    rng.choice(["", "mc:", "é/"]), ids, block, rng.randint((n - 1) * block + 1, n * block)
                )
            )
        elif roll < 0.8:
            out.append(
                StreamSegment(rng.choice(["a", "sys", "\x00out:r1", "日本"]), rng.randint(0, 40), rng.randint(1, 30))
            )
        else:
            out.append(IdsSegment(np.array([rng.randint(0, 9) for _ in range(rng.randint(1, 9))], dtype=np.int64)))
    return out


def test_every_piece_shape_hashes_alike_in_c_and_python(chainhash: ModuleType) -> None:
    rng = random.Random(20261202)
    kinds_seen: set[int] = set()
    checked = 0
    for _ in range(1500):
        segments = _random_segments(rng)
        total = sum(s.length for s in segments)
        bs = rng.randint(1, 12)
        if total < bs:
            continue
        # hash in two calls, as a request does (prompt, then more blocks), from a random first block
        first = rng.randint(0, total // bs)
        kinds_seen.update(p.kind for p in block_pieces(segments, 0, total // bs, bs))
        results = []
        for backend in (None, chainhash):
            hashes: list[int] = []
            extend_block_hashes(hashes, segments, first * bs, bs, chain=backend)
            extend_block_hashes(hashes, segments, total, bs, chain=backend)
            results.append(hashes)
        assert results[0] == results[1]
        assert len(results[0]) == total // bs
        checked += 1
    assert checked > 1000 and kinds_seen == {0, 1, 2}


def test_bad_arguments_raise_instead_of_hashing(chainhash: ModuleType) -> None:
    hashes: list[int] = []
    with pytest.raises(ValueError, match="outside the run"):
        chainhash.chain_trace(hashes, NONE_HASH, b"p", (1, 2), 4, 8, 4, 2, 4)  # blocks past the run's 8 tokens
    with pytest.raises(TypeError, match="ids must be ints"):
        chainhash.chain_trace(hashes, NONE_HASH, b"p", ("1",), 4, 4, 0, 1, 4)
    with pytest.raises(TypeError, match="list of bytes"):
        chainhash.chain_bytes(hashes, NONE_HASH, ["text"])
    with pytest.raises(OverflowError):
        chainhash.chain_stream(hashes, -1, b"Sa\x00", 0, 1, 4)
    assert hashes == []


def test_a_compiled_run_hashes_through_the_c_extension(chainhash: ModuleType) -> None:
    """The engine hands the C hasher to the scheduler in a compiled process (and only then)."""
    probe = (
        "from sim.config import load_scenario; from sim.engine.build import build_components; "
        "c = build_components(load_scenario('benchmarks/scenarios/step-fa-1000.yaml')); "
        "print(c.scheduler._block_hasher.chain)"
    )
    root = Path(__file__).resolve().parents[2]
    for switch, expected in (("1", "sim.native._chainhash"), ("0", "None")):
        done = subprocess.run(
            [sys.executable, "-c", probe],
            env={**os.environ, "HYBRIDSIM_NATIVE": switch},
            cwd=root,
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        assert expected in done.stdout.strip().splitlines()[-1]
