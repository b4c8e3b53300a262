"""A streamed trace workload: each request is made when the engine takes it, from its line read again.

A run of a long trace must not hold every request before it arrives (about 1.2 KB each: the object, its id,
its packed hash ids). :func:`stream_trace` reads a JSONL hash-block trace (Mooncake, Qwen) once, in full,
with every check and limit of the eager reader (each line parsed, its draft made and dropped, the options
applied in source order with the same random draws), and keeps only six numbers a request (48 bytes): its
arrival after the options, its line number, source order and byte offset, its prompt and output lengths.
:class:`StreamedTrace` then holds the kept requests in ``(arrival, source order)`` order, as the eager
workload sorts them, and :meth:`StreamedTrace.take` makes request ``i`` from its line on demand, so the
requests not yet taken cost 48 bytes each.

Invariants:

* ``take(i)`` is the request the eager workload (:func:`sim.workload.build.build_requests` without
  ``stream``) has at position ``i``: same line, same draft function, same arrival (the float the options
  computed, stored as it was), so a run's tables are byte-identical either way.
* The lines are read again from the file handle the first pass read (a file replaced by a rename is not
  seen); a file whose size or modification time changed since, or a line whose prompt length differs from
  the first pass's, is an error (:class:`~sim.workload.errors.WorkloadError`), never a different request.
* Request ids are unique without a set of them: a Mooncake id is its line number, a Qwen id its chat id,
  which the reader refuses twice.
"""

from __future__ import annotations

import os
import weakref
from array import array
from contextlib import ExitStack
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterable, Iterator

import numpy as np

from sim.core.request import Request
from sim.core.tokens import total_length
from sim.workload.draft import RequestDraft
from sim.workload.errors import WorkloadError
from sim.workload.options import retimed
from sim.workload.spec import WorkloadSpec

#: ``(file name, line number, object, source order) -> draft`` of one line.
DraftOf = Callable[[str, int, dict[str, Any], int], RequestDraft]
#: ``(entries, file name) -> drafts`` of a whole file (with the reader's checks across lines).
DraftsOf = Callable[[Iterable[tuple[int, int, dict[str, Any]]], str], Iterator[RequestDraft]]

#: The trace formats that stream: JSONL with one request a line and no state across lines but the checks.
STREAMED_FORMATS = ("mooncake", "qwen")


def streams(spec: WorkloadSpec) -> bool:
    """Whether :func:`stream_trace` takes this workload: a Mooncake or Qwen trace without sessions (a
    session's turns are linked through their prompts, which the first pass does not keep)."""
    return spec.trace is not None and spec.trace.format in STREAMED_FORMATS and spec.sessions is None


class _Source:
    """The open trace file the first pass read, and how to make a draft of one of its lines."""

    def __init__(self, stack: ExitStack, fh: BinaryIO, path: Path, draft_of: DraftOf) -> None:
        self.fh = fh
        self.path = path
        self.name = str(path)
        self.draft_of = draft_of
        st = os.fstat(fh.fileno())
        self.stamp = (st.st_size, st.st_mtime_ns)
        weakref.finalize(self, stack.close)

    def draft(self, line: int, offset: int, order: int) -> RequestDraft:
        from sim.workload.traces.common import jsonl_line

        st = os.fstat(self.fh.fileno())
        if (st.st_size, st.st_mtime_ns) != self.stamp:
            raise WorkloadError(f"{self.path}: the trace file changed while the run was reading it")
        return self.draft_of(self.name, line, jsonl_line(self.fh, self.path, line, offset), order)


class StreamedTrace:
    """The kept requests of a streamed trace, in ``(arrival, source order)`` order (see the module
    docstring). ``arrival``, ``prompt_tokens`` and ``output_len`` are NumPy columns, one value a request."""

    def __init__(self, source: _Source, columns: dict[str, np.ndarray]) -> None:
        self._source = source
        self._columns = columns
        self.arrival: np.ndarray = columns["arrival"]
        self.prompt_tokens: np.ndarray = columns["prompt_tokens"]
        self.output_len: np.ndarray = columns["output_len"]

    def __len__(self) -> int:
        return len(self.arrival)

    def arrival_time(self, i: int) -> float:
        return float(self.arrival[i])

    def take(self, i: int) -> Request:
        """Request ``i``, made now from its line (a new object at each call)."""
        c = self._columns
        draft = self._source.draft(int(c["line"][i]), int(c["offset"][i]), int(c["order"][i]))
        draft.arrival = float(self.arrival[i])
        request = draft.to_request()
        if request.num_prompt_tokens != self.prompt_tokens[i]:
            raise WorkloadError(f"{self._source.path}: the trace file changed while the run was reading it")
        return request

    def __iter__(self) -> Iterator[Request]:
        """Every request, made one at a time (for the few readers of a whole workload)."""
        return map(self.take, range(len(self)))

    def subset(self, keep: np.ndarray) -> StreamedTrace:
        """The requests where the boolean ``keep`` is true, in the same order (the same file)."""
        return StreamedTrace(self._source, {name: column[keep] for name, column in self._columns.items()})


def stream_trace(
    spec: WorkloadSpec, base_dir: Path, rng: np.random.Generator, clock: str, hash_block_size: int | None
) -> StreamedTrace:
    """The workload of a trace that :func:`streams`, read once (see the module docstring): the options
    applied as :func:`sim.workload.options.apply_options` applies them (``rng`` drawn in source order)."""
    from sim.workload.traces.common import check_hash_block_size, jsonl_entries, open_trace

    trace = spec.trace
    assert trace is not None and trace.format in STREAMED_FORMATS
    path = Path(base_dir) / trace.path
    drafts_of, draft_of, block = _format(trace.format)
    check_hash_block_size(path, trace.format, block, None if trace.allow_merged_blocks else hash_block_size)
    stack = ExitStack()
    try:
        fh = stack.enter_context(open_trace(path))
        arrival, ints = array("d"), {name: array("q") for name in ("line", "order", "offset", "prompt", "out")}
        line, order, offset, prompt, out = (ints[n].append for n in ("line", "order", "offset", "prompt", "out"))
        for draft in retimed(drafts_of(jsonl_entries(fh, path), str(path)), spec, rng, clock):
            assert draft.source is not None
            arrival.append(draft.arrival)
            line(draft.source[0])
            order(draft.order)
            offset(draft.source[1])
            prompt(total_length(draft.prompt))
            out(min(draft.output_len, draft.max_tokens))
        source = _Source(stack, fh, path, draft_of)
    except BaseException:
        stack.close()
        raise
    keys = np.frombuffer(arrival, dtype=np.float64) if arrival else np.zeros(0)
    perm = np.argsort(keys, kind="stable")  # ties in source order: the eager sort's (arrival, order)
    if spec.limit is not None:
        perm = perm[: spec.limit]
    columns: dict[str, np.ndarray] = {"arrival": keys[perm]}
    names = {"line": "line", "order": "order", "offset": "offset", "prompt": "prompt_tokens", "out": "output_len"}
    for name, values in ints.items():
        column = np.frombuffer(values, dtype=np.int64) if values else np.zeros(0, dtype=np.int64)
        columns[names[name]] = column[perm]
    return StreamedTrace(source, columns)


def _format(fmt: str) -> tuple[DraftsOf, DraftOf, int]:
    if fmt == "mooncake":
        from sim.workload.traces.mooncake import MOONCAKE_BLOCK, mooncake_draft, mooncake_drafts

        return mooncake_drafts, mooncake_draft, MOONCAKE_BLOCK
    from sim.workload.traces.qwen import QWEN_BLOCK, qwen_draft, qwen_drafts

    return qwen_drafts, qwen_draft, QWEN_BLOCK
