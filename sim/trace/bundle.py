"""Result bundles: the directory a run writes (docs/design.md §6), and reading it back.

A bundle holds ``scenario.resolved.yaml``, ``summary.json`` and one file per
table, ``<table>.parquet`` (default) or ``<table>.csv``. Writing the same data
twice gives the same bytes:

* ``summary.json``: keys sorted at every level, two-space indent, a final
  newline; NaN and ±inf become ``null`` (JSON has neither), numpy scalars become
  Python numbers, tuples become lists.
* Parquet: an explicit Arrow schema per column (int64 / float64 / bool /
  string), no pandas or Arrow schema metadata, fixed compression (zstd) and
  format version; the only writer-dependent bytes are the ``created_by`` string
  that names the pyarrow version.
* CSV: ``,``-separated, ``\\n`` line ends, header row, floats in Python's
  shortest round-trip form, missing values as empty fields, booleans as
  ``True``/``False``.

Reading never unpickles: Parquet through pyarrow, CSV as text coerced to the
schema of :mod:`sim.trace.tables`. A bundle marked ``"partial": true`` in its
summary was cut short (e.g. a run stopped by a crash or an interrupt); its
tables hold what was recorded up to that point.

A bundle is written whole (:mod:`sim.trace.atomic`): staged in a sibling
folder, ``manifest.json`` (tables, row counts, SHA-256 of every file,
``partial`` and its reason) written last, then renamed into place.
:func:`load_result` checks the manifest before trusting the files.
"""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Callable, Iterator, Literal, Mapping, TypeAlias

import numpy as np
import pyarrow as pa

from sim.inputfile import check_regular, read_text
from sim.trace.bundle_files import check_group_columns, check_summary, read_json
from sim.trace.csvcell import neutralise_frame, restore_frame
from sim.trace.schema import TABLE_NAMES, ArrowTables, infer_num_groups

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow._parquet

SCENARIO_FILE = "scenario.resolved.yaml"
SUMMARY_FILE = "summary.json"
TABLE_FORMATS = ("parquet", "csv")

TablesFormat = Literal["parquet", "csv"]

_ARROW_TYPES = {"int64": pa.int64(), "Int64": pa.int64(), "float64": pa.float64(), "bool": pa.bool_()}


# ---------------------------------------------------------------- JSON


def json_safe(value: Any) -> Any:
    """A JSON-able copy of ``value``: NaN/inf → None, numpy → Python, tuples → lists."""
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise ValueError(f"summary keys must be strings, got {k!r}")
            out[k] = json_safe(v)
        return out
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        f = float(value)
        return f if math.isfinite(f) else None
    if value is None or isinstance(value, str):
        return value
    if type(value).__name__ == "NAType" and type(value).__module__.startswith("pandas"):
        return None  # pd.NA (pandas itself is imported only where a table is a DataFrame)
    raise ValueError(f"summary value {value!r} of type {type(value).__name__} is not JSON-able")


def dumps_summary(summary: Mapping[str, Any]) -> str:
    """The exact text of ``summary.json`` for ``summary`` (deterministic)."""
    return json.dumps(json_safe(summary), sort_keys=True, indent=2, allow_nan=False, ensure_ascii=False) + "\n"


# ---------------------------------------------------------------- tables I/O


def _arrow_table(df: pd.DataFrame) -> pa.Table:
    """A normalized DataFrame as an Arrow table of the same declared types (``sim.trace.schema``)."""
    import pandas as pd

    arrays, fields = [], []
    for col in df.columns:
        s = df[col]
        if isinstance(s.dtype, pd.Int64Dtype):
            typ = pa.int64()
        elif s.dtype == "str" or s.dtype == object:
            typ = pa.string()
        else:
            typ = _ARROW_TYPES.get(str(s.dtype))
            if typ is None:
                raise ValueError(f"column {col!r} has dtype {s.dtype} that a bundle cannot store")
        arrays.append(pa.array(s, type=typ, from_pandas=True))
        fields.append(pa.field(col, typ, nullable=True))
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))


#: How a bundle's Parquet tables are written (pyarrow options; the row groups are given by ``write_table``).
_PARQUET_OPTIONS: dict = dict(
    compression="zstd", version="2.6", use_dictionary=True, write_statistics=True, store_schema=False
)
#: What ``pyarrow.parquet.ParquetWriter`` adds to those when it opens its file writer (no flavor, no filesystem).
_PARQUET_WRITER_DEFAULTS: dict = dict(
    use_deprecated_int96_timestamps=False,
    writer_engine_version="V2",
    data_page_version="1.0",
    use_compliant_nested_type=True,
)


def parquet_writer(fh: BinaryIO, schema: pa.Schema) -> pyarrow._parquet.ParquetWriter:
    """pyarrow's Parquet file writer on ``fh`` with the bundle's options: the one that
    ``pyarrow.parquet.ParquetWriter`` opens with the same arguments (same bytes: tests/trace/test_parquet_writer.py),
    without importing ``pyarrow.parquet``, whose ``pyarrow.fs`` loads the cloud file systems and ``ssl`` (about
    0.01 s of every run). Close it with ``close()``; every table written must have ``schema``."""
    from pyarrow import _parquet

    return _parquet.ParquetWriter(fh, schema, **_PARQUET_OPTIONS, **_PARQUET_WRITER_DEFAULTS)


def write_table(
    table: pa.Table | pd.DataFrame | Iterator[pa.Table], path: Path, fmt: TablesFormat, *, force: bool = False
) -> None:
    """Write one normalized table (an Arrow table of ``sim.trace.schema``, consecutive parts of one such
    as :meth:`~sim.trace.schema.ArrowTables.batches` gives, or a DataFrame) through
    :func:`sim.trace.output.write_file` (a fresh temporary file renamed into place; a link at ``path``
    refused); same table, same bytes, whole or in parts of :data:`~sim.trace.schema.ROW_GROUP_ROWS` rows
    (a Parquet row group each). Parquet is written by pyarrow as it is; CSV through pandas (the one CSV
    writer, given the parts joined)."""
    from sim.trace.output import write_file
    from sim.trace.schema import ROW_GROUP_ROWS

    parts = table if isinstance(table, Iterator) else None

    def parquet(fh: BinaryIO) -> None:
        pieces = iter([table if isinstance(table, pa.Table) else _arrow_table(table)] if parts is None else parts)
        first = next(pieces)
        writer = parquet_writer(fh, first.schema)
        try:
            for piece in itertools.chain([first], pieces):
                if not piece.schema.equals(first.schema, check_metadata=False):
                    raise ValueError(f"{path}: a part's schema differs from the first part's")
                writer.write_table(piece, row_group_size=ROW_GROUP_ROWS)
        finally:
            writer.close()

    def csv(fh: BinaryIO) -> None:
        from sim.trace.tables import frame_from_arrow

        whole = pa.concat_tables(list(parts)) if parts is not None else table  # type: ignore[arg-type]
        frame = frame_from_arrow(whole) if isinstance(whole, pa.Table) else whole
        neutralise_frame(frame).to_csv(fh, index=False, lineterminator="\n", na_rep="", encoding="utf-8")

    if fmt not in TABLE_FORMATS:
        raise ValueError(f"tables_format {fmt!r} is not one of {TABLE_FORMATS}")
    write_file(path, parquet if fmt == "parquet" else csv, force=force)


def read_table(name: str, path: Path) -> pd.DataFrame:
    """Read one table file (``.parquet`` or ``.csv``) into the schema of :mod:`sim.trace.tables`."""
    import pandas as pd

    from sim.trace.tables import normalize_table

    check_regular(path, f"{name} table")
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        mapper = {pa.int64(): pd.Int64Dtype()}.get
        try:
            parquet = pq.ParquetFile(path)
            check_group_columns(path, parquet.schema_arrow.names)
            df = parquet.read().to_pandas(types_mapper=mapper)
        except (pa.ArrowException, OSError) as exc:
            raise ValueError(f"{path}: cannot read Parquet ({type(exc).__name__})") from None
    elif path.suffix == ".csv":
        try:
            check_group_columns(path, pd.read_csv(path, dtype=str, nrows=0).columns)
            df = restore_frame(pd.read_csv(path, dtype=str, keep_default_na=False, na_filter=False))
        except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, OSError) as exc:
            raise ValueError(f"{path}: cannot read CSV ({type(exc).__name__})") from None
    else:
        raise ValueError(f"{path}: table files are .parquet or .csv")
    try:
        return normalize_table(name, df)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None


def find_table_file(directory: Path, name: str) -> Path | None:
    """The file holding table ``name`` in ``directory`` (None if absent; error if both formats)."""
    found = [directory / f"{name}.{ext}" for ext in TABLE_FORMATS if (directory / f"{name}.{ext}").is_file()]
    if len(found) > 1:
        raise ValueError(f"{directory}: table {name!r} exists as both {found[0].name} and {found[1].name}")
    return found[0] if found else None


# ---------------------------------------------------------------- bundle


def _inside(directory: Path, name: str) -> Path:
    """``directory / name``, refusing any name that is not a plain file name (so it cannot leave
    ``directory``); the path is not resolved, so a bundle under a linked parent folder keeps one spelling."""
    if not name or "/" in name or "\\" in name or name in (".", "..") or "\x00" in name:
        raise ValueError(f"refusing to write {name!r}: bundle files are plain names inside the bundle directory")
    return directory / name


def write_result(
    out_dir: str | Path,
    *,
    scenario_yaml: str,
    summary: Mapping[str, Any],
    tables: Mapping[str, pd.DataFrame] | ArrowTables,
    tables_format: TablesFormat = "parquet",
    partial: bool = False,
    reason: str | None = None,
    extras: Callable[[Path], None] | None = None,
    force: bool = False,
    notes: list[str] | None = None,
) -> Path:
    """Write a result bundle to ``out_dir`` whole (see :mod:`sim.trace.atomic`) and return its path.

    ``tables`` maps table names (:data:`~sim.trace.tables.TABLE_NAMES`) to
    DataFrames, normalized before writing, or is a run's :class:`~sim.trace.schema.ArrowTables`,
    written as they are. ``summary`` gains the key
    ``partial``; a caller-given ``partial`` must agree with the argument;
    ``reason`` says why a partial bundle was cut short (it goes into the
    manifest). ``extras(stage_dir)`` writes further files (``crash.json``,
    ``replay/``, ``plots/``) into the staged folder before its manifest is
    written. The bundle replaces a previous bundle at ``out_dir`` whole; a
    folder holding files hybridsim did not write is refused unless ``force``
    (then it is kept aside and a line is appended to ``notes``).
    """
    from sim.interrupts import pause_point
    from sim.trace.atomic import staged_bundle
    from sim.trace.output import write_file

    if tables_format not in TABLE_FORMATS:
        raise ValueError(f"tables_format {tables_format!r} is not one of {TABLE_FORMATS}")
    unknown = [n for n in tables if n not in TABLE_NAMES]
    if unknown:
        raise ValueError(f"unknown tables {unknown}; valid tables: {', '.join(TABLE_NAMES)}")
    if "partial" in summary and summary["partial"] is not partial:
        raise ValueError(f"summary['partial'] = {summary['partial']!r} contradicts partial={partial!r}")
    summary_text = dumps_summary({**summary, "partial": partial})
    with staged_bundle(out_dir, force=force) as stage:
        stage.partial, stage.reason = partial, reason if partial else None
        directory = stage.path
        write_file(_inside(directory, SCENARIO_FILE), scenario_yaml, stamped=False)
        pause_point("write")
        write_file(_inside(directory, SUMMARY_FILE), summary_text, stamped=False)
        for name in TABLE_NAMES:
            if name not in tables:
                continue
            path = _inside(directory, f"{name}.{tables_format}")
            if isinstance(tables, ArrowTables):
                write_table(tables.batches(name), path, tables_format)
                rows = tables.num_rows(name)
            else:
                from sim.trace.tables import normalize_table

                table = normalize_table(name, tables[name])
                write_table(table, path, tables_format)
                rows = len(table)
            stage.record_table(name, path, rows)
            # What the table's conversion freed goes back to the system before the next (the C library's
            # allocator keeps freed pages otherwise: 0.2 to 0.3 GB a 1M-row group of a long run).
            pa.default_memory_pool().release_unused()
        if extras is not None:
            extras(directory)
        stage.finish()
        if notes is not None:
            notes.extend(stage.notes)
    return stage.target


@dataclass
class LoadedResult:
    """A result bundle read back: summary, resolved scenario text and the five tables.

    Tables absent from the bundle are empty with the contract columns (the
    number of groups taken from ``summary["groups"]`` or the other tables).
    ``group_kinds`` is ``summary["groups"]`` when the run recorded it (the
    attention type of each KV-cache group, e.g. ``full_attention``, ``mamba``).
    """

    summary: dict[str, Any]
    #: The five tables by name (a run's are an :class:`~sim.trace.schema.ArrowTables`: DataFrames on access).
    tables: Mapping[str, pd.DataFrame]
    scenario_yaml: str = ""
    path: Path | None = None
    group_kinds: list[str] = field(default_factory=list)
    #: With ``workload.sessions``: the ``turns`` and ``sessions`` DataFrames (``sim.results.sessions``),
    #: written under ``sessions/`` in the bundle.
    session_tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    #: With ``cluster.tier``: the ``tier_events`` DataFrame (docs/cluster.md), written under ``tier/``.
    tier_tables: dict[str, pd.DataFrame] = field(default_factory=dict)

    @property
    def kv_events(self) -> pd.DataFrame:
        return self.tables["kv_events"]

    @property
    def admissions(self) -> pd.DataFrame:
        return self.tables["admissions"]

    @property
    def requests(self) -> pd.DataFrame:
        return self.tables["requests"]

    @property
    def schedule(self) -> pd.DataFrame:
        return self.tables["schedule"]

    @property
    def steps(self) -> pd.DataFrame:
        return self.tables["steps"]

    @property
    def partial(self) -> bool:
        return bool(self.summary.get("partial", False))

    @property
    def num_groups(self) -> int:
        return max(
            len(self.group_kinds), infer_num_groups(self.admissions.columns), infer_num_groups(self.steps.columns)
        )

    @classmethod
    def from_tables(
        cls,
        tables: Mapping[str, pd.DataFrame],
        *,
        summary: Mapping[str, Any] | None = None,
        group_kinds: list[str] | None = None,
        scenario_yaml: str = "",
    ) -> "LoadedResult":
        """Wrap in-memory tables (e.g. from :func:`~sim.trace.tables.tables_from_recorder`)."""
        from sim.trace.tables import empty_table, normalize_table

        summary = dict(summary or {})
        kinds = list(group_kinds if group_kinds is not None else summary.get("groups") or [])
        present = {n: normalize_table(n, t) for n, t in tables.items()}
        num_groups = max([len(kinds)] + [infer_num_groups(t.columns) for t in present.values()])
        full = {n: present.get(n, empty_table(n, num_groups)) for n in TABLE_NAMES}
        return cls(summary=summary, tables=full, scenario_yaml=scenario_yaml, group_kinds=kinds)


def load_result(path: str | Path, *, verify: bool = True) -> LoadedResult:
    """Read a bundle written by :func:`write_result` (Parquet or CSV tables).

    With ``verify`` (the default) the bundle must match its manifest (:func:`sim.trace.atomic.check_bundle`):
    a missing manifest, a missing table, a row count or hash that differs raise
    :class:`~sim.trace.atomic.BundleError`. A partial bundle loads, with ``partial`` true and the manifest's
    reason in ``summary["partial_reason"]``.
    """
    from sim.trace.atomic import BundleError, check_bundle

    directory = Path(path)
    if not directory.is_dir():
        raise ValueError(f"result directory {directory} does not exist")
    summary_path = directory / SUMMARY_FILE
    if not summary_path.is_file():
        raise ValueError(f"{directory} is not a result bundle: {SUMMARY_FILE} is missing")
    check = check_bundle(directory) if verify else None
    if check is not None and not check.ok:
        raise BundleError(check.describe())
    summary = check_summary(read_json(summary_path, "run summary"), summary_path)
    if check is not None and check.partial:
        summary["partial"] = True
        summary.setdefault("partial_reason", check.reason)
    scenario_path = directory / SCENARIO_FILE
    scenario_yaml = read_text(scenario_path, "resolved scenario", "yaml_bytes") if scenario_path.is_file() else ""
    tables = {}
    for name in TABLE_NAMES:
        file = find_table_file(directory, name)
        if file is not None:
            tables[name] = read_table(name, file)
    result = LoadedResult.from_tables(tables, summary=summary, scenario_yaml=scenario_yaml)
    result.session_tables = _read_side_tables(directory, SESSIONS_DIR)
    result.tier_tables = _read_side_tables(directory, TIER_DIR)
    result.path = directory
    return result


#: Side tables: a bundle folder and the tables it may hold, written only by runs that have them. ``sessions``:
#: the session tables (``turns``, ``sessions``) of a ``workload.sessions`` run; ``tier``: the shared KV tier's
#: ``tier_events`` of a ``cluster.tier`` run (docs/cluster.md).
SIDE_TABLES: dict[str, tuple[str, ...]] = {"sessions": ("turns", "sessions"), "tier": ("tier_events",)}
SESSIONS_DIR = "sessions"
TIER_DIR = "tier"


def write_side_tables(folder: str, tables: Mapping[str, pd.DataFrame], stage: Path, fmt: TablesFormat) -> None:
    """Side tables into ``stage/<folder>/`` (called while the bundle is staged, so they are in its manifest);
    same frames, same bytes."""
    names = SIDE_TABLES[folder]
    unknown = sorted(set(tables) - set(names))
    if unknown:
        raise ValueError(f"unknown {folder} tables {unknown}; valid: {', '.join(names)}")
    for name in names:
        if name in tables:
            write_table(tables[name].reset_index(drop=True), stage / folder / f"{name}.{fmt}", fmt)


def _read_side_tables(directory: Path, folder: str) -> dict[str, pd.DataFrame]:
    import pandas as pd

    out: dict[str, pd.DataFrame] = {}
    path = directory / folder
    for name in SIDE_TABLES[folder] if path.is_dir() else ():
        file = find_table_file(path, name)
        if file is None:
            continue
        if file.suffix == ".parquet":
            import pyarrow.parquet as pq

            out[name] = pq.read_table(file).to_pandas(types_mapper={pa.int64(): pd.Int64Dtype()}.get)
        else:
            out[name] = restore_frame(pd.read_csv(file))
    return out


#: What the metrics and plots read: a result (run or loaded back) or a plain mapping of tables.
ResultSource: TypeAlias = "LoadedResult | Mapping[str, pd.DataFrame]"


def tables_of(source: ResultSource) -> dict[str, pd.DataFrame]:
    """Every contract table of ``source``; a table it lacks is empty with the contract columns."""
    from sim.trace.tables import empty_table

    if isinstance(source, LoadedResult):
        tables: Mapping[str, pd.DataFrame] = source.tables
    elif isinstance(source, Mapping):
        tables = source
    else:
        raise ValueError(f"expected a result or a mapping of table name to DataFrame, got {type(source).__name__}")
    num_groups = max([0] + [infer_num_groups(t.columns) for t in tables.values()])
    return {n: tables[n] if n in tables else empty_table(n, num_groups) for n in TABLE_NAMES}


def summary_of(source: ResultSource) -> Mapping[str, Any]:
    """The run summary of ``source`` (empty for a plain mapping of tables)."""
    return source.summary if isinstance(source, LoadedResult) else {}
