"""The batch driver: a fixed list of runs through the sweep executors."""

from __future__ import annotations

from pathlib import Path

import pytest

from sim.sweep.batch import BatchError, BatchRun, run_batch
from sim.sweep.grid import SweepError
from sim.trace.bundle import load_result

pytestmark = pytest.mark.slow  # end-to-end: runs whole scenarios (make test-fast skips it)

REPRO = Path(__file__).resolve().parents[2] / "scenarios" / "repro"


def test_runs_write_bundles_in_the_given_order(tmp_path: Path) -> None:
    runs = [
        BatchRun("b", REPRO / "taint-propagation.yaml", ("outputs.plots=false",)),
        BatchRun("a", REPRO / "divergence-fa-deeper.yaml", ("outputs.plots=false", "scheduler.prefix_policy=pr48425")),
    ]
    bundles = run_batch(runs, tmp_path)
    assert list(bundles) == ["b", "a"]
    assert bundles["a"] == tmp_path / "a"
    assert load_result(bundles["a"]).summary["policy"] == "pr48425"
    assert not (tmp_path / "b" / "plots").exists()


def test_a_failed_run_is_named_after_all_ran(tmp_path: Path) -> None:
    runs = [BatchRun("missing", tmp_path / "nope.yaml"), BatchRun("ok", REPRO / "taint-propagation.yaml")]
    with pytest.raises(BatchError, match="missing: "):
        run_batch(runs, tmp_path / "out")
    assert (tmp_path / "out" / "ok" / "summary.json").is_file()


def test_duplicate_ids_are_rejected_before_running(tmp_path: Path) -> None:
    with pytest.raises(SweepError, match="duplicate batch run ids: x"):
        run_batch([BatchRun("x", REPRO / "a.yaml"), BatchRun("x", REPRO / "b.yaml")], tmp_path)
    assert not any(tmp_path.iterdir())
