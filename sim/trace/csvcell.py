"""CSV cells that a spreadsheet never runs as a formula, read back to the exact text (docs/results.md).

A spreadsheet opening a CSV file takes a cell that starts with ``=``, ``+``, ``-`` or ``@`` (and, in some,
a tab or carriage return) as a formula: a request id ``=HYPERLINK(...)`` or ``+cmd|' /C calc'!A0`` in
``requests.csv`` would run. Every text cell hybridsim writes to a CSV file is therefore *neutralised*:
one that starts with such a character, or with the quote ``'`` itself, gets a leading ``'`` (the
spreadsheet convention for "text, not a formula"). Reading a CSV table back *restores* it by dropping that
one quote, so the round trip is exact for every string (the rule is a bijection: a written cell starts with
``'`` exactly when a quote was added).

Only text cells are touched: numbers (``-1.5``) are written as numbers. The neutralisation happens at the CSV
write boundary and is undone at the CSV read boundary, whatever builds the tables in between.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pandas is imported by the functions that use it (the CLI's import budget)
    import pandas as pd

#: First characters that make a spreadsheet evaluate a cell (OWASP's list), plus the quote that marks one.
TRIGGERS = ("=", "+", "-", "@", "\t", "\r", "'")


def neutralise(text: str) -> str:
    """``text`` as a CSV cell: a leading ``'`` added when it starts with one of :data:`TRIGGERS`."""
    return "'" + text if text.startswith(TRIGGERS) else text


def restore(cell: str) -> str:
    """The text :func:`neutralise` wrote ``cell`` for."""
    return cell[1:] if cell.startswith("'") else cell


def _map_text(column: pd.Series, fn: Any) -> pd.Series:
    import pandas as pd

    if not (pd.api.types.is_object_dtype(column.dtype) or pd.api.types.is_string_dtype(column.dtype)):
        return column
    return column.map(lambda v: fn(v) if isinstance(v, str) else v)


def neutralise_frame(df: pd.DataFrame) -> pd.DataFrame:
    """A copy of ``df`` whose text cells are :func:`neutralise`-d (numeric columns are unchanged)."""
    return df.assign(**{str(c): _map_text(df[c], neutralise) for c in df.columns}) if len(df.columns) else df


def restore_frame(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` read from a CSV file as text, with every cell :func:`restore`-d."""
    return df.assign(**{str(c): _map_text(df[c], restore) for c in df.columns}) if len(df.columns) else df


def neutralise_row(row: list[Any]) -> list[Any]:
    """A row for :func:`csv.writer` with its text cells :func:`neutralise`-d."""
    return [neutralise(v) if isinstance(v, str) else v for v in row]
