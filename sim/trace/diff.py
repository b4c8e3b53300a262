"""``hybridsim trace diff A B``: the first difference between two traces.

Both sides are directories holding table files (a full result bundle, or a
golden directory with only the CSVs of some tables). Each table is read into
the schema of :mod:`sim.trace.tables` (so Parquet and CSV compare equal when
their data is equal) and sorted deterministically; rows are then compared *by
position*. For each table the report gives the row counts, the columns present
on one side only, the first differing row with ``context`` rows either side,
the columns that differ in that row, and the row's key (``seq`` for
``kv_events``, ``step``/``request_id`` for ``admissions``, ...). When one table
is a prefix of the other the first difference is the first extra row.

A side that is a result bundle (it has ``summary.json`` or ``manifest.json``)
is checked against its manifest first (:func:`sim.trace.atomic.check_bundle`):
an inconsistent bundle (missing table, row count or hash that differs) is an
error; a partial bundle, or one without a manifest, is an error unless
``allow_partial`` (then the report says so above the verdict). A golden
directory (tables only, with or without its ``kind: golden`` manifest) is
compared as it is.

Exit codes of :func:`main`: 0 same, 1 differ, 2 error (missing directory or
table, unreadable file, inconsistent or partial bundle).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from sim.trace.bundle import find_table_file, read_table
from sim.trace.tables import TABLE_NAMES

DEFAULT_TABLES: tuple[str, ...] = ("kv_events", "admissions")

#: Columns that identify a row to a reader (shown with the first difference).
KEY_COLUMNS: dict[str, tuple[str, ...]] = {
    "kv_events": ("seq", "step"),
    "admissions": ("step", "request_id"),
    "requests": ("request_id",),
    "schedule": ("step", "request_id"),
    "steps": ("step",),
}


class TraceDiffError(ValueError):
    """A trace could not be compared (missing directory or table, bad file)."""


@dataclass
class TableDiff:
    """Comparison of one table between side A and side B.

    ``first_row`` is the position (after the deterministic sort) of the first
    row that differs or exists on one side only; ``None`` when the tables are
    equal. ``context_a`` / ``context_b`` are the rows ``first_row - context``
    to ``first_row + context`` of each side (fewer at the ends).
    """

    table: str
    rows_a: int
    rows_b: int
    only_in_a: list[str] = field(default_factory=list)
    only_in_b: list[str] = field(default_factory=list)
    first_row: int | None = None
    columns: list[str] = field(default_factory=list)
    key: dict[str, object] = field(default_factory=dict)
    context_a: pd.DataFrame | None = None
    context_b: pd.DataFrame | None = None

    @property
    def identical(self) -> bool:
        return self.first_row is None and not self.only_in_a and not self.only_in_b

    def format(self) -> str:
        if self.identical:
            return f"{self.table}: identical ({self.rows_a} rows)"
        lines = [f"{self.table}: DIFFERENT (A has {self.rows_a} rows, B has {self.rows_b})"]
        if self.only_in_a:
            lines.append(f"  columns only in A: {', '.join(self.only_in_a)}")
        if self.only_in_b:
            lines.append(f"  columns only in B: {', '.join(self.only_in_b)}")
        if self.first_row is None:
            return "\n".join(lines)
        where = ", ".join(f"{k}={v}" for k, v in self.key.items())
        what = f"columns differ: {', '.join(self.columns)}" if self.columns else "row exists on one side only"
        lines.append(f"  first difference at row {self.first_row}" + (f" ({where})" if where else "") + f"; {what}")
        lines.extend("  " + line for line in _side_by_side(self))
        return "\n".join(lines)


@dataclass
class DiffReport:
    """Per-table comparison of two trace directories."""

    a: Path
    b: Path
    tables: list[TableDiff]
    warnings: list[str] = field(default_factory=list)

    @property
    def identical(self) -> bool:
        return all(t.identical for t in self.tables)

    def format(self) -> str:
        head = f"A: {self.a}\nB: {self.b}"
        verdict = "traces are identical" if self.identical else "traces differ"
        notes = [f"warning: {w}" for w in self.warnings]
        return "\n".join([head] + [t.format() for t in self.tables] + notes + [verdict]) + "\n"


def _side_by_side(d: TableDiff) -> list[str]:
    """Unified-diff-like rows: ``  `` equal, ``- `` A only/as in A, ``+ `` B only/as in B."""
    a, b = d.context_a, d.context_b
    assert a is not None and b is not None, "side by side needs both contexts"
    cols = [c for c in a.columns if c in b.columns]
    both = pd.concat([a[cols], b[cols]])
    rendered = both.astype(object).where(both.notna(), "<NA>").astype(str)
    width = {c: max(len(c), *(len(v) for v in rendered[c])) if len(rendered) else len(c) for c in cols}

    def fmt(values: Sequence[str]) -> str:
        return "  ".join(str(v).rjust(width[c]) for c, v in zip(cols, values))

    ra, rb = rendered.iloc[: len(a)], rendered.iloc[len(a) :]
    out = ["        row  " + fmt(cols)]
    positions = sorted(set(a.index) | set(b.index))
    for pos in positions:
        va = ra.loc[[pos]].iloc[0].tolist() if pos in a.index else None
        vb = rb.loc[[pos]].iloc[0].tolist() if pos in b.index else None
        if va is not None and va == vb:
            out.append(f"  {pos:>9}  " + fmt(va))
            continue
        marker = ">" if pos == d.first_row else " "
        if va is not None:
            out.append(f"{marker}-{pos:>9}  " + fmt(va))
        if vb is not None:
            out.append(f"{marker}+{pos:>9}  " + fmt(vb))
    return out


def _column_mismatch(a: pd.Series, b: pd.Series) -> np.ndarray:
    """Per-row inequality of two equal-length columns, NaN/NA equal to NaN/NA."""
    na_a, na_b = a.isna().to_numpy(), b.isna().to_numpy()
    va, vb = a.to_numpy(dtype=object), b.to_numpy(dtype=object)
    va[na_a], vb[na_b] = None, None
    eq = np.equal(va, vb, dtype=object).astype(bool)
    return ~np.where(na_a | na_b, na_a & na_b, eq)


def compare_tables(table: str, a: pd.DataFrame, b: pd.DataFrame, context: int = 3) -> TableDiff:
    """Compare two normalized tables by position."""
    d = TableDiff(
        table=table,
        rows_a=len(a),
        rows_b=len(b),
        only_in_a=[c for c in a.columns if c not in b.columns],
        only_in_b=[c for c in b.columns if c not in a.columns],
    )
    common = [c for c in a.columns if c in b.columns]
    n = min(len(a), len(b))
    mismatch = {
        c: _column_mismatch(a[c].iloc[:n].reset_index(drop=True), b[c].iloc[:n].reset_index(drop=True)) for c in common
    }
    any_row = np.zeros(n, dtype=bool)
    for m in mismatch.values():
        any_row |= m
    if any_row.any():
        first = int(np.argmax(any_row))
        d.columns = [c for c in common if mismatch[c][first]]
    elif len(a) != len(b):
        first = n
    else:
        return d
    d.first_row = first
    side = a if first < len(a) else b
    d.key = {k: _plain(side[k].iloc[first]) for k in KEY_COLUMNS[table] if k in side.columns}
    lo, hi = max(0, first - context), first + context + 1
    d.context_a, d.context_b = a.iloc[lo:hi], b.iloc[lo:hi]
    return d


def _plain(value: object) -> object:
    return value.item() if isinstance(value, np.generic) else value


def _load_side(directory: Path, table: str) -> pd.DataFrame:
    file = find_table_file(directory, table)
    if file is None:
        raise TraceDiffError(f"{directory}: table {table!r} not found (no {table}.parquet or {table}.csv)")
    return read_table(table, file)


def _check_side(directory: Path, allow_partial: bool) -> str | None:
    """Refuse an inconsistent bundle (and a partial or unverified one unless allowed); the warning to show."""
    from sim.trace.atomic import MANIFEST_FILE, check_bundle, read_manifest

    if not ((directory / MANIFEST_FILE).exists() or (directory / "summary.json").exists()):
        return None  # a golden directory: tables only
    manifest = read_manifest(directory)
    if manifest is not None and manifest.get("kind") == "golden":
        return None  # a golden directory written by `golden regenerate`: its tables are compared as they are
    check = check_bundle(directory)
    hint = "; compare it anyway with --allow-partial"
    if not check.has_manifest:
        if not allow_partial:
            raise TraceDiffError(f"{directory}: unverified bundle: {check.problems[0]}{hint}")
        return f"{directory} is unverified (no manifest)"
    if not check.ok:
        raise TraceDiffError(check.describe())
    if check.partial:
        if not allow_partial:
            raise TraceDiffError(check.describe() + hint)
        return check.describe()
    return None


def diff_traces(
    a_dir: str | Path,
    b_dir: str | Path,
    tables: Sequence[str] = DEFAULT_TABLES,
    context: int = 3,
    allow_partial: bool = False,
) -> DiffReport:
    """Compare ``tables`` of two trace directories; raises :class:`TraceDiffError` if one cannot be read
    or is not a whole bundle (see the module docstring)."""
    a, b = Path(a_dir), Path(b_dir)
    for d in (a, b):
        if not d.is_dir():
            raise TraceDiffError(f"trace directory {d} does not exist")
    warnings = [w for w in (_check_side(a, allow_partial), _check_side(b, allow_partial)) if w]
    if context < 0:
        raise TraceDiffError(f"context must be >= 0, got {context}")
    unknown = [t for t in tables if t not in TABLE_NAMES]
    if unknown:
        raise TraceDiffError(f"unknown tables {unknown}; valid tables: {', '.join(TABLE_NAMES)}")
    results = []
    for table in tables:
        try:
            ta, tb = _load_side(a, table), _load_side(b, table)
        except TraceDiffError:
            raise
        except (ValueError, OSError) as exc:
            raise TraceDiffError(str(exc)) from None
        results.append(compare_tables(table, ta, tb, context))
    return DiffReport(a=a, b=b, tables=results, warnings=warnings)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m sim.trace.diff A B [--tables kv_events,admissions] [--context 3]``."""
    parser = argparse.ArgumentParser(prog="hybridsim trace diff", description=__doc__.splitlines()[0])
    parser.add_argument("a")
    parser.add_argument("b")
    parser.add_argument(
        "--tables", default=",".join(DEFAULT_TABLES), help=f"comma-separated, from {', '.join(TABLE_NAMES)}"
    )
    parser.add_argument("--context", type=int, default=3)
    parser.add_argument("--allow-partial", action="store_true", help="compare partial or unverified bundles")
    args = parser.parse_args(argv)
    try:
        report = diff_traces(
            args.a, args.b, [t for t in args.tables.split(",") if t], args.context, allow_partial=args.allow_partial
        )
    except TraceDiffError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write(report.format())
    return 0 if report.identical else 1


if __name__ == "__main__":
    sys.exit(main())
