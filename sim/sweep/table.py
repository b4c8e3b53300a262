"""The combined sweep table (``sweep.parquet``): one row per run, deterministic bytes.

Columns, in this order:

* ``run_id``; one column per grid key path (named by the path, axis order); ``seed``;
  ``status`` (``ok`` | ``failed``); ``error`` (null when ok);
* the run's ``summary.json`` flattened: nested mappings join their keys with ``.``
  (``outcomes.crash``, ``crash.reason``; an empty mapping adds nothing), lists
  become their JSON text; metric
  columns are sorted by name, and a metric whose name equals one of the columns
  above is prefixed with ``summary.``.

Rows are in planned order (grid order, seeds innermost), whatever order the runs
finished in. A column's type is inferred from its non-null values: bool, int64,
float64 (ints and floats mixed) or string; any other mix is stored as the YAML
text of each value, so a column never fails to convert.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping, Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from sim.sweep.grid import yaml_text

FIXED_HEAD = ("run_id",)
FIXED_TAIL = ("seed", "status", "error")


def flatten_summary(summary: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"outcomes": {"ok": 3}, "crash": None, "x": {}}`` -> ``{"outcomes.ok": 3, "crash": None}``.

    An empty mapping adds no column (count mappings omit zero counts, so ``{}`` means "none of any key").
    """
    flat: dict[str, Any] = {}
    for key, value in summary.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten_summary(value, f"{name}."))
        elif isinstance(value, (list, tuple)):
            flat[name] = json.dumps(value, sort_keys=True)
        else:
            flat[name] = value
    return flat


def _column(values: Sequence[Any]) -> pa.Array:
    present = [v for v in values if v is not None]
    kinds = {type(v) for v in present}
    if kinds == {bool}:
        return pa.array(values, type=pa.bool_())
    if kinds == {int}:
        return pa.array(values, type=pa.int64())
    if kinds and kinds <= {int, float}:
        return pa.array([None if v is None else float(v) for v in values], type=pa.float64())
    if kinds <= {str}:
        return pa.array(values, type=pa.string())
    return pa.array([None if v is None else yaml_text(v) for v in values], type=pa.string())


def build_table(grid_keys: Sequence[str], rows: Sequence[Mapping[str, Any]]) -> pa.Table:
    """``rows``: one mapping per run with run_id, values (key -> value), seed, status, error, summary (or None)."""
    fixed = set(FIXED_HEAD) | set(grid_keys) | set(FIXED_TAIL)
    metric_rows = []
    for row in rows:
        flat = flatten_summary(row["summary"] or {})
        metric_rows.append({(f"summary.{k}" if k in fixed else k): v for k, v in flat.items()})
    metric_names = sorted({name for flat in metric_rows for name in flat})
    columns: dict[str, pa.Array] = {"run_id": pa.array([r["run_id"] for r in rows], type=pa.string())}
    for key in grid_keys:
        columns[key] = _column([r["values"][key] for r in rows])
    columns["seed"] = pa.array([r["seed"] for r in rows], type=pa.int64())
    columns["status"] = pa.array([r["status"] for r in rows], type=pa.string())
    columns["error"] = pa.array([r["error"] for r in rows], type=pa.string())
    for name in metric_names:
        columns[name] = _column([flat.get(name) for flat in metric_rows])
    return pa.table(columns)


def write_table(
    table: pa.Table, path: Path, *, known_sha256: str | None = None, force: bool = False, within: Path | None = None
) -> str:
    """Write Parquet through :func:`sim.trace.output.write_file` (a fresh temporary file renamed into place;
    no link followed; an existing file replaced only when its hash is ``known_sha256``, the one the sweep's
    ``sweep.json`` recorded, or with ``force``); same table, same bytes. Returns the file's SHA-256."""
    from sim.trace.atomic import sha256_file
    from sim.trace.output import write_file

    written = write_file(
        path,
        lambda fh: pq.write_table(table, fh, compression="zstd"),
        known_sha256=known_sha256,
        force=force,
        within=within,
        option="-o/--out",
    )
    return sha256_file(written)
