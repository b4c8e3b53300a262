"""The same scenario gives byte-identical tables: twice in one process, and in two separate processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sim.api import run_scenario
from sim.trace.tables import TABLE_NAMES

pytestmark = pytest.mark.slow  # end-to-end: runs whole scenarios (make test-fast skips it)

ROOT = Path(__file__).resolve().parent.parent
# Step clock, generator workload (seeded RNG), evictions in both groups: every source of order matters here.
SCENARIO = ROOT / "scenarios" / "golden-pressure.yaml"
OVERRIDES = ["outputs.tables_format=csv", "outputs.plots=false"]


def table_bytes(directory: Path) -> dict[str, bytes]:
    return {name: (directory / f"{name}.csv").read_bytes() for name in TABLE_NAMES}


def test_two_runs_in_one_process_write_identical_bytes(tmp_path: Path) -> None:
    from sim.config import load_scenario

    for name in ("a", "b"):
        run_scenario(load_scenario(SCENARIO, OVERRIDES), tmp_path / name)
    a, b = table_bytes(tmp_path / "a"), table_bytes(tmp_path / "b")
    assert a == b
    assert (tmp_path / "a" / "summary.json").read_bytes() == (tmp_path / "b" / "summary.json").read_bytes()
    assert len(a["kv_events"].splitlines()) > 1000


def test_two_processes_write_identical_bytes(tmp_path: Path) -> None:
    procs = []
    for name, hashseed in (("a", "1"), ("b", "2")):  # different str hashing: no set/dict-order dependence
        env = {**os.environ, "PYTHONHASHSEED": hashseed}
        cmd = [
            sys.executable,
            "-m",
            "sim",
            "run",
            str(SCENARIO),
            "-o",
            str(tmp_path / name),
            "--format",
            "csv",
            "--no-plots",
            "-q",
        ]
        procs.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err.decode()
    assert table_bytes(tmp_path / "a") == table_bytes(tmp_path / "b")
