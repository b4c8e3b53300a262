"""Our own request format (``format: requests``): JSONL or Parquet.

JSONL: one object a line, the fields of a scripted request (docs/design.md §7):
``{"id", "at", "prompt": [segments], "max_tokens", "output_len"?, "priority"?,
"lora"?, "cache_salt"?}``, where a segment is ``{"content", "start"?,
"tokens"}``, ``{"output_of", "start"?, "tokens"}`` or ``{"ids": [...]}``; or a
``"token_ids": [...]`` list instead of ``"prompt"``. ``at`` is seconds (steps
with ``clock: steps``).

Parquet (``.parquet``): the same fields as columns. ``token_ids`` is a list
column; ``prompt`` is a list-of-struct column or a JSON string per row. Token
id columns are sliced as NumPy views of the Arrow buffers (no per-token
Python objects). Rows count as lines in error messages (row 1 = line 1).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Iterator

import numpy as np
from pydantic import ValidationError

from sim.core.tokens import IdsSegment
from sim.workload.draft import RequestDraft
from sim.workload.errors import WorkloadError
from sim.workload.script import record_prompt, to_draft
from sim.workload.spec import RecordSpec, RequestFields
from sim.workload.traces.common import jsonl_objects, open_trace, where

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.parquet as pq


def _explain(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        field = ".".join(str(p) for p in err["loc"]) or "record"
        parts.append(f"{field}: {err['msg']}")
    return "; ".join(parts)


def _check_unique(request_id: str, loc: str, seen: dict[str, str]) -> None:
    if request_id in seen:
        raise WorkloadError(f"{loc}: duplicate request id {request_id!r} (first at {seen[request_id]})")
    seen[request_id] = loc


def _read_jsonl(path: Path) -> Iterator[RequestDraft]:
    from sim.limits import limit, over

    seen: dict[str, str] = {}
    cap, ids = limit("token_ids"), 0
    for order, (line, obj) in enumerate(jsonl_objects(path)):
        loc = where(path, line)
        try:
            record = RecordSpec.model_validate(obj)
        except ValidationError as exc:
            raise WorkloadError(f"{loc}: {_explain(exc)}") from None
        _check_unique(record.id, loc, seen)
        prompt = record_prompt(record)
        ids += sum(s.length for s in prompt if isinstance(s, IdsSegment))
        if ids > cap:
            raise WorkloadError(f"{loc}: " + over("token_ids", ids, f"the trace holds {ids} token ids so far"))
        yield to_draft(record, order, prompt)


def _token_id_column(column: pa.ChunkedArray, path: Path) -> list[np.ndarray | None]:
    """Per row, a view of its token ids (``None`` for a null row)."""
    import pyarrow as pa

    array = column.combine_chunks()
    if not (pa.types.is_list(array.type) or pa.types.is_large_list(array.type)):
        raise WorkloadError(f"{path}: column 'token_ids' must be a list of integers, not {array.type}")
    if not pa.types.is_integer(array.type.value_type):
        raise WorkloadError(f"{path}: column 'token_ids' must hold integers, not {array.type.value_type}")
    offsets = array.offsets.to_numpy()
    values = array.values.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    valid = array.is_valid().to_numpy(zero_copy_only=False)
    return [values[offsets[i] : offsets[i + 1]] if valid[i] else None for i in range(len(array))]


def _strip_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_strip_nulls(v) for v in value]
    return value


def _check_parquet_size(path: Path, meta: pq.FileMetaData) -> None:
    """Refuse, from the file's metadata and before any data is read, a Parquet trace with more rows than the
    ``requests`` limit or more token ids than the ``token_ids`` limit (a small compressed file can expand to
    hundreds of millions of ids)."""
    from sim.limits import limit, over

    if meta.num_rows > limit("requests"):
        raise WorkloadError(f"{path}: " + over("requests", meta.num_rows, f"the trace has {meta.num_rows} rows"))
    leaves = [i for i in range(meta.num_columns) if meta.schema.column(i).path.split(".")[0] in ("token_ids", "prompt")]
    ids = sum(meta.row_group(g).column(i).num_values for g in range(meta.num_row_groups) for i in leaves)
    if ids > limit("token_ids"):
        raise WorkloadError(f"{path}: " + over("token_ids", ids, f"its token id and prompt columns hold {ids} values"))


def _read_parquet(path: Path) -> list[RequestDraft]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        with open_trace(path) as fh:
            parquet = pq.ParquetFile(fh)
            _check_parquet_size(path, parquet.metadata)
            table = parquet.read()
    except (pa.ArrowException, OSError) as exc:
        raise WorkloadError(f"{path}: cannot read Parquet ({exc})") from None
    names = table.column_names
    token_ids = _token_id_column(table.column("token_ids"), path) if "token_ids" in names else None
    fields = [n for n in names if n != "token_ids"]
    rows = table.select(fields).to_pylist()
    drafts: list[RequestDraft] = []
    seen: dict[str, str] = {}
    for row_no, row in enumerate(rows, start=1):
        loc = where(path, row_no)
        row = {k: v for k, v in row.items() if v is not None}
        ids = token_ids[row_no - 1] if token_ids is not None else None
        prompt = row.pop("prompt", None)
        if isinstance(prompt, str):
            try:
                prompt = json.loads(prompt)
            except json.JSONDecodeError as exc:
                raise WorkloadError(f"{loc}: 'prompt' is not valid JSON ({exc.msg})") from None
        if (prompt is None) == (ids is None):
            raise WorkloadError(f"{loc}: give exactly one of 'prompt' (segments) or 'token_ids'")
        try:
            if ids is not None:
                if len(ids) == 0:
                    raise WorkloadError(f"{loc}: 'token_ids' must not be empty")
                spec: RequestFields = RequestFields.model_validate(row)
                segments: tuple = (IdsSegment(ids),)
            else:
                record = RecordSpec.model_validate({**row, "prompt": _strip_nulls(prompt)})
                spec, segments = record, record_prompt(record)
        except ValidationError as exc:
            raise WorkloadError(f"{loc}: {_explain(exc)}") from None
        _check_unique(spec.id, loc, seen)
        drafts.append(to_draft(spec, len(drafts), segments))
    return drafts


def read_records(path: Path) -> Iterable[RequestDraft]:
    if path.suffix == ".parquet":
        return _read_parquet(path)
    return _read_jsonl(path)
