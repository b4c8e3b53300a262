"""Shared pieces of the trace readers: line iteration, field checks, hash-block expansion.

Hash-block expansion (shared/traces/README.md): a trace that gives one id per
``trace_block`` prompt tokens is turned into token content without any
per-token work. Block ``k`` with id ``h`` holds the tokens of
``StreamSegment(prefix + h, 0, trace_block)``; the last block may be partial and
then covers only the first ``input_length - k * trace_block`` positions of its
stream. A request's blocks are held by one ``StreamBlocksSegment``
(:mod:`sim.core.tokens`), which has exactly those tokens. Equal ids give
equal streams, so blocks shared in the trace stay shared at every hash block
size. A size that does not divide ``trace_block`` is refused unless the trace
spec sets ``allow_merged_blocks: false`` (default true; the README asks to refuse merging trace
blocks; our content is exact per token, so a block spanning several trace
blocks is still well defined and shared exactly when its tokens are).
"""

from __future__ import annotations

import json
import re
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO, Final, Iterator

import orjson

from sim.core.tokens import StreamBlocksSegment
from sim.inputfile import InputFileError, bounded_lines, open_input
from sim.limits import MAX_INT, MAX_TIME_S, MAX_TOKENS
from sim.workload.errors import WorkloadError


@contextmanager
def open_trace(path: Path) -> Iterator[BinaryIO]:
    """The trace file opened for reading through :mod:`sim.inputfile` (a regular file, checked before it is
    opened); its errors, and those of :func:`sim.inputfile.bounded_lines` inside the block, are
    :class:`WorkloadError`."""
    try:
        with open_input(path, "trace file") as (fh, _):
            yield fh
    except InputFileError as exc:
        raise WorkloadError(str(exc)) from None


def excerpt(value: Any, width: int = 24) -> str:
    """A short escaped excerpt of an offending token for an error message (never a whole line of the file)."""
    if not isinstance(value, str):
        text = repr(value)
        return text[:width] + ("..." if len(text) > width else "")
    return repr(value[:width]) + ("..." if len(value) > width else "")


#: A run of 19 digits: an integer orjson would turn into a float (json.loads keeps every int exact), so such a
#: line goes to json.loads.
_LONG_DIGITS: Final = re.compile(rb"[0-9]{19}")


def _json_line(raw: bytes) -> Any:
    """``json.loads(raw)``: parsed by orjson, or by json.loads for what orjson refuses or would read otherwise.

    On every line orjson parses without a 19-digit run, it gives json.loads' object (the same keys in the
    same order, the same types: a repeated key keeps the last value); it refuses NaN, infinities, lone
    surrogates, a BOM or UTF-16/32 text and nesting deeper than 1024, which json.loads then accepts or words
    the error for, as before. Raises json.loads' errors (JSONDecodeError, UnicodeDecodeError, RecursionError).
    """
    if _LONG_DIGITS.search(raw) is None:
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            pass
    if raw.startswith(b"{") and raw[1:2] != b"\x00":
        # Such a line has no BOM and is not UTF-16/32, so json.loads(raw) would detect UTF-8 and decode it
        # just so; its detection costs about as much as the parse.
        return json.loads(raw.decode("utf-8", "surrogatepass"))
    return json.loads(raw)


def jsonl_objects(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, object)`` for each non-blank line, streamed (one line in memory at a time).

    Bad JSON, bad UTF-8 or nesting too deep raise ``FILE:LINE``; more objects than the ``requests`` limit
    and a line longer than the ``line_bytes`` limit (:mod:`sim.limits`) raise too, before memory runs out.
    Lines are parsed by orjson, the same objects as ``json.loads`` gives (:func:`_json_line`).
    """
    with open_trace(path) as fh:
        for line_no, _, obj in jsonl_entries(fh, path):
            yield line_no, obj


def jsonl_entries(fh: BinaryIO, path: Path) -> Iterator[tuple[int, int, dict[str, Any]]]:
    """``(line number, byte offset of the line, object)`` for each non-blank line of the open trace ``fh``
    (read from its start), with :func:`jsonl_objects`' checks; :func:`jsonl_line` parses one line again."""
    from sim.limits import limit, over

    cap = limit("requests")
    count = 0
    offset = 0
    try:
        for line_no, raw in bounded_lines(fh, path, "trace file"):
            at, offset = offset, offset + len(raw)
            if not raw.strip():
                continue
            obj = _parsed(raw, path, line_no)
            count += 1
            if count > cap:
                raise WorkloadError(f"{path}:{line_no}: " + over("requests", count, "the trace has more requests"))
            yield line_no, at, obj
    except InputFileError as exc:
        raise WorkloadError(str(exc)) from None


def jsonl_line(fh: BinaryIO, path: Path, line_no: int, offset: int) -> dict[str, Any]:
    """The object of line ``line_no`` at byte ``offset`` of the open trace ``fh``, parsed as
    :func:`jsonl_entries` parsed it."""
    from sim.limits import limit

    fh.seek(offset)
    return _parsed(fh.readline(limit("line_bytes") + 1), path, line_no)


def _parsed(raw: bytes, path: Path, line_no: int) -> dict[str, Any]:
    try:
        obj = _json_line(raw)
    except json.JSONDecodeError as exc:
        raise WorkloadError(f"{path}:{line_no}: invalid JSON ({exc.msg})") from None
    except UnicodeDecodeError as exc:
        raise WorkloadError(f"{path}:{line_no}: not UTF-8 text (byte {exc.start} of the line)") from None
    except RecursionError:
        raise WorkloadError(f"{path}:{line_no}: JSON nested too deeply") from None
    if not isinstance(obj, dict):
        raise WorkloadError(f"{path}:{line_no}: expected a JSON object, got {type(obj).__name__}")
    return obj


def where(path: Path | str, line: int) -> str:
    return f"{path}:{line}"


def int_field(obj: dict[str, Any], key: str, loc: str, minimum: int = 0, maximum: int = MAX_INT) -> int:
    """An integer field from ``minimum`` to ``maximum`` (a float with an integral value is accepted)."""
    if key not in obj:
        raise WorkloadError(f"{loc}: missing field '{key}'")
    value = obj[key]
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool):
        raise WorkloadError(f"{loc}: '{key}' must be an integer, got {excerpt(value)}")
    if not minimum <= value <= maximum:
        raise WorkloadError(f"{loc}: '{key}' must be from {minimum} to {maximum}, got {excerpt(value)}")
    return value


def time_field(obj: dict[str, Any], key: str, loc: str) -> float:
    """A finite, non-negative number."""
    if key not in obj:
        raise WorkloadError(f"{loc}: missing field '{key}'")
    value = obj[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= MAX_TIME_S * 1000:
        raise WorkloadError(
            f"{loc}: '{key}' must be a finite number >= 0 (and <= {MAX_TIME_S * 1000:g}), got {excerpt(value)}"
        )
    return float(value)


def output_tokens(obj: dict[str, Any], key: str, loc: str) -> int:
    """The output length; 0 becomes 1 (a request always generates at least one token)."""
    return max(1, int_field(obj, key, loc, minimum=0, maximum=MAX_TOKENS))


def check_hash_block_size(path: Path, fmt: str, trace_block: int, hash_block_size: int | None) -> None:
    if hash_block_size is None:
        return
    if hash_block_size < 1 or trace_block % hash_block_size:
        divisors = [d for d in range(1, trace_block + 1) if trace_block % d == 0 and d >= 8]
        raise WorkloadError(
            f"{path}: a {fmt} trace identifies content in {trace_block}-token blocks; the hash block "
            f"size {hash_block_size} does not divide {trace_block}, so its blocks would merge trace "
            f"blocks, which is not sound. Use a hash block size that divides {trace_block} "
            f"(e.g. {', '.join(map(str, divisors))}), or drop 'allow_merged_blocks: false' from the trace "
            "to accept blocks that span several trace blocks."
        )


def expand_hash_blocks(
    prefix: str, hash_ids: Any, input_length: int, trace_block: int, loc: str
) -> tuple[StreamBlocksSegment]:
    """Prompt segments of a request given as trace hash ids (see the module docstring).

    One :class:`StreamBlocksSegment` holds all the blocks: the same tokens as one
    ``StreamSegment`` per block, without an object (and a stream name) per block.
    """
    if not isinstance(hash_ids, list):
        raise WorkloadError(f"{loc}: 'hash_ids' must be a list of integers")
    expected = -(-input_length // trace_block)
    if len(hash_ids) != expected:
        raise WorkloadError(
            f"{loc}: {len(hash_ids)} hash_ids for input_length {input_length}; expected "
            f"ceil({input_length}/{trace_block}) = {expected}"
        )
    for h in hash_ids:
        if type(h) is not int:  # JSON gives exact ints; a bool or float is refused
            raise WorkloadError(f"{loc}: 'hash_ids' must hold integers, got {h!r}")
    # The segment packs the ids into int64 (8 bytes each): the parsed list and its ints are dropped with the line.
    return (StreamBlocksSegment(prefix, hash_ids, trace_block, input_length),)
