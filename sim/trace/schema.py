"""The docs/design.md §6 result tables as Arrow tables, one declared schema per table (no pandas).

A run's tables go from the :class:`~sim.trace.recorder.Recorder`'s columns
straight to ``pyarrow.Table.from_pydict(columns, schema=...)``; the bundle
writer stores them as they are, and :class:`ArrowTables` shows them to pandas
users as DataFrames on first access (:mod:`sim.trace.tables` converts). A table
leaving this module has:

* the contract columns of docs/design.md §6 in their order (the per-group columns
  ``hit_g<i>`` / ``blocks_g<i>`` / ``cached_g<i>`` for ``i = 0..N-1`` in place),
  then extension columns in the order they were recorded;
* one declared Arrow type per column (:func:`arrow_schema`): ``int64``,
  ``double`` (a missing time is null), ``bool`` or ``string`` (a missing string
  is ``""``, never null); an extension column the schema does not know gets
  the type :func:`_extension_type` infers from its values, by the rules the
  pandas reader (:mod:`sim.trace.tables`) applies to a file's column;
* a deterministic row order (:data:`SORT_KEYS`, a stable sort): ``kv_events`` by
  ``seq``; ``admissions`` and ``schedule`` by ``step`` then recording order;
  ``requests`` by ``arrival_s`` then ``request_id``; ``steps`` by ``step``.

Block hashes are 64-bit unsigned ints, stored as 16-character lower-case,
zero-padded hex strings (``""`` when an event has no hash): exact in Parquet
and CSV alike and greppable in a CSV diff. :func:`hash_to_hex` /
:func:`hex_to_hash` convert.
"""

from __future__ import annotations

import functools
import itertools
import operator
import re
from array import array as c_array
from typing import TYPE_CHECKING, Iterable, Iterator, Mapping, Sequence

import numpy as np
import pyarrow as pa

from sim.trace.dtypes import BOOL, FIXED_DTYPES, FLOAT, HASH_DTYPE, INT, NINT, PER_GROUP, STR
from sim.trace.recorder import (
    CodedStrings,
    Columns,
    KVEventTable,
    Recorder,
    TableSpill,
    admission_columns,
    kv_event_columns,
    request_columns,
    schedule_columns,
    step_columns,
)

if TYPE_CHECKING:
    import pandas as pd

TABLE_NAMES: tuple[str, ...] = ("kv_events", "admissions", "requests", "schedule", "steps")

#: Columns each table is sorted by (stable sort, so ties keep recording order).
SORT_KEYS: dict[str, tuple[str, ...]] = {
    "kv_events": ("seq",),
    "admissions": ("step",),
    "requests": ("arrival_s", "request_id"),
    "schedule": ("step",),
    "steps": ("step",),
}

#: The Arrow type each schema dtype is stored as (a bundle's Parquet column type).
ARROW_TYPES: dict[str, pa.DataType] = {
    INT: pa.int64(),
    NINT: pa.int64(),
    FLOAT: pa.float64(),
    BOOL: pa.bool_(),
    STR: pa.string(),
    HASH_DTYPE: pa.string(),
}

_HEX64 = re.compile(r"^[0-9a-f]{16}$")
_GROUP_COL = re.compile(r"^(hit_g|blocks_g|cached_g)(\d+)$")


def hash_to_hex(block_hash: int | None) -> str:
    """A 64-bit unsigned block hash as 16 lower-case hex digits (``""`` for none)."""
    if block_hash is None:
        return ""
    h = int(block_hash)
    if not 0 <= h < 1 << 64:
        raise ValueError(f"block_hash {block_hash!r} is not a 64-bit unsigned int")
    return format(h, "016x")


def hex_to_hash(text: str) -> int | None:
    """Inverse of :func:`hash_to_hex`."""
    if text == "":
        return None
    if not _HEX64.match(text):
        raise ValueError(f"block_hash {text!r} is not 16 lower-case hex digits")
    return int(text, 16)


def check_table(table: str) -> None:
    if table not in TABLE_NAMES:
        raise ValueError(f"unknown table {table!r}; valid tables: {', '.join(TABLE_NAMES)}")


def column_dtype(table: str, column: str) -> str | None:
    """The schema dtype of a contract or known extension column, ``None`` if unknown."""
    check_table(table)
    fixed = FIXED_DTYPES[table].get(column)
    if fixed is not None:
        return fixed
    m = _GROUP_COL.match(column)
    if m and m.group(1) in PER_GROUP.get(table, ()):
        return INT
    return None


def contract_columns(table: str, num_groups: int) -> list[str]:
    """Column order of a table as the recorder defines it (docs/design.md §6 + known extensions)."""
    check_table(table)
    return {
        "kv_events": kv_event_columns,
        "admissions": lambda: admission_columns(num_groups),
        "requests": request_columns,
        "schedule": schedule_columns,
        "steps": lambda: step_columns(num_groups),
    }[table]()


def infer_num_groups(columns: Iterable[str]) -> int:
    """Number of KV-cache groups implied by per-group column names (0 if none)."""
    indices = [int(m.group(2)) for c in columns if (m := _GROUP_COL.match(c))]
    return max(indices) + 1 if indices else 0


def arrow_schema(table: str, dtypes: Mapping[str, str]) -> pa.Schema:
    """The declared schema of ``table`` with these columns (name -> schema dtype), every field nullable."""
    check_table(table)
    return pa.schema([pa.field(name, ARROW_TYPES[dtype], nullable=True) for name, dtype in dtypes.items()])


# ---------------------------------------------------------------- recorder -> Arrow


def _is_missing(v: object) -> bool:
    return v is None or (isinstance(v, float) and v != v)


def _extension_type(values: Sequence[object] | np.ndarray) -> str:
    """The schema dtype of a recorded extension column, from its Python values: the rules the pandas
    reader infers a file's unknown column by (``sim.trace.tables._infer_dtype``)."""
    present = [v for v in values if not _is_missing(v) and v != ""]
    if not present:
        return STR
    if all(isinstance(v, (bool, np.bool_)) for v in present):
        return BOOL if len(present) == len(values) else STR
    if all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in present):
        return INT if len(present) == len(values) else NINT
    if all(isinstance(v, (int, float, np.number)) and not isinstance(v, bool) for v in present):
        return FLOAT
    return STR


# pyarrow's ``pa.array`` and ``Array.to_numpy`` import pandas whenever it is installed (to check for pandas
# input and output), so the columns are moved between NumPy and Arrow through their buffers instead:
# the run's path never imports pandas (docs/speed.md).

#: Byte ``b`` -> its two lower-case hex digits as one little-endian uint16 (ASCII), for :func:`_hex_column`.
_HEX_PAIRS = np.array([int.from_bytes(format(b, "02x").encode("ascii"), "little") for b in range(256)], np.uint16)

_NUMPY_OF_ARROW: dict[pa.DataType, np.dtype] = {
    pa.int64(): np.dtype(np.int64),
    pa.int32(): np.dtype(np.int32),
    pa.uint64(): np.dtype(np.uint64),
    pa.float64(): np.dtype(np.float64),
}


def _bitmap(mask: np.ndarray | None) -> pa.Buffer | None:
    """An Arrow validity (or boolean) bitmap of a bool mask (``None`` stays ``None``: all valid)."""
    return None if mask is None else pa.py_buffer(np.packbits(mask, bitorder="little"))


def from_numpy(values: np.ndarray, typ: pa.DataType, valid: np.ndarray | None = None) -> pa.Array:
    """A 1-D NumPy array (int64, float64 or bool) as an Arrow array of ``typ``; ``valid`` marks non-null rows."""
    if valid is not None and valid.all():
        valid = None
    data = _bitmap(values) if typ == pa.bool_() else pa.py_buffer(np.ascontiguousarray(values))
    return pa.Array.from_buffers(typ, len(values), [_bitmap(valid), data])


def numpy_of(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """An int, float or bool Arrow column as a NumPy array (a null float as NaN; an int column with
    nulls as float64 with NaN, as pandas reads it)."""
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    n, offset = len(array), array.offset
    validity, data = array.buffers()[:2]
    if array.type == pa.bool_():
        bits = np.frombuffer(data, np.uint8) if data is not None else np.zeros(0, np.uint8)
        values = np.unpackbits(bits, bitorder="little", count=offset + n)[offset:].astype(bool)
    else:
        dtype = _NUMPY_OF_ARROW[array.type]
        values = np.frombuffer(data, dtype=dtype, count=n, offset=offset * dtype.itemsize) if n else np.zeros(0, dtype)
    if array.null_count:
        bits = np.frombuffer(validity, np.uint8)
        valid = np.unpackbits(bits, bitorder="little", count=offset + n)[offset:].astype(bool)
        values = np.where(valid, values, np.nan)
    return values


def string_array(values: Sequence[str]) -> pa.StringArray:
    """Python strs (or str subclasses, taken as their text) as an Arrow string array, through its buffers."""
    text = "".join(values)
    data = text.encode("utf-8")
    if len(data) == len(text):  # ASCII: a value's bytes are its characters
        lengths = np.fromiter(map(len, values), dtype=np.int64, count=len(values))
    else:
        lengths = np.fromiter((len(v.encode("utf-8")) for v in values), dtype=np.int64, count=len(values))
    offsets = np.zeros(len(values) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    if offsets[-1] >= 2**31:
        raise ValueError("a string column of 2 GiB or more")
    return pa.StringArray.from_buffers(len(values), pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(data))


def _hex_column(values: Sequence[int | None]) -> pa.Array:
    """64-bit hashes (ints, None for none) as 16-digit hex strings (``""`` for none), in one vectorized
    pass: the big-endian bytes through a byte -> two-digit table. A value outside ``[0, 2**64)`` raises."""
    n = len(values)
    if isinstance(values, np.ndarray) and values.dtype == np.uint64:  # packed by the recorder: all valid
        words, valid = values, np.ones(n, dtype=bool)
    else:
        words, valid = _hash_words(values)
    text = _HEX_PAIRS[words.astype(">u8").view(np.uint8)]
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(np.where(valid, 16, 0), out=offsets[1:])
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(text))


def _hash_words(values: Sequence[int | None]) -> tuple[np.ndarray, np.ndarray]:
    """Python hashes (None for none) as uint64 words of the present ones and the validity of each row."""
    n = len(values)
    try:  # array.array packs ints in C, refusing None, floats, strs, negatives and ints of 2**64 or more
        words = np.frombuffer(c_array("Q", values), dtype=np.uint64)  # type: ignore[type-var]
        valid = np.ones(n, dtype=bool)
    except TypeError:  # events without a hash (None) among them
        valid = np.fromiter(map(operator.is_not, values, itertools.repeat(None)), dtype=bool, count=n)
        words = np.frombuffer(c_array("Q", filter(functools.partial(operator.is_not, None), values)), np.uint64)  # type: ignore[type-var]
    return words, valid


def _numbers(values: Sequence[object] | np.ndarray, dtype: str) -> tuple[np.ndarray, np.ndarray | None]:
    """An int, float or bool column as a NumPy array and its validity (``None``: every row valid)."""
    if isinstance(values, np.ndarray):
        array = values.astype(_NUMPY_DTYPES[dtype], copy=False)
    elif dtype == FLOAT:
        array = np.array(values, dtype=np.float64)  # None gives NaN
    elif dtype == BOOL:
        kinds = set(map(type, values))
        if not kinds <= {bool, np.bool_}:
            raise ValueError(f"expected booleans, got a {sorted(k.__name__ for k in kinds - {bool, np.bool_})[0]}")
        array = np.array(values, dtype=bool)
    elif dtype == NINT and None in values:
        valid = np.fromiter(map(operator.is_not, values, itertools.repeat(None)), dtype=bool, count=len(values))
        return np.array([0 if v is None else v for v in values], dtype=np.int64), valid
    else:
        # array.array packs ints (and bools, numpy ints) in C and refuses None, floats and strs (TypeError)
        # and ints outside int64 (OverflowError).
        try:
            array = np.frombuffer(c_array("q", values), dtype=np.int64)  # type: ignore[type-var]
        except TypeError:
            raise ValueError("missing value or a non-integer in a column of integers") from None
    if dtype == FLOAT:
        nan = np.isnan(array)
        return array, (~nan if nan.any() else None)
    return array, None


_NUMPY_DTYPES: dict[str, np.dtype] = {
    INT: np.dtype(np.int64),
    NINT: np.dtype(np.int64),
    FLOAT: np.dtype(np.float64),
    BOOL: np.dtype(bool),
}


def _arrow_column(values: Sequence[object] | np.ndarray, dtype: str) -> pa.Array:
    """One recorded column as an Arrow array of its schema dtype (a bad value raises); an Arrow array (a
    column decoded already) is taken as it is."""
    if isinstance(values, pa.Array):
        return values
    if dtype == HASH_DTYPE:
        return _hex_column(values)  # type: ignore[arg-type]
    if dtype == STR:
        try:
            return string_array(values)  # type: ignore[arg-type]
        except TypeError:  # a value that is not a str (str.join refuses it): its text, "" for a missing one
            return string_array(["" if _is_missing(v) else str(v) for v in values])
    array, valid = _numbers(values, dtype)
    return from_numpy(array, ARROW_TYPES[dtype], valid)


def arrow_table(table: str, columns: Mapping[str, Sequence[object] | np.ndarray]) -> pa.Table:
    """Recorded columns (lists, or 1-D NumPy arrays) as ``table``'s Arrow table: the declared schema,
    the contract column order then the extensions, the :data:`SORT_KEYS` row order (:func:`sort_order`)."""
    check_table(table)
    names = list(columns)
    order = contract_columns(table, infer_num_groups(names))
    missing = [c for c in order if c not in columns]
    if missing:
        raise ValueError(f"table {table!r} is missing columns {missing}; expected {order}")
    order += [c for c in names if c not in order]
    dtypes = {name: column_dtype(table, name) or _extension_type(columns[name]) for name in order}
    try:
        perm = sort_order([(columns[key], dtypes[key]) for key in SORT_KEYS[table]])
    except (TypeError, ValueError, OverflowError) as exc:
        raise ValueError(f"{table}: a sort key holds a value of the wrong type ({exc})") from None
    if perm is not None:
        columns = {name: _reordered(columns[name], perm) for name in order}
    arrays = []
    for name, dtype in dtypes.items():
        try:
            arrays.append(_arrow_column(columns[name], dtype))
        except (TypeError, ValueError, OverflowError, pa.ArrowException) as exc:
            raise ValueError(f"{table}.{name}: {exc}") from None
    return pa.Table.from_arrays(arrays, schema=arrow_schema(table, dtypes))


def sort_order(keys: Sequence[tuple[Sequence[object] | np.ndarray, str]]) -> np.ndarray | None:
    """The row order of a stable sort by ``keys`` (``(values, schema dtype)``, most significant first), as
    ``DataFrame.sort_values(kind="mergesort", na_position="last")`` has it: NaN last, -0.0 equal to 0.0,
    strings by code point, ties in recording order. ``None`` when the rows are in that order already."""
    ranks: list[np.ndarray] = []
    for values, dtype in reversed(keys):
        if dtype in (STR, HASH_DTYPE):
            text = list(values)
            rank = {v: i for i, v in enumerate(sorted(set(text)))}
            ranks.append(np.fromiter((rank[v] for v in text), dtype=np.int64, count=len(text)))
        elif dtype == FLOAT:
            numbers = np.asarray(values, dtype=np.float64)  # None gives NaN
            ranks.append(np.where(np.isnan(numbers), np.inf, numbers))
            ranks.append(np.isnan(numbers))  # more significant than the value: NaN last
        else:
            ranks.append(np.asarray(values, dtype=np.int64))
    if not ranks or len(ranks[0]) < 2:
        return None
    if len(ranks) == 1 and bool((ranks[0][1:] >= ranks[0][:-1]).all()):
        return None
    return np.lexsort(ranks)


def _reordered(values: Sequence[object] | np.ndarray, perm: np.ndarray) -> Sequence[object] | np.ndarray:
    if isinstance(values, (np.ndarray, pa.Array)):
        return values[perm] if isinstance(values, np.ndarray) else values.take(from_numpy(perm, pa.int64()))
    return list(map(values.__getitem__, perm.tolist()))


#: Rows per Parquet row group of a bundle's tables (pyarrow's default since 15, given explicitly so a table
#: written whole and one written a group at a time (:meth:`ArrowTables.batches`) are the same bytes).
ROW_GROUP_ROWS = 1 << 20


def _packed(column: Sequence[object], dtype: type, lo: int, hi: int) -> Sequence[object] | np.ndarray:
    """Rows ``lo:hi`` of a recorder's packed column as a NumPy array over its buffer (no copy); a list's as
    a list."""
    if isinstance(column, c_array):
        return np.frombuffer(column, dtype=dtype)[lo:hi] if len(column) else np.zeros(0, dtype)
    return column[lo:hi]


def coded_array(column: CodedStrings, lo: int = 0, hi: int | None = None) -> pa.DictionaryArray:
    """Rows ``lo:hi`` of a recorder's coded string column as an Arrow dictionary array (its codes over its
    distinct values), without a string per row."""
    codes = np.frombuffer(column.codes, dtype=np.uint8 if column.codes.typecode == "B" else np.uint32)[lo:hi]
    return pa.DictionaryArray.from_arrays(from_numpy(codes.astype(np.int32), pa.int32()), string_array(column.values))


def _decoded(column: CodedStrings, lo: int, hi: int) -> pa.StringArray:
    """Rows ``lo:hi`` of a coded string column as an Arrow string array, built by NumPy through its buffers:
    the distinct values' UTF-8 bytes as the rows of a zero-padded table, each row's row taken by code and its
    first ``length`` bytes kept (a value's NULs are kept: nothing is stripped). Arrow's ``take`` would import
    ``pyarrow.compute``, about 0.03 s of a short run's CPU; at most a distinct value's width of bytes a row."""
    codes = np.frombuffer(column.codes, dtype=np.uint8 if column.codes.typecode == "B" else np.uint32)[lo:hi]
    encoded = [value.encode("utf-8") for value in column.values]
    lengths = np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))
    table = np.zeros((len(encoded), int(lengths.max(initial=0))), dtype=np.uint8)
    for row, data in zip(table, encoded):
        row[: len(data)] = np.frombuffer(data, dtype=np.uint8)
    row_lengths = lengths[codes]
    offsets = np.zeros(len(codes) + 1, dtype=np.int64)
    np.cumsum(row_lengths, out=offsets[1:])
    if offsets[-1] >= 2**31:
        raise ValueError("a string column of 2 GiB or more")
    data = table[codes][np.arange(table.shape[1]) < row_lengths[:, None]]
    return pa.StringArray.from_buffers(len(codes), pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(data))


def kv_event_columns_of(events: KVEventTable, lo: int, hi: int) -> dict[str, Sequence[object] | np.ndarray | pa.Array]:
    """Held rows ``lo:hi`` (after the ``events.spilled`` ones) of the ``kv_events`` columns: ``seq`` and the clock stamps expanded from the runs
    with NumPy (``np.arange`` / ``np.repeat``: a run holds the values its rows do), the packed event fields
    read through their buffers (the coded strings decoded by Arrow), the request ids as recorded."""
    lengths = np.asarray(events.run_lengths, dtype=np.int64)
    ends = np.cumsum(lengths)
    first, last = np.searchsorted(ends, lo, side="right"), np.searchsorted(ends - lengths, hi, side="left")
    counts = np.minimum(ends[first:last], hi) - np.maximum(ends[first:last] - lengths[first:last], lo)
    return {
        "seq": np.arange(events.spilled + lo, events.spilled + hi, dtype=np.int64),
        "step": np.repeat(np.asarray(events.run_steps[first:last], dtype=np.int64), counts),
        "time_s": np.repeat(np.asarray(events.run_times[first:last], dtype=np.float64), counts),
        "kind": _decoded(events.kind, lo, hi),
        "group": _packed(events.group, np.int32, lo, hi),
        "block_id": _packed(events.block_id, np.int32, lo, hi),
        "block_hash": _packed(events.block_hash, np.uint64, lo, hi),
        "request_id": events.request_id[lo:hi],
        "cause": _decoded(events.cause, lo, hi),
    }


def kv_event_batches(events: KVEventTable, rows: int = ROW_GROUP_ROWS) -> Iterator[pa.Table]:
    """The held ``kv_events`` rows ``rows`` rows at a time, in order (at least one table, maybe empty, unless
    rows were spilled): the rows of :func:`table_from_recorded`, without ever holding the whole table as Arrow."""
    n = events.held
    for lo in range(0, n if events.spilled else max(n, 1), rows):
        yield arrow_table("kv_events", kv_event_columns_of(events, lo, min(lo + rows, n)))


def table_from_recorded(table: str, columns: Columns | KVEventTable) -> pa.Table:
    """One recorder table as its Arrow table."""
    if isinstance(columns, KVEventTable):
        if columns.spilled:
            raise ValueError(f"{table}: {columns.spilled} rows were spilled; read them with ArrowTables")
        return arrow_table(table, kv_event_columns_of(columns, 0, columns.held))
    return arrow_table(table, {name: columns.data[name] for name in columns.names})


def arrow_tables_from_recorder(recorder: Recorder) -> dict[str, pa.Table]:
    """All five tables of a run as Arrow tables, keyed by :data:`TABLE_NAMES` (in that order)."""
    recorded: dict[str, Columns | KVEventTable] = {
        "kv_events": recorder.kv_events,
        "admissions": recorder.admissions,
        "requests": recorder.requests,
        "schedule": recorder.schedule,
        "steps": recorder.steps,
    }
    return {name: table_from_recorded(name, recorded[name]) for name in TABLE_NAMES}


def recorded_tables(recorder: Recorder) -> ArrowTables:
    """A run's tables: four as Arrow tables, ``kv_events`` as the recorder packed it (:class:`ArrowTables`
    makes it Arrow on demand, or the writer a row group at a time); a table whose first rows the recorder
    spilled (:class:`~sim.trace.recorder.TableSpill`) as its rows still held, after the spilled groups."""
    recorded: dict[str, Columns] = {
        "admissions": recorder.admissions,
        "requests": recorder.requests,
        "schedule": recorder.schedule,
        "steps": recorder.steps,
    }
    if recorder.spill is not None:
        for name, columns in recorded.items():  # a table that spilled: its last rows too (not held twice)
            recorder.spill.flush(name, columns)
    spilled = {name: columns.spilled for name, columns in recorded.items() if columns.spilled}
    return ArrowTables(
        {name: table_from_recorded(name, columns) for name, columns in recorded.items()},
        kv_events=recorder.kv_events,
        spill=recorder.spill if spilled or recorder.kv_events.spilled else None,
        spilled=spilled,
    )


class ArrowTables(Mapping[str, "pd.DataFrame"]):
    """A run's Arrow tables, seen as pandas DataFrames: each is converted on first access and kept
    (:func:`sim.trace.tables.frame_from_arrow`), so a run that only writes its bundle never imports pandas.

    ``kv_events`` may be given as the recorder's packed table instead (``kv_events=``; a long run records
    about 35 rows per request, and its Arrow table is about 100 bytes a row): it is made an Arrow table only
    when :attr:`arrow` or the DataFrame is asked for; the bundle writer takes it :meth:`batches` at a time.

    A table whose first rows a run spilled (``spilled``: name -> rows in ``spill``) is given in ``arrow`` as
    its later rows: :meth:`batches` reads the spilled groups back one at a time, then gives those rows; it is
    made whole only when asked for.
    """

    def __init__(
        self,
        arrow: Mapping[str, pa.Table],
        *,
        kv_events: KVEventTable | None = None,
        spill: TableSpill | None = None,
        spilled: Mapping[str, int] | None = None,
    ) -> None:
        self._arrow = dict(arrow)
        #: The packed ``kv_events`` not yet made an Arrow table (``None`` once made, or if given as a table).
        self._kv_events = kv_events
        #: Tables whose first rows are in ``spill`` and not yet made whole -> how many.
        self._spilled = dict(spilled or {})
        if self._spilled and spill is None:
            raise ValueError(f"tables {sorted(self._spilled)} have spilled rows but no spill was given")
        self._spill = spill
        self._names = [
            name for name in TABLE_NAMES if name in self._arrow or (name == "kv_events" and kv_events is not None)
        ]
        self._names += [name for name in self._arrow if name not in self._names]
        self._frames: dict[str, pd.DataFrame] = {}

    @property
    def arrow(self) -> dict[str, pa.Table]:
        """Every table as Arrow, in :data:`TABLE_NAMES` order."""
        return {name: self.table(name) for name in self._names}

    def table(self, name: str) -> pa.Table:
        """One table as Arrow (the packed ``kv_events`` made whole and kept)."""
        if name == "kv_events" and self._kv_events is not None:
            events = self._kv_events
            if events.spilled:
                self._arrow[name] = pa.concat_tables(list(self.batches(name))).combine_chunks()
            else:
                self._arrow[name] = table_from_recorded(name, events)
            self._kv_events = None
        if name in self._spilled:
            self._arrow[name] = pa.concat_tables(list(self.batches(name))).combine_chunks()
            del self._spilled[name]
        return self._arrow[name]

    def column(self, name: str, column: str) -> pa.ChunkedArray:
        """One column of one table, without making a spilled table whole (its groups' column read back)."""
        if name in self._spilled and self._spill is not None:
            tail = self._arrow[name].column(column)
            return pa.chunked_array(self._spill.column(name, column) + tail.chunks, type=tail.type)
        return self.table(name).column(column)

    def column_names(self, name: str) -> list[str]:
        """One table's column names, without making a spilled table whole."""
        if name == "kv_events" and self._kv_events is not None:
            return list(self._kv_events.names)
        return list(self._arrow[name].column_names)

    @property
    def recorded_kv_events(self) -> KVEventTable | None:
        """The recorder's packed ``kv_events``, while it has not been made an Arrow table."""
        return self._kv_events

    def num_rows(self, name: str) -> int:
        if name == "kv_events" and self._kv_events is not None:
            return len(self._kv_events)
        return int(self._arrow[name].num_rows) + self._spilled.get(name, 0)

    def batches(self, name: str) -> Iterator[pa.Table]:
        """One table as consecutive Arrow tables of at most :data:`ROW_GROUP_ROWS` rows (the packed
        ``kv_events`` converted one at a time; another table whole)."""
        if name == "kv_events" and self._kv_events is not None:
            events = self._kv_events
            if events.spilled:
                if self._spill is None:
                    raise ValueError(f"kv_events has {events.spilled} spilled rows but no spill was given")
                return itertools.chain(self._spill.batches(name), kv_event_batches(events))
            return kv_event_batches(events)
        if name in self._spilled and self._spill is not None:
            return self._spilled_batches(name, self._spill)
        return iter([self._arrow[name]])

    def _spilled_batches(self, name: str, spill: TableSpill) -> Iterator[pa.Table]:
        yield from spill.batches(name)
        tail = self._arrow[name]
        if tail.num_rows:
            yield tail

    def __getitem__(self, name: str) -> pd.DataFrame:
        frame = self._frames.get(name)
        if frame is None:
            from sim.trace.tables import frame_from_arrow

            frame = self._frames[name] = frame_from_arrow(self.table(name))
        return frame

    def __contains__(self, name: object) -> bool:
        return name in self._names

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)
