"""A long run's ``steps`` rows kept on disk while it runs, as the Arrow tables the bundle writer would make.

A run records one ``steps`` row per engine step: on the Mooncake replay about 37 a request, 22 numbers each
with Nemotron-H's 7 groups (about 180 bytes a row packed), so a million requests would hold about 6.5 GB of
them. :class:`ArrowSpill` takes them out of the recorder :data:`~sim.trace.schema.ROW_GROUP_ROWS` rows at a
time: each group is made its Arrow table (:func:`~sim.trace.schema.arrow_table`, the conversion the whole
table would get) and appended, zstd-compressed, to an anonymous temporary file (``tempfile.TemporaryFile``:
unlinked at once, so nothing is left behind if the run is killed). The bundle writer reads the groups back one
at a time (:meth:`ArrowSpill.batches`), one Parquet row group each, so the bundle's bytes are those of the
table written whole.

Invariants: a table is spilled only while every column has a declared dtype (a connector's extension
columns infer theirs from all values, so such a table stays whole in memory); spilled groups are in
recording order, which is ``steps``' row order (its sort key ``step`` strictly increases along a run).
"""

from __future__ import annotations

import tempfile
from array import array
from typing import IO, Iterator

import numpy as np
import pyarrow as pa

from sim.trace import schema
from sim.trace.recorder import Columns, KVEventTable
from sim.trace.schema import arrow_table, column_dtype, kv_event_columns_of

#: The tables a run spills (the others are held whole).
SPILLED_TABLES: tuple[str, ...] = ("kv_events", "admissions", "steps")


def _head(column: list | array, rows: int) -> list | np.ndarray:
    """A recorder column's first ``rows`` values: a typed ``array``'s as a NumPy view of its buffer."""
    if isinstance(column, array):
        return np.frombuffer(column, dtype=_NUMPY_TYPES[column.typecode])[:rows]
    return column[:rows]


_NUMPY_TYPES = {"q": np.int64, "d": np.float64}


class ArrowSpill:
    """Full row groups of the spilled tables, in an anonymous temporary file (see the module docstring)."""

    def __init__(self, rows: int | None = None) -> None:
        rows = schema.ROW_GROUP_ROWS if rows is None else rows
        if rows < 1:
            raise ValueError(f"rows must be positive, got {rows}")
        #: Rows per spilled group: by default a bundle's row group (:data:`~sim.trace.schema.ROW_GROUP_ROWS`);
        #: another size gives the same table, not the same Parquet bytes.
        self.rows = rows
        self._files: dict[str, IO[bytes]] = {}
        self._writers: dict[str, pa.ipc.RecordBatchStreamWriter] = {}
        self._last_step: dict[str, int] = {}
        self._schemas: dict[str, pa.Schema] = {}
        self._refused: set[str] = set()

    def spill(self, table: str, columns: Columns | KVEventTable) -> None:
        """Move the first whole groups of ``columns`` out to the file (see :class:`~sim.trace.recorder.TableSpill`)."""
        if isinstance(columns, KVEventTable):
            self._spill_kv_events(table, columns)
            return
        if table not in SPILLED_TABLES or table in self._refused:
            return
        if any(column_dtype(table, name) is None for name in columns.names):
            self._refused.add(table)
            return
        self._spill_groups(table, columns, self.rows)

    def flush(self, table: str, columns: Columns) -> None:
        """After the run: the rows still held of a table that spilled before, as its last group (the table's
        last row group: the same rows whether held or spilled), so they are not held twice while it is written."""
        if table in SPILLED_TABLES and table not in self._refused and columns.spilled and len(columns):
            self._spill_groups(table, columns, len(columns))

    def _spill_groups(self, table: str, columns: Columns, rows: int) -> None:
        while len(columns) >= rows:
            data = columns.data
            # The first ``rows`` rows: a packed column as a NumPy view of its buffer (Arrow takes it as it is:
            # no copy of a group's ~180 MB of numbers), a list's as a slice.
            group = {name: _head(data[name], rows) for name in columns.names}
            steps = group["step"]
            # The table's sort key (``step``, a stable sort) never goes back along a run, so the groups in
            # recording order are the sorted table's rows: checked, as the bytes depend on it.
            first, last = int(min(steps)), int(max(steps))
            previous = self._last_step.get(table)
            if previous is not None and first < previous:
                raise AssertionError(f"{table}: step {first} recorded after step {previous} was spilled")
            converted = arrow_table(table, group)
            self._writer(table, converted.schema).write_table(converted)
            del converted, group, steps  # the views of the packed columns go before the columns shrink
            for name in columns.names:
                del data[name][:rows]
            columns.spilled += rows
            self._last_step[table] = last

    def _spill_kv_events(self, table: str, events: KVEventTable) -> None:
        """The packed ``kv_events``' first whole groups, each the Arrow table the writer would make of them
        (:func:`~sim.trace.schema.kv_event_batches`); the summary's eviction counts are kept by the table."""
        if table != "kv_events":
            raise ValueError(f"a packed kv_events table given as {table!r}")
        rows = self.rows
        while events.held >= rows:
            group = arrow_table(table, kv_event_columns_of(events, 0, rows))
            self._writer(table, group.schema).write_table(group)
            events.drop_first(rows)

    def _writer(self, table: str, schema: pa.Schema) -> pa.ipc.RecordBatchStreamWriter:
        writer = self._writers.get(table)
        if writer is None:
            if table in self._files:
                raise AssertionError(f"{table}: a group spilled after the spill was read back")
            fh = self._files[table] = tempfile.TemporaryFile(prefix=f"hybridsim-{table}-")
            options = pa.ipc.IpcWriteOptions(compression="zstd")
            writer = self._writers[table] = pa.ipc.new_stream(fh, schema, options=options)
            self._schemas[table] = schema
        return writer

    def _rewound(self, table: str) -> IO[bytes] | None:
        """The file of ``table``'s groups at its start (its stream ended: no group is added after the run)."""
        writer = self._writers.pop(table, None)
        if writer is not None:
            writer.close()  # the stream's end marker
        fh = self._files.get(table)
        if fh is not None:
            fh.seek(0)
        return fh

    def column(self, table: str, name: str) -> list[pa.Array]:
        """One column of the spilled groups of ``table``, one array a group (only that column is read and
        decompressed); none if nothing was spilled."""
        fh = self._files.get(table)
        if fh is None:
            return []
        options = pa.ipc.IpcReadOptions(included_fields=[self._schemas[table].get_field_index(name)])
        # Read while the stream is still open (groups may follow: the last, flushed after the run): a stream
        # without its end marker reads to the end of the file; the writer goes on where it was.
        position = fh.tell()
        fh.flush()
        fh.seek(0)
        try:
            return [batch.column(0) for batch in pa.ipc.open_stream(fh, options=options)]
        finally:
            fh.seek(position)

    def batches(self, table: str) -> Iterator[pa.Table]:
        """The spilled groups of ``table`` as Arrow tables, in order, one at a time (none if nothing was spilled)."""
        fh = self._rewound(table)
        if fh is None:
            return
        pending: list[pa.RecordBatch] = []
        held = 0
        for batch in pa.ipc.open_stream(fh):
            pending.append(batch)
            held += batch.num_rows
            if held == self.rows:  # one spilled group (its table's one batch, whatever the stream made of it)
                yield pa.Table.from_batches(pending)
                pending, held = [], 0
        if pending:  # the last group, flushed after the run (:meth:`flush`)
            yield pa.Table.from_batches(pending)
