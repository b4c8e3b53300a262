"""Every limit holds before memory is spent (issue 36, class 7): each case runs in a subprocess whose address
space is capped (RLIMIT_AS), so a limit checked too late fails as MemoryError instead of passing unnoticed."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hostile.common import BASE

CAP = 3 << 30  # address space, not RSS: the interpreter with numpy, pandas and pyarrow maps about 1.5 GiB


def _capped(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (CAP, CAP))

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    return subprocess.run(
        [sys.executable, "-m", "sim", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=limit,
        env=env,
    )


def _assert_refused(res: subprocess.CompletedProcess, *fragments: str) -> None:
    assert res.returncode == 2, res.stdout + res.stderr
    assert "Traceback" not in res.stderr and "MemoryError" not in res.stderr, res.stderr[-2000:]
    assert len(res.stderr.splitlines()) == 1, res.stderr
    for fragment in fragments:
        assert fragment in res.stderr, res.stderr


def test_a_3m_row_parquet_trace_is_refused_at_the_request_limit(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    n = 3_000_000
    table = pa.table(
        {
            "id": pa.array(np.arange(n, dtype=np.int64)),
            "at": pa.array(np.zeros(n)),
            "max_tokens": pa.array(np.full(n, 2, dtype=np.int64)),
            "token_ids": pa.array([[1, 2, 3]] * 1000, type=pa.list_(pa.int64())).take(np.zeros(n, dtype=np.int64)),
        }
    )
    pq.write_table(table, tmp_path / "big.parquet", compression="zstd")
    res = _capped(["workload", "stats", str(tmp_path / "big.parquet"), "--format", "requests"], tmp_path)
    _assert_refused(res, "big.parquet", "3000000 rows", "HYBRIDSIM_MAX_REQUESTS")


def test_a_small_parquet_that_expands_to_many_token_ids_is_refused(tmp_path: Path, monkeypatch) -> None:
    """The 63 KB file of the issue expands to 600M ids; building one costs the test 5 GB, so the same shape is
    made 60x smaller and the limit lowered to match: refused from the metadata, nothing expanded."""
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    ids = pa.array([np.zeros(100_000, dtype=np.int64)] * 100, type=pa.list_(pa.int64()))
    table = pa.table({"id": np.arange(100), "at": np.zeros(100), "max_tokens": np.full(100, 2), "token_ids": ids})
    pq.write_table(table, tmp_path / "expand.parquet", compression="zstd")
    assert (tmp_path / "expand.parquet").stat().st_size < 200_000
    monkeypatch.setenv("HYBRIDSIM_MAX_TOKEN_IDS", "1000000")
    res = _capped(["workload", "stats", str(tmp_path / "expand.parquet"), "--format", "requests"], tmp_path)
    _assert_refused(res, "expand.parquet", "10000000", "HYBRIDSIM_MAX_TOKEN_IDS")


def test_dev_zero_as_a_scenario_is_refused_without_reading(tmp_path: Path) -> None:
    _assert_refused(_capped(["validate", "/dev/zero"], tmp_path), "/dev/zero", "character device")


def test_workload_stats_limit_with_a_huge_output_length(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 10, "output_length": 1000000000000000, "hash_ids": [1]}\n' * 20)
    _assert_refused(_capped(["workload", "stats", str(trace), "--limit", "10"], tmp_path), "output_length")


def test_a_denormal_bf16_flops_is_refused_before_running(tmp_path: Path) -> None:
    scenario = tmp_path / "s.yaml"
    scenario.write_text(
        BASE.replace("clock: steps", "clock: time\nmodel: {preset: nemotron-h-8b}").replace(
            "cache: {block_size: 16, num_blocks: 50, groups: [full_attention, mamba]}", "cache: {num_blocks: 60}"
        )
        + "hardware: {preset: h100-80g, overrides: {bf16_flops: 1.0e-320}}\n"
    )
    res = _capped(["run", str(scenario), "-o", str(tmp_path / "out"), "-q", "--no-plots"], tmp_path)
    _assert_refused(res, "hardware.overrides.bf16_flops")
