"""Azure LLM inference traces (Azure/AzurePublicDataset, 2023/2024), CSV.

Columns: ``TIMESTAMP`` (a datetime such as ``2023-11-16 18:15:46.6805900``,
or a number of seconds), ``ContextTokens``, ``GeneratedTokens``; other columns
are ignored. Times are rebased so the earliest row is at 0. The trace carries
no content, so nothing is shared: request ``az<line>`` gets its own stream
``az:<line>``.
"""

from __future__ import annotations

import csv
import io
from datetime import datetime, timezone
from pathlib import Path

from sim.core.tokens import StreamSegment
from sim.limits import MAX_TOKENS
from sim.workload.draft import RequestDraft
from sim.workload.errors import WorkloadError
from sim.workload.traces.common import excerpt, int_field, open_trace, output_tokens, where

COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


def parse_timestamp(text: str) -> float:
    """Seconds since the epoch (UTC) of a datetime with up to 9 fractional digits, or a number."""
    text = text.strip()
    try:
        return float(text)
    except ValueError:
        pass
    main, _, frac = text.partition(".")
    stamp = datetime.fromisoformat(main)
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=timezone.utc)
    seconds = stamp.timestamp()
    if frac:
        if not frac.isdigit():
            raise ValueError(f"bad fractional seconds {frac!r}")
        seconds += int(frac) / 10 ** len(frac)
    return seconds


def read_azure(path: Path) -> list[RequestDraft]:
    try:
        return _read_azure(path)
    except UnicodeDecodeError as exc:
        raise WorkloadError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    except csv.Error as exc:  # e.g. a field longer than the csv module's limit (128 KiB)
        raise WorkloadError(f"{path}: not a CSV trace ({exc})") from None


def _read_azure(path: Path) -> list[RequestDraft]:
    from sim.limits import limit, over

    cap = limit("requests")
    rows: list[tuple[int, float, int, int]] = []
    with open_trace(path) as raw, io.TextIOWrapper(raw, encoding="utf-8", newline="") as fh:
        reader = csv.reader(fh)
        header = next(reader, None)
        if header is None:
            raise WorkloadError(f"{path}:1: empty file; expected a header {','.join(COLUMNS)}")
        header = [h.strip() for h in header]
        missing = [c for c in COLUMNS if c not in header]
        if missing:
            raise WorkloadError(
                f"{path}:1: missing column(s) {', '.join(missing)}; the header has "
                f"{len(header)} other column(s); expected {','.join(COLUMNS)}"
            )
        index = {c: header.index(c) for c in COLUMNS}
        for line, row in enumerate(reader, start=2):
            if not row or not any(cell.strip() for cell in row):
                continue
            loc = where(path, line)
            if len(row) != len(header):
                raise WorkloadError(f"{loc}: {len(row)} fields, the header has {len(header)}")
            fields = {c: row[i].strip() for c, i in index.items()}
            try:
                stamp = parse_timestamp(fields["TIMESTAMP"])
                if not abs(stamp) <= 1e12:  # also NaN and inf
                    raise ValueError("out of range")
            except (ValueError, OverflowError):
                raise WorkloadError(
                    f"{loc}: TIMESTAMP: cannot parse {excerpt(fields['TIMESTAMP'])} (a datetime or a number of seconds)"
                ) from None
            numbers = {}
            for c in COLUMNS[1:]:
                try:
                    numbers[c] = int(fields[c])
                except ValueError:
                    raise WorkloadError(f"{loc}: {c}: expected an integer, got {excerpt(fields[c])}") from None
            if len(rows) >= cap:
                raise WorkloadError(f"{loc}: " + over("requests", len(rows) + 1, "the trace has more requests"))
            context = int_field(numbers, "ContextTokens", loc, minimum=1, maximum=MAX_TOKENS)
            generated = output_tokens(numbers, "GeneratedTokens", loc)
            rows.append((line, stamp, context, generated))
    if not rows:
        return []
    origin = min(r[1] for r in rows)
    return [
        RequestDraft(f"az{line}", stamp - origin, (StreamSegment(f"az:{line}", 0, context),), out, out, order=i)
        for i, (line, stamp, context, out) in enumerate(rows)
    ]
