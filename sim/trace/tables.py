"""The docs/design.md §6 result tables as pandas DataFrames with a fixed schema.

The :class:`~sim.trace.recorder.Recorder` collects plain-Python columns; this
module is the one place that turns them (or a table read back from Parquet or
CSV) into DataFrames. Whatever the source, a table leaving this module has:

* the contract columns of docs/design.md §6 in their order (the per-group columns
  ``hit_g<i>`` / ``blocks_g<i>`` / ``cached_g<i>`` for ``i = 0..N-1`` in place),
  then extension columns in the order they were recorded (or found in a file);
* one fixed dtype per column (:func:`column_dtype`): ``int64``, ``float64``
  (missing times are NaN), ``bool`` or pandas ``str`` (a missing string is
  ``""``, never NaN); an extension column the schema does not know gets the
  narrowest of these that holds its values (nullable ``Int64`` for integers
  with gaps, e.g. a column added part-way through a run);
* a deterministic row order (:data:`SORT_KEYS`): ``kv_events`` by ``seq``;
  ``admissions`` and ``schedule`` by ``step`` then recording order;
  ``requests`` by ``arrival_s`` then ``request_id``; ``steps`` by ``step``;
  the index is a fresh ``RangeIndex``.

Block hashes are 64-bit unsigned ints. They are stored as 16-character
lower-case, zero-padded hex strings (``""`` when an event has no hash): exact in
Parquet and CSV alike, fixed width and greppable in a CSV diff, and immune to
readers that would turn an unsigned 64-bit value into int64 overflow or a
float. :func:`hash_to_hex` / :func:`hex_to_hash` convert.
"""

from __future__ import annotations

import functools
import re
from array import array as c_array
from typing import Iterable, Mapping, Sequence, TypeAlias

import numpy as np
import pandas as pd
import pyarrow as pa

from sim.trace.recorder import (
    Columns,
    KVEventTable,
    Recorder,
    admission_columns,
    kv_event_columns,
    request_columns,
    schedule_columns,
    step_columns,
)

TABLE_NAMES: tuple[str, ...] = ("kv_events", "admissions", "requests", "schedule", "steps")

#: Dtype name of the 64-bit block-hash column (a ``str`` column of 16 hex digits).
HASH_DTYPE = "hex64"

_INT, _NINT, _FLOAT, _BOOL, _STR = "int64", "Int64", "float64", "bool", "str"

_FIXED_DTYPES: dict[str, dict[str, str]] = {
    "kv_events": {
        "seq": _INT,
        "step": _INT,
        "time_s": _FLOAT,
        "kind": _STR,
        "group": _INT,
        "block_id": _INT,
        "block_hash": HASH_DTYPE,
        "request_id": _STR,
        "cause": _STR,
    },
    "admissions": {
        "step": _INT,
        "time_s": _FLOAT,
        "request_id": _STR,
        "prompt_tokens": _INT,
        "local_tokens": _INT,
        "external_tokens": _INT,
        "hit_diverged": _BOOL,
        "fallback": _BOOL,
        "policy": _STR,
        "outcome": _STR,
        "crash_reason": _STR,
        "kind": _STR,
        "reason": _STR,
        "num_computed_tokens": _INT,
        "tokens_lost": _INT,
        "taint_origin": _STR,
        "lookup_seq": _INT,
        "claimed_boundary": _INT,
        "connector_asked_at": _INT,
        "connector_answer": _INT,
    },
    "requests": {
        "request_id": _STR,
        "arrival_s": _FLOAT,
        "first_scheduled_s": _FLOAT,
        "first_token_s": _FLOAT,
        "finished_s": _FLOAT,
        "prompt_tokens": _INT,
        "output_tokens": _INT,
        "local_hit_tokens": _INT,
        "external_hit_tokens": _INT,
        "preemptions": _INT,
        "outcome": _STR,
    },
    "schedule": {
        "step": _INT,
        "request_id": _STR,
        "kind": _STR,
        "num_scheduled_tokens": _INT,
        "num_computed_tokens": _INT,
        "preempted": _BOOL,
    },
    "steps": {
        "step": _INT,
        "time_s": _FLOAT,
        "duration_s": _FLOAT,
        "running": _INT,
        "waiting": _INT,
        "prefill_tokens": _INT,
        "decode_tokens": _INT,
        "free_blocks": _INT,
    },
}

_PER_GROUP = {
    "admissions": ("hit_g",),
    "steps": ("blocks_g", "cached_g"),
}

#: Columns each table is sorted by (stable sort, so ties keep recording order).
SORT_KEYS: dict[str, tuple[str, ...]] = {
    "kv_events": ("seq",),
    "admissions": ("step",),
    "requests": ("arrival_s", "request_id"),
    "schedule": ("step",),
    "steps": ("step",),
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


def _check_table(table: str) -> None:
    if table not in TABLE_NAMES:
        raise ValueError(f"unknown table {table!r}; valid tables: {', '.join(TABLE_NAMES)}")


def column_dtype(table: str, column: str) -> str | None:
    """The schema dtype of a contract or known extension column, ``None`` if unknown."""
    _check_table(table)
    fixed = _FIXED_DTYPES[table].get(column)
    if fixed is not None:
        return fixed
    m = _GROUP_COL.match(column)
    if m and m.group(1) in _PER_GROUP.get(table, ()):
        return _INT
    return None


def contract_columns(table: str, num_groups: int) -> list[str]:
    """Column order of a table as the recorder defines it (docs/design.md §6 + known extensions)."""
    _check_table(table)
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


# ---------------------------------------------------------------- coercion


def _nonempty_str(values: pd.Series) -> pd.Series:
    return values.astype(object).where(values.notna(), "").map(str)


def _to_number(values: pd.Series, table: str, column: str) -> pd.Series:
    """Numbers from numeric, Python-object (recorder) or text (CSV) values; ``""``/None are missing."""
    if values.dtype.kind in "biuf" or isinstance(values.dtype, pd.Int64Dtype):
        return values
    obj = values.astype(object)
    obj = obj.where(obj.notna() & (obj != ""), None)
    try:
        return pd.to_numeric(obj, errors="raise")
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{table}.{column}: expected numbers ({exc})") from None


def _coerce(values: pd.Series, dtype: str, table: str, column: str) -> pd.Series:
    """Bring one column to its schema dtype, raising a clear error on bad values."""
    if dtype == _STR:
        return _nonempty_str(values).astype(_STR)
    if dtype == HASH_DTYPE:
        if (
            values.dtype.kind in "iu"
            or values.dtype == object
            and any(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in values)
        ):
            return pd.Series([hash_to_hex(None if _is_missing(v) else v) for v in values], dtype=_STR)
        text = _nonempty_str(values)
        bad = [v for v in text if v and not _HEX64.match(v)]
        if bad:
            raise ValueError(f"{table}.{column}: {bad[0]!r} is not 16 lower-case hex digits")
        return text.astype(_STR)
    if dtype == _BOOL:
        if values.dtype == bool:
            return values
        # (1 and 0 need no keys of their own: they hash and compare equal to True and False.)
        mapping = {
            "True": True,
            "False": False,
            "true": True,
            "false": False,
            "1": True,
            "0": False,
            True: True,
            False: False,
        }
        out = values.astype(object).map(mapping.get)
        if out.isna().any():
            bad = values[out.isna()].iloc[0]
            raise ValueError(f"{table}.{column}: {bad!r} is not a boolean (True/False)")
        return out.astype(bool)
    nums = _to_number(values, table, column)
    if dtype == _FLOAT:
        return nums.astype(_FLOAT)
    if dtype in (_INT, _NINT):
        if nums.dtype.kind == "f":
            finite = nums.dropna()
            if (finite != np.floor(finite)).any():
                raise ValueError(
                    f"{table}.{column}: expected integers, got {finite[finite != np.floor(finite)].iloc[0]!r}"
                )
        _check_int64_range(nums, table, column)
        if dtype == _INT:
            if nums.isna().any():
                raise ValueError(f"{table}.{column}: missing value in a column that is always set")
            return nums.astype(_INT)
        return nums.astype(_NINT)
    raise AssertionError(f"unknown schema dtype {dtype!r}")


def _check_int64_range(nums: pd.Series, table: str, column: str) -> None:
    """An integer column's values must fit int64: ``astype`` would wrap a larger one silently
    (``2**63`` to ``-2**63``), so such a value is an error naming it."""
    if nums.dtype.kind == "u":
        out = list(nums[nums > np.iinfo(np.int64).max])
    elif nums.dtype.kind == "f":
        out = list(nums[(nums >= 2.0**63) | (nums < -(2.0**63))])
    elif nums.dtype == object:  # to_numeric keeps ints beyond 64 bits as Python ints
        out = [v for v in nums if isinstance(v, int) and not -(2**63) <= v < 2**63]
    else:
        return
    if out:
        raise ValueError(f"{table}.{column}: {out[0]!r} is outside the 64-bit integer range")


def _is_missing(v: object) -> bool:
    return v is None or (isinstance(v, float) and np.isnan(v))


def _infer_dtype(values: pd.Series) -> str:
    """Dtype of an extension column the schema does not know, from its values."""
    if values.dtype == bool:
        return _BOOL
    if values.dtype.kind in "iu" or isinstance(values.dtype, pd.Int64Dtype):
        return _NINT if values.isna().any() else _INT
    if values.dtype.kind == "f":
        return _FLOAT
    present = [v for v in values.astype(object) if not _is_missing(v) and v != ""]
    if not present:
        return _STR
    if all(isinstance(v, (bool, np.bool_)) for v in present) or all(v in ("True", "False") for v in present):
        return _BOOL if len(present) == len(values) else _STR
    if all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in present) or all(
        isinstance(v, str) and re.fullmatch(r"-?\d+", v) for v in present
    ):
        return _INT if len(present) == len(values) else _NINT
    if all(isinstance(v, (int, float, np.number)) and not isinstance(v, bool) for v in present):
        return _FLOAT
    if all(isinstance(v, str) for v in present):
        try:
            pd.to_numeric(pd.Series(present), errors="raise")
            return _FLOAT
        except ValueError:
            return _STR
    return _STR


# ---------------------------------------------------------------- public


def _int64_words(values: Sequence) -> np.ndarray | None:
    """An int column as int64 in one C pass, or None for the inferring path (a value that is not an int).

    array.array takes ints (and bools and numpy ints, by their integer value) for 'Q' and 'q' alike,
    and refuses None, a str or a float (TypeError). 'Q' converts each value straight from the int
    (about a quarter of the instructions of 'q', which parses every value as a call argument), so
    it goes first; a negative (OverflowError) takes 'q'. A value of 2**63 or more fits 'Q' but not
    int64: None, as 'q' refusing it would give.
    """
    try:
        words = np.frombuffer(c_array("Q", values), dtype=np.int64)
    except TypeError:
        return None
    except OverflowError:
        try:
            return np.frombuffer(c_array("q", values), dtype=np.int64)
        except (TypeError, OverflowError):
            return None
    # Read as int64, a word of 2**63 or more is negative.
    return None if words.min() < 0 else words


#: The NumPy dtype of each numeric schema dtype (a 1-D array of it is a column as it is).
_NUMPY_DTYPES: dict[str, np.dtype] = {_INT: np.dtype(np.int64), _FLOAT: np.dtype(np.float64), _BOOL: np.dtype(bool)}

#: A column as :func:`normalized_columns` takes it: a sequence of values or a 1-D NumPy array.
RawColumn: TypeAlias = "Sequence | np.ndarray"

#: What :func:`_fast_column` builds: a NumPy array or a pandas ``str`` extension array.
ColumnArray: TypeAlias = "np.ndarray | pd.api.extensions.ExtensionArray"


def _fast_column(values: Sequence, dtype: str) -> ColumnArray | None:
    """A recorder column (a plain list) straight to an array of its schema dtype, or None to take the general path.

    Only the common case is handled here: every value already has the column's
    Python type (ints, floats or None for floats, bools, strs, 64-bit hash ints
    or None; a str column may hold str subclasses, whose text is taken as is).
    Anything else goes through :func:`_coerce`, which gives the same result or
    the same error.
    """
    if dtype == _INT and values:
        packed = _int64_words(values)
        if packed is not None:
            return packed
    if dtype == _FLOAT and values:
        # One C pass, no dtype discovery: array.array's 'd' takes any real number, exactly what the
        # column holds; None or a str raises and takes the inferring path below.
        try:
            return np.frombuffer(c_array("d", values), dtype=np.float64)
        except (TypeError, OverflowError):
            pass
    if dtype == _BOOL and values:
        # pyarrow's boolean conversion takes exactly Python and NumPy bools (None gives a null;
        # an int, even 0 or 1, a float or a str raises): the values NumPy infers a bool array from,
        # converted without NumPy's per-value dtype discovery.
        try:
            bits = pa.array(values, type=pa.bool_())
        except (TypeError, ValueError, OverflowError, pa.ArrowException):
            bits = None
        if bits is not None and not bits.null_count:
            return bits.to_numpy(zero_copy_only=False)
    if dtype in (_INT, _BOOL, _FLOAT):
        # NumPy infers int64 / bool / float64 only from values of those kinds
        # (None or a str gives an object array, a huge int float64 or object).
        array = np.array(values) if values else None
        if array is None or array.ndim != 1:
            return None
        if dtype == _INT:
            return array if array.dtype == np.int64 else None
        if dtype == _BOOL:
            return array if array.dtype == np.bool_ else None
        if array.dtype.kind not in "if" and not set(map(type, values)) <= {float, int, type(None)}:
            return None
        if array.dtype.kind not in "if":
            array = np.array([np.nan if v is None else v for v in values], dtype=np.float64)
        return array.astype(np.float64, copy=False)
    if dtype == _STR and _ARROW_STR and values:
        # pyarrow infers its string type only when every value is a str (None gives a null, bytes make
        # it binary, anything else raises), so its inference doubles as the type check.
        try:
            inferred = pa.array(values)
        except (TypeError, ValueError, OverflowError, pa.ArrowException):
            return None
        if inferred.type != pa.string() or inferred.null_count:
            return None
        return _arrow_str_array(inferred.cast(pa.large_string()))
    if dtype == HASH_DTYPE and _ARROW_STR and values and type(values[0]) is int:
        # One C pass: array.array's 'Q' takes exactly the ints in [0, 2**64) (and bools and numpy
        # ints, by their integer value, as hash_to_hex does once the first value is an int); None
        # (an event without a hash), a float, a str, a negative or a too large int raise.
        try:
            words = c_array("Q", values)
        except (TypeError, OverflowError):
            pass
        else:
            return _hex_array(np.frombuffer(words, dtype=np.uint64))
    types = set(map(type, values))
    if dtype == _STR:
        return _str_array(values) if types <= {str} else None
    if dtype == HASH_DTYPE:
        if not types <= {int, type(None)}:
            return None
        hashes = [v for v in values if v is not None]
        if hashes and (min(hashes) < 0 or max(hashes) >= 1 << 64):
            return None
        return pd.array(["" if v is None else format(v, "016x") for v in values], dtype=_STR)
    return None


#: pandas' ``str`` dtype; with pyarrow storage the builders below make its arrays directly
#: (the same values, dtype and arrow type as ``pd.array(values, dtype="str")``, without the
#: per-value inference pass).
_STR_DTYPE = pd.Series([], dtype=_STR).dtype
_ARROW_STR = getattr(_STR_DTYPE, "storage", None) == "pyarrow"

#: Byte ``b`` -> its two lower-case hex digits as one little-endian uint16 (ASCII), for :func:`_hex_array`.
_HEX_PAIRS = np.array([int.from_bytes(format(b, "02x").encode("ascii"), "little") for b in range(256)], np.uint16)


def _str_array(values: Sequence[str]) -> pd.api.extensions.ExtensionArray:
    if not _ARROW_STR:
        return pd.array(values, dtype=_STR)
    return _arrow_str_array(pa.array(values, type=pa.large_string()))


def _arrow_str_array(array: pa.LargeStringArray) -> pd.arrays.ArrowStringArray:
    return pd.arrays.ArrowStringArray(pa.chunked_array([array]), dtype=_STR_DTYPE)


def _hex_array(words: np.ndarray) -> pd.arrays.ArrowStringArray:
    """64-bit hashes (a uint64 array) as 16-digit lower-case hex strings, in one vectorized pass:
    the big-endian bytes through a byte -> two-digit table, cut every 16 characters."""
    text = _HEX_PAIRS[words.astype(">u8").view(np.uint8)]
    offsets = np.arange(0, 16 * len(words) + 1, 16, dtype=np.int64)
    array = pa.LargeStringArray.from_buffers(len(words), pa.py_buffer(offsets), pa.py_buffer(text))
    return _arrow_str_array(array)


def _is_sorted(values: ColumnArray) -> bool:
    """True when an integer sort key is already non-decreasing (a stable sort would keep the order)."""
    values = np.asarray(values)
    return values.dtype.kind in "iu" and bool((values[1:] >= values[:-1]).all())


def normalize_table(table: str, frame: pd.DataFrame | Mapping[str, RawColumn]) -> pd.DataFrame:
    """Schema dtypes, canonical column order and deterministic row order for one table.

    Accepts a DataFrame or a mapping of column name to values (lists, as the
    recorder holds them, or 1-D NumPy arrays). Columns missing from the contract are an error; unknown
    columns are kept as extensions with an inferred dtype.
    """
    return frame_from_columns(normalized_columns(table, frame))


def normalized_columns(table: str, frame: pd.DataFrame | Mapping[str, RawColumn]) -> dict[str, ColumnArray]:
    """The columns of :func:`normalize_table`'s frame as arrays, in its column and row order
    (``frame_from_columns`` of them is that frame)."""
    _check_table(table)
    fast: dict[str, ColumnArray] = {}
    df: pd.DataFrame | None
    if isinstance(frame, pd.DataFrame):
        df = frame
    else:
        for name, values in frame.items():
            dtype = column_dtype(table, name)
            column = None
            if dtype is not None and isinstance(values, list):
                column = _fast_column(values, dtype)
            elif (
                isinstance(values, np.ndarray)
                and values.ndim == 1
                and dtype in _NUMPY_DTYPES
                and values.dtype == _NUMPY_DTYPES[dtype]
            ):
                column = values  # already what _coerce would make of it
            if column is not None:
                fast[name] = column
        # Every column on the fast path (the recorder's case): no intermediate frame is needed.
        df = (
            None
            if len(fast) == len(frame)
            else pd.DataFrame({k: fast[k] if k in fast else pd.Series(list(v), dtype=object) for k, v in frame.items()})
        )
    columns = list(frame) if df is None else list(df.columns)
    num_groups = infer_num_groups(columns)
    order = contract_columns(table, num_groups)
    if table == "admissions" and len(columns) and "lookup_seq" not in columns:
        df = _with_explain_columns(pd.DataFrame(fast) if df is None else df)
        columns = list(df.columns)
    missing = [c for c in order if c not in columns]
    if missing:
        raise ValueError(f"table {table!r} is missing columns {missing}; expected {order}")
    order += [c for c in columns if c not in order]
    out: dict[str, ColumnArray] = {}
    for col in order:
        if col in fast:
            out[col] = fast[col]
            continue
        assert df is not None  # a column off the fast path means the frame was built
        dtype = column_dtype(table, col) or _infer_dtype(df[col])
        out[col] = _coerce(df[col].reset_index(drop=True), dtype, table, col).array
    keys = list(SORT_KEYS[table])
    rows = len(out[order[0]])
    if rows > 1 and not (len(keys) == 1 and _is_sorted(out[keys[0]])):
        perm = _sort_order(out, keys)
        out = {
            col: values[perm] if isinstance(values, np.ndarray) else values.take(perm) for col, values in out.items()
        }
    return out


def _sort_order(columns: Mapping[str, ColumnArray], keys: Sequence[str]) -> np.ndarray:
    """The row order ``DataFrame.sort_values(keys, kind="mergesort", na_position="last")`` gives
    a frame of these columns: a stable sort by the keys in turn, NaN last.

    Numeric keys sort as they are and a ``str`` key (without NA) by the rank of its value, in one
    ``np.lexsort`` (stable; NaN last, ties, -0.0 == 0.0 as pandas has them); any other key takes
    pandas' sort on a frame of the key columns alone.
    """
    ranks: list[np.ndarray] = []
    for key in keys:
        values = columns[key]
        if isinstance(values, np.ndarray) and values.dtype.kind in "iuf":
            ranks.append(values)
            continue
        if values.dtype == _STR_DTYPE:
            codes, uniques = pd.factorize(values)
            if not (codes < 0).any():
                # Python's str order (code points) is the order pandas sorts str values in.
                rank = np.empty(len(uniques), dtype=np.int64)
                rank[np.argsort(np.asarray(uniques, dtype=object), kind="stable")] = np.arange(len(uniques))
                ranks.append(rank[codes])
                continue
        by = pd.DataFrame({k: columns[k] for k in keys}, copy=False)
        return by.sort_values(list(keys), kind="mergesort", na_position="last").index.to_numpy()
    return np.lexsort(ranks[::-1])


def frame_from_columns(columns: Mapping[str, ColumnArray]) -> pd.DataFrame:
    """A DataFrame of equal-length column arrays, in their order, with a fresh ``RangeIndex``.

    Built from an integer-keyed dict (a ``RangeIndex`` of columns, which pandas makes without
    looking at names) and then given the names: the same frame as ``pd.DataFrame(columns)``,
    without inferring the name index's dtype each time; copy=False keeps one block per column
    instead of copying same-dtype columns into 2-D blocks.
    """
    result = pd.DataFrame(dict(enumerate(columns.values())), copy=False)
    result.columns = _column_index(tuple(columns)).copy()
    return result


@functools.lru_cache(maxsize=64)
def _column_index(names: tuple[str, ...]) -> pd.Index:
    """The column index pandas makes from these names (shared: callers take a ``copy()``)."""
    return pd.DataFrame({name: [] for name in names}).columns


def _with_explain_columns(df: pd.DataFrame) -> pd.DataFrame:
    """An ``admissions`` table from a bundle older than the explain columns, with them filled:
    ``lookup_seq`` / ``connector_*`` ``-1`` (unknown), ``claimed_boundary`` = local + external."""
    df = df.copy()
    df["lookup_seq"] = -1
    local = _to_number(df["local_tokens"], "admissions", "local_tokens") if "local_tokens" in df else 0
    external = _to_number(df["external_tokens"], "admissions", "external_tokens") if "external_tokens" in df else 0
    df["claimed_boundary"] = local + external
    df["connector_asked_at"] = -1
    df["connector_answer"] = -1
    return df


def table_from_columns(table: str, columns: Columns | KVEventTable) -> pd.DataFrame:
    """One recorder table (:class:`~sim.trace.recorder.Columns`, or the ``kv_events``
    :class:`~sim.trace.recorder.KVEventTable`) as a normalized DataFrame."""
    return frame_from_columns(_recorded_columns(table, columns))


def _recorded_columns(table: str, columns: Columns | KVEventTable) -> dict[str, ColumnArray]:
    if isinstance(columns, KVEventTable):
        return normalized_columns(table, _kv_event_values(columns))
    return normalized_columns(table, {name: columns.data[name] for name in columns.names})


def _kv_event_values(events: KVEventTable) -> Mapping[str, RawColumn]:
    """The ``kv_events`` columns for :func:`normalized_columns`: ``seq`` and the clock stamps as
    arrays expanded from the runs (``np.arange`` / ``np.repeat``: the arrays the expanded lists
    convert to, since a run holds the values its rows do), the event fields as recorded. Stamps
    the fast conversion refuses take the expanded lists (and the general path)."""
    steps = _fast_column(events.run_steps, _INT)
    times = _fast_column(events.run_times, _FLOAT)
    if not isinstance(steps, np.ndarray) or not isinstance(times, np.ndarray):
        return events.data
    lengths = _int64_words(events.run_lengths)
    assert lengths is not None  # run lengths are positive ints
    return {
        "seq": np.arange(len(events), dtype=np.int64),
        "step": np.repeat(steps, lengths),
        "time_s": np.repeat(times, lengths),
        "kind": events.kind,
        "group": events.group,
        "block_id": events.block_id,
        "block_hash": events.block_hash,
        "request_id": events.request_id,
        "cause": events.cause,
    }


def columns_from_recorder(recorder: Recorder) -> dict[str, dict[str, ColumnArray]]:
    """All five tables of a run as :func:`normalized_columns` arrays, keyed by :data:`TABLE_NAMES`
    (:func:`frame_from_columns` of each is :func:`tables_from_recorder`'s frame)."""
    recorded: dict[str, Columns | KVEventTable] = {
        "kv_events": recorder.kv_events,
        "admissions": recorder.admissions,
        "requests": recorder.requests,
        "schedule": recorder.schedule,
        "steps": recorder.steps,
    }
    return {name: _recorded_columns(name, recorded[name]) for name in TABLE_NAMES}


def tables_from_recorder(recorder: Recorder) -> dict[str, pd.DataFrame]:
    """All five tables of a run, keyed by :data:`TABLE_NAMES` (in that order)."""
    return {name: frame_from_columns(columns) for name, columns in columns_from_recorder(recorder).items()}


def empty_table(table: str, num_groups: int) -> pd.DataFrame:
    """A zero-row table with the contract columns and dtypes."""
    return normalize_table(table, {c: [] for c in contract_columns(table, num_groups)})
