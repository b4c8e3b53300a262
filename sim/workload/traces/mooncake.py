"""Mooncake traces (kvcache-ai/Mooncake FAST'25 release), one JSON object a line.

Fields: ``timestamp`` (milliseconds since the trace start), ``input_length``,
``output_length`` and ``hash_ids`` (one id per 512-token prompt block, the last
possibly partial). Block id ``h`` becomes stream ``mc:<h>`` (see
:mod:`sim.workload.traces.common`). Request ``mc<line>`` is line ``line`` of the
file; its output length is both its EOS point and its ``max_tokens``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

from sim.limits import MAX_TOKENS
from sim.workload.draft import RequestDraft
from sim.workload.errors import WorkloadError
from sim.workload.traces.common import (
    check_hash_block_size,
    expand_hash_blocks,
    int_field,
    jsonl_objects,
    output_tokens,
    time_field,
    where,
)

MOONCAKE_BLOCK = 512
STREAM_PREFIX = "mc:"


def read_mooncake(path: Path, hash_block_size: int | None = None) -> Iterator[RequestDraft]:
    """The drafts of the trace, streamed line by line (nothing but the current line is held)."""
    check_hash_block_size(path, "mooncake", MOONCAKE_BLOCK, hash_block_size)
    name = str(path)  # once: a Path's str() per line cost more than the rest of the location
    for order, (line, obj) in enumerate(jsonl_objects(path)):
        loc = where(name, line)
        arrival = time_field(obj, "timestamp", loc) / 1000.0
        input_length = int_field(obj, "input_length", loc, minimum=1, maximum=MAX_TOKENS)
        out = output_tokens(obj, "output_length", loc)
        if "hash_ids" not in obj:
            raise WorkloadError(f"{loc}: missing field 'hash_ids'")
        prompt = expand_hash_blocks(STREAM_PREFIX, obj["hash_ids"], input_length, MOONCAKE_BLOCK, loc)
        yield RequestDraft(f"mc{line}", arrival, prompt, out, out, order=order)
