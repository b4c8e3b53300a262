"""Mooncake traces (kvcache-ai/Mooncake FAST'25 release), one JSON object a line.

Fields: ``timestamp`` (milliseconds since the trace start), ``input_length``,
``output_length`` and ``hash_ids`` (one id per 512-token prompt block, the last
possibly partial). Block id ``h`` becomes stream ``mc:<h>`` (see
:mod:`sim.workload.traces.common`). Request ``mc<line>`` is line ``line`` of the
file; its output length is both its EOS point and its ``max_tokens``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Iterator

from sim.limits import MAX_TOKENS
from sim.workload.draft import RequestDraft
from sim.workload.errors import WorkloadError
from sim.workload.traces.common import (
    check_hash_block_size,
    expand_hash_blocks,
    int_field,
    jsonl_entries,
    open_trace,
    output_tokens,
    time_field,
    where,
)

MOONCAKE_BLOCK = 512
STREAM_PREFIX = "mc:"


def read_mooncake(path: Path, hash_block_size: int | None = None) -> Iterator[RequestDraft]:
    """The drafts of the trace, streamed line by line (nothing but the current line is held)."""
    check_hash_block_size(path, "mooncake", MOONCAKE_BLOCK, hash_block_size)
    with open_trace(path) as fh:
        yield from mooncake_drafts(jsonl_entries(fh, path), str(path))


def mooncake_drafts(entries: Iterable[tuple[int, int, dict[str, Any]]], name: str) -> Iterator[RequestDraft]:
    """The drafts of a trace's :func:`~sim.workload.traces.common.jsonl_entries` (``name``: the file's, for
    messages), each with its line number and byte offset."""
    for order, (line, offset, obj) in enumerate(entries):
        draft = mooncake_draft(name, line, obj, order)
        draft.source = (line, offset)
        yield draft


def mooncake_draft(name: str, line: int, obj: dict[str, Any], order: int) -> RequestDraft:
    """The draft of line ``line`` (the ``order``-th request of the file ``name``)."""
    loc = where(name, line)
    arrival = time_field(obj, "timestamp", loc) / 1000.0
    input_length = int_field(obj, "input_length", loc, minimum=1, maximum=MAX_TOKENS)
    out = output_tokens(obj, "output_length", loc)
    if "hash_ids" not in obj:
        raise WorkloadError(f"{loc}: missing field 'hash_ids'")
    prompt = expand_hash_blocks(STREAM_PREFIX, obj["hash_ids"], input_length, MOONCAKE_BLOCK, loc)
    return RequestDraft(f"mc{line}", arrival, prompt, out, out, order=order)
