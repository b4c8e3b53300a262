"""Memory held per request (issue 36, class 7): a 1M-line trace must fit a bounded address space, so what a
run keeps for each request and each KV event is bounded here, measured with tracemalloc.

* Build: a Mooncake request's trace hash ids are packed int64 inside its ``StreamBlocksSegment`` (8 bytes an id;
  as a tuple of Python ints they cost 36-44 bytes each, about 1.1 KB for a 25-block prompt).
* Execute: ``steps`` and ``admissions`` numbers are packed 8 bytes each (2 and 3 rows a request).
* Execute: a run records about 35 ``kv_events`` rows per request; the recorder packs them (int32 group and block
  id, uint64 hash, a byte-code for kind and cause, a pointer to the request's own id), about 26 bytes a row
  where Python lists of ints held about 90.
"""

from __future__ import annotations

import gc
import json
import random
import tracemalloc
from pathlib import Path

from sim.core.kv.block_pool import KVEventLog
from sim.trace.recorder import Recorder
from sim.workload.traces.mooncake import read_mooncake


def _traced(build):
    """``(result, bytes the result holds)``: traced memory left allocated by ``build()``."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        result = build()
        gc.collect()
        return result, tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()


def _mooncake_lines(path: Path, conversations: int, turns: int) -> int:
    """Conversations whose turns extend the previous turn's hash ids (as the Mooncake trace does): 6 to 45 blocks."""
    rng = random.Random(7)
    next_id = 0
    n = 0
    with path.open("w") as fh:
        for c in range(conversations):
            ids: list[int] = []
            for t in range(turns):
                for _ in range(rng.randint(6, 9)):
                    ids.append(next_id)
                    next_id += 1
                length = len(ids) * 512 - rng.randint(0, 511)
                fh.write(
                    json.dumps(
                        {"timestamp": 1000 * (c + t), "input_length": length, "output_length": 50, "hash_ids": ids}
                    )
                    + "\n"
                )
                n += 1
    return n


def test_a_mooncake_request_holds_its_hash_ids_packed(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    n = _mooncake_lines(trace, conversations=400, turns=5)
    requests, held = _traced(lambda: [d.to_request() for d in read_mooncake(trace)])
    blocks = sum(len(r.prompt[0].ids) for r in requests) / n
    assert 20 < blocks < 30  # like the Mooncake conversation trace: about 25 blocks a request
    # Request, its id, segment, metadata and hash list are about 0.6 KB; the ids as Python ints would add 1.1 KB.
    assert held / n < 1000, f"{held / n:.0f} bytes per request"


def test_kv_events_are_recorded_in_a_few_bytes_a_row() -> None:
    rows = 200_000
    ids = [f"mc{i}" for i in range(rows // 35 + 1)]
    rng = random.Random(3)
    hashes = [rng.getrandbits(64) for _ in range(rows)]

    def record() -> Recorder:
        rec = Recorder(num_groups=2)
        for start in range(0, rows, 50):  # one log a step, as the engine records them
            log = KVEventLog()
            for i in range(start, start + 50):
                log.append("stored" if i % 2 else "removed", i % 2, 1000 + i % 40_000, hashes[i], ids[i // 35], "cache")
            rec.set_clock(start, start * 0.01)
            rec.record_kv_event_log(log)
        return rec

    rec, held = _traced(record)
    assert len(rec.kv_events) == rows
    assert held / rows < 40, f"{held / rows:.1f} bytes per kv_events row"


def test_step_and_admission_rows_hold_their_numbers_packed() -> None:
    """``steps`` (2 rows a request) and ``admissions`` (3) hold mostly distinct counts and times: 8 bytes each
    packed, about 36 as Python objects. A Nemotron-H-like layout with 7 groups."""
    groups, rows = 7, 20_000

    def record() -> Recorder:
        rec = Recorder(num_groups=groups)
        for i in range(rows):
            rec.set_clock(100_000 + i, i * 0.013)
            big = 1_000_000 + i
            rec.record_step(
                i * 1e-4,
                300 + i,
                400 + i,
                big,
                big + 1,
                big + 2,
                [big + g for g in range(groups)],
                [big - g for g in range(groups)],
            )
            rec.record_admission(
                request_id="r",
                prompt_tokens=big,
                hits=[big + g for g in range(groups)],
                local_tokens=big + 9,
                external_tokens=0,
                hit_diverged=False,
                fallback=False,
                policy="p",
                outcome="ok",
                lookup_seq=big * 35,
            )
        return rec

    rec, held = _traced(record)
    assert len(rec.steps) == len(rec.admissions) == rows
    # 22 step and 27 admission columns: about 8 bytes a value packed (about 1.5 KB the two rows as objects).
    assert held / rows < 600, f"{held / rows:.0f} bytes per step and admission row"


def test_step_rows_leave_memory_a_row_group_at_a_time() -> None:
    """A run records about 37 ``steps`` rows a request on the Mooncake replay (22 numbers each with 7 groups,
    about 180 bytes packed): a run holds at most one row group of them, the rest is spilled to disk
    (sim/trace/spill.py), so what it holds per step row falls as the run grows."""
    from sim.trace.spill import ArrowSpill

    groups, rows = 7, 40_000

    def record() -> Recorder:
        rec = Recorder(num_groups=groups, spill=ArrowSpill(rows=4_000))
        for i in range(rows):
            rec.set_clock(i, i * 0.013)
            big = 1_000_000 + i
            rec.record_step(i * 1e-4, 300 + i, 400 + i, big, big + 1, big + 2, [big] * groups, [big - 1] * groups)
        return rec

    rec, held = _traced(record)
    assert rec.steps.spilled + len(rec.steps) == rows
    assert held / rows < 25, f"{held / rows:.1f} bytes per steps row"


def test_kv_event_and_admission_rows_leave_memory_a_row_group_at_a_time() -> None:
    """``kv_events`` (about 35 rows a request) and ``admissions`` (about 2.4) are spilled like ``steps``: a run
    holds at most one row group of each, and the summary's eviction counts as a few counters."""
    from sim.trace.spill import ArrowSpill

    rows = 200_000
    ids = [f"mc{i}" for i in range(rows // 35 + 1)]
    rng = random.Random(3)
    hashes = [rng.getrandbits(64) for _ in range(rows)]

    def record() -> Recorder:
        rec = Recorder(num_groups=2, spill=ArrowSpill(rows=4_000))
        for start in range(0, rows, 50):
            log = KVEventLog()
            for i in range(start, start + 50):
                log.append("stored" if i % 2 else "removed", i % 2, 1000 + i % 40_000, hashes[i], ids[i // 35], "cache")
            rec.set_clock(start, start * 0.01)
            rec.record_kv_event_log(log)
            rec.record_admission(
                request_id=ids[start // 35],
                prompt_tokens=1_000_000 + start,
                hits=[start, start + 1],
                local_tokens=start,
                external_tokens=0,
                hit_diverged=False,
                fallback=False,
                policy="p",
                outcome="ok",
                lookup_seq=start,
            )
        return rec

    rec, held = _traced(record)
    assert len(rec.kv_events) == rows and rec.kv_events.spilled == rows - rows % 4_000
    assert rec.admissions.spilled + len(rec.admissions) == rows // 50 and rec.admissions.spilled
    assert rec.kv_events.removed_spilled == {(0, "cache"): rows // 2}
    assert held / rows < 5, f"{held / rows:.1f} bytes per kv_events row"


def test_a_retired_request_holds_only_its_counts(tmp_path: Path) -> None:
    """A finished request lets its prompt segments and block hashes go (``Request.retire``): what stays is the
    request object, its id and its counts (for its ``requests`` row)."""
    from sim.core.kv.hashing import RequestBlockHasher

    trace = tmp_path / "trace.jsonl"
    n = _mooncake_lines(trace, conversations=200, turns=5)
    hasher = RequestBlockHasher(16)

    def build_and_retire() -> list:
        requests = [d.to_request() for d in read_mooncake(trace)]
        for request in requests:
            request.set_block_hasher(hasher)
            assert len(request.block_hashes) > 100  # 16-token blocks: several hundred hashes a prompt
            request.retire()
        return requests

    requests, held = _traced(build_and_retire)
    assert all(r.prompt == () and r.num_prompt_tokens > 0 for r in requests)
    # about 450 bytes (the object, its id, metadata dict and counts); whole it held its prompt and ~20 KB of hashes
    assert held / n < 600, f"{held / n:.0f} bytes per retired request"
