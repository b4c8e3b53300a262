"""Qwen/Bailian usage traces (alibaba-edu/qwen-bailian-usagetraces-anon), one JSON object a line.

Fields, per that dataset's README: ``chat_id`` (unique per request),
``parent_chat_id`` (-1 for a conversation's first request), ``timestamp``
(seconds since the trace start, a float), ``input_length``, ``output_length``,
``type`` (text/search/image/file), ``turn`` and ``hash_ids`` (one id per
16-token prompt block). We assume, as for Mooncake, that there are
``ceil(input_length / 16)`` ids and the last block may be partial; a line that
disagrees is refused. Block id ``h`` becomes stream ``qw:<h>``.

Request ``q<chat_id>``. The parent link, turn and type go to ``metadata``; they
do not change content: a child's prompt is its own hash ids, which already
repeat the parent's blocks where the real prompts did. The parent's *generated*
tokens are not in the child's prompt (the trace holds no link between them), so
a child does not hit blocks its parent cached while decoding.
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

QWEN_BLOCK = 16
STREAM_PREFIX = "qw:"


def read_qwen(path: Path, hash_block_size: int | None = None) -> Iterator[RequestDraft]:
    """The drafts of the trace, streamed line by line (plus the set of chat ids seen, for duplicates)."""
    check_hash_block_size(path, "qwen", QWEN_BLOCK, hash_block_size)
    with open_trace(path) as fh:
        yield from qwen_drafts(jsonl_entries(fh, path), str(path))


def qwen_drafts(entries: Iterable[tuple[int, int, dict[str, Any]]], name: str) -> Iterator[RequestDraft]:
    """The drafts of a trace's :func:`~sim.workload.traces.common.jsonl_entries` (``name``: the file's, for
    messages), each with its line number and byte offset; a chat id used twice is an error."""
    seen: dict[int, int] = {}
    for order, (line, offset, obj) in enumerate(entries):
        loc = where(name, line)
        chat_id = int_field(obj, "chat_id", loc, minimum=0)
        if chat_id in seen:
            raise WorkloadError(f"{loc}: chat_id {chat_id} already used on line {seen[chat_id]}")
        seen[chat_id] = line
        draft = qwen_draft(name, line, obj, order)
        draft.source = (line, offset)
        yield draft


def qwen_draft(name: str, line: int, obj: dict[str, Any], order: int) -> RequestDraft:
    """The draft of line ``line`` (the ``order``-th request of the file ``name``)."""
    loc = where(name, line)
    chat_id = int_field(obj, "chat_id", loc, minimum=0)
    parent = int_field(obj, "parent_chat_id", loc, minimum=-1) if "parent_chat_id" in obj else -1
    arrival = time_field(obj, "timestamp", loc)
    input_length = int_field(obj, "input_length", loc, minimum=1, maximum=MAX_TOKENS)
    out = output_tokens(obj, "output_length", loc)
    if "hash_ids" not in obj:
        raise WorkloadError(f"{loc}: missing field 'hash_ids'")
    prompt = expand_hash_blocks(STREAM_PREFIX, obj["hash_ids"], input_length, QWEN_BLOCK, loc)
    metadata = {
        "chat_id": chat_id,
        "parent": None if parent < 0 else f"q{parent}",
        "turn": obj.get("turn"),
        "type": obj.get("type"),
    }
    return RequestDraft(f"q{chat_id}", arrival, prompt, out, out, order=order, metadata=metadata)
