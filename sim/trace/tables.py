"""The docs/design.md §6 result tables as pandas DataFrames: the notebook and file-reading side of
:mod:`sim.trace.schema`.

A run's tables are Arrow tables with one declared schema each (:mod:`sim.trace.schema`, no pandas);
this module shows them as DataFrames (:func:`frame_from_arrow`) and brings any other table (a
DataFrame, a mapping of columns, a table read back from Parquet or CSV) to the same shape
(:func:`normalize_table`):

* the contract columns in their order, then extension columns in the order they were found;
* one fixed dtype per column (:func:`column_dtype`): ``int64``, ``float64``
  (missing times are NaN), ``bool`` or pandas ``str`` (a missing string is
  ``""``, never NaN); an extension column the schema does not know gets the
  narrowest of these that holds its values (nullable ``Int64`` for integers
  with gaps, e.g. a column added part-way through a run);
* the deterministic row order of :data:`SORT_KEYS` (a stable sort); the index
  is a fresh ``RangeIndex``.

Block hashes are 16-character lower-case hex strings (:func:`hash_to_hex` / :func:`hex_to_hash`).
"""

from __future__ import annotations

import re
from typing import Mapping, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa

from sim.trace.dtypes import BOOL, FLOAT, HASH_DTYPE, INT, NINT, STR
from sim.trace.recorder import Recorder
from sim.trace.schema import (
    _HEX64,
    SORT_KEYS,
    TABLE_NAMES,
    arrow_tables_from_recorder,
    check_table,
    column_dtype,
    contract_columns,
    hash_to_hex,
    hex_to_hash,
    infer_num_groups,
)

__all__ = [
    "HASH_DTYPE",
    "SORT_KEYS",
    "TABLE_NAMES",
    "column_dtype",
    "contract_columns",
    "empty_table",
    "frame_from_arrow",
    "hash_to_hex",
    "hex_to_hash",
    "infer_num_groups",
    "normalize_table",
    "tables_from_recorder",
]


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
    if dtype == STR:
        return _nonempty_str(values).astype(STR)
    if dtype == HASH_DTYPE:
        if (
            values.dtype.kind in "iu"
            or values.dtype == object
            and any(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in values)
        ):
            return pd.Series([hash_to_hex(None if _is_missing(v) else v) for v in values], dtype=STR)
        text = _nonempty_str(values)
        bad = [v for v in text if v and not _HEX64.match(v)]
        if bad:
            raise ValueError(f"{table}.{column}: {bad[0]!r} is not 16 lower-case hex digits")
        return text.astype(STR)
    if dtype == BOOL:
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
    if dtype == FLOAT:
        return nums.astype(FLOAT)
    if dtype in (INT, NINT):
        if nums.dtype.kind == "f":
            finite = nums.dropna()
            if (finite != np.floor(finite)).any():
                raise ValueError(
                    f"{table}.{column}: expected integers, got {finite[finite != np.floor(finite)].iloc[0]!r}"
                )
        _check_int64_range(nums, table, column)
        if dtype == INT:
            if nums.isna().any():
                raise ValueError(f"{table}.{column}: missing value in a column that is always set")
            return nums.astype(INT)
        return nums.astype(NINT)
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
        return BOOL
    if values.dtype.kind in "iu" or isinstance(values.dtype, pd.Int64Dtype):
        return NINT if values.isna().any() else INT
    if values.dtype.kind == "f":
        return FLOAT
    present = [v for v in values.astype(object) if not _is_missing(v) and v != ""]
    if not present:
        return STR
    if all(isinstance(v, (bool, np.bool_)) for v in present) or all(v in ("True", "False") for v in present):
        return BOOL if len(present) == len(values) else STR
    if all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in present) or all(
        isinstance(v, str) and re.fullmatch(r"-?\d+", v) for v in present
    ):
        return INT if len(present) == len(values) else NINT
    if all(isinstance(v, (int, float, np.number)) and not isinstance(v, bool) for v in present):
        return FLOAT
    if all(isinstance(v, str) for v in present):
        try:
            pd.to_numeric(pd.Series(present), errors="raise")
            return FLOAT
        except ValueError:
            return STR
    return STR


# ---------------------------------------------------------------- public


def frame_from_arrow(table: pa.Table) -> pd.DataFrame:
    """An Arrow table of :mod:`sim.trace.schema` as a normalized DataFrame: ``int64`` / ``float64`` /
    ``bool`` / ``str`` columns (an ``int64`` column with nulls, an extension with gaps, as ``Int64``;
    a null float as NaN), in the table's column and row order, with a fresh ``RangeIndex``."""
    columns: dict[str, object] = {}
    for name, column in zip(table.column_names, table.columns):
        if pa.types.is_integer(column.type) and column.null_count:
            columns[name] = column.to_pandas(types_mapper={pa.int64(): pd.Int64Dtype()}.get)
        else:
            columns[name] = column.to_pandas()
    return pd.DataFrame(columns, index=pd.RangeIndex(table.num_rows), columns=table.column_names)


def normalize_table(table: str, frame: pd.DataFrame | Mapping[str, Sequence | np.ndarray]) -> pd.DataFrame:
    """Schema dtypes, canonical column order and deterministic row order for one table.

    Accepts a DataFrame or a mapping of column name to values (lists or 1-D NumPy arrays). Columns
    missing from the contract are an error; unknown columns are kept as extensions with an inferred dtype.
    """
    check_table(table)
    df = (
        frame
        if isinstance(frame, pd.DataFrame)
        else pd.DataFrame({k: pd.Series(list(v), dtype=object) for k, v in frame.items()})
    )
    columns = list(df.columns)
    num_groups = infer_num_groups(columns)
    order = contract_columns(table, num_groups)
    if table == "admissions" and len(columns) and "lookup_seq" not in columns:
        df = _with_explain_columns(df)
        columns = list(df.columns)
    missing = [c for c in order if c not in columns]
    if missing:
        raise ValueError(f"table {table!r} is missing columns {missing}; expected {order}")
    order += [c for c in columns if c not in order]
    out: dict[str, pd.Series] = {}
    for col in order:
        dtype = column_dtype(table, col) or _infer_dtype(df[col])
        out[col] = _coerce(df[col].reset_index(drop=True), dtype, table, col)
    result = pd.DataFrame(out, index=pd.RangeIndex(len(df)), columns=order)
    keys = list(SORT_KEYS[table])
    if len(result) > 1:
        result = result.sort_values(keys, kind="mergesort", na_position="last").reset_index(drop=True)
    return result


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


def tables_from_recorder(recorder: Recorder) -> dict[str, pd.DataFrame]:
    """All five tables of a run as DataFrames, keyed by :data:`TABLE_NAMES` (in that order)."""
    return {name: frame_from_arrow(table) for name, table in arrow_tables_from_recorder(recorder).items()}


def empty_table(table: str, num_groups: int) -> pd.DataFrame:
    """A zero-row table with the contract columns and dtypes."""
    return normalize_table(table, {c: [] for c in contract_columns(table, num_groups)})
