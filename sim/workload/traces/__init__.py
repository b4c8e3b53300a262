"""Trace readers: each turns a file into request drafts in file order."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

from sim.workload.draft import RequestDraft
from sim.workload.spec import TraceSpec
from sim.workload.traces.azure import read_azure
from sim.workload.traces.mooncake import read_mooncake
from sim.workload.traces.qwen import read_qwen
from sim.workload.traces.records import read_records


def read_trace(spec: TraceSpec, base_dir: Path, hash_block_size: int | None) -> Iterable[RequestDraft]:
    """Drafts of the trace ``spec.path`` (relative to ``base_dir``), in file order, streamed where the
    format allows (JSONL: one line at a time; Azure CSV needs its earliest timestamp first).

    ``hash_block_size`` only validates formats that expand hash blocks (and is
    ignored with ``allow_merged_blocks``).
    """
    path = base_dir / spec.path
    if spec.allow_merged_blocks:
        hash_block_size = None
    if spec.format == "mooncake":
        return read_mooncake(path, hash_block_size)
    if spec.format == "qwen":
        return read_qwen(path, hash_block_size)
    if spec.format == "azure":
        return read_azure(path)
    return read_records(path)


__all__ = ["read_trace", "read_mooncake", "read_qwen", "read_azure", "read_records"]
