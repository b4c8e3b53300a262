"""``hybridsim verify`` / ``fuzz`` without vLLM: exit 2 naming the install command (no vLLM needed)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sim.cli import app
from sim.verify import vllm_side

SCENARIO = Path(__file__).resolve().parents[2] / "scenarios" / "repro" / "divergence-mamba-deeper.yaml"


@pytest.fixture
def no_vllm(monkeypatch):
    def missing():
        raise vllm_side.VllmMissing("No module named 'vllm'")

    monkeypatch.setattr(vllm_side, "_load_vllm", missing)


@pytest.mark.parametrize("args", [["verify", str(SCENARIO)], ["fuzz", "--count", "2", "--vllm"]])
def test_missing_vllm_is_bad_input_naming_make_vllm_env(no_vllm, args, tmp_path):
    result = CliRunner().invoke(app, [*args, *(["-o", str(tmp_path)] if args[0] == "fuzz" else [])])
    assert result.exit_code == 2, result.output
    assert "make vllm-env" in result.output


def test_fuzz_without_vllm_writes_the_scenarios(tmp_path):
    result = CliRunner().invoke(app, ["fuzz", "--seed", "4", "--count", "3", "-o", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fuzz-4-0.yaml", "fuzz-4-1.yaml", "fuzz-4-2.yaml"]


def test_the_missing_vllm_message_says_it_once(monkeypatch):
    """Through the real import: ``torch`` made unimportable (a ``None`` entry in ``sys.modules``)."""
    monkeypatch.setattr(vllm_side, "_VLLM", {})
    monkeypatch.setitem(sys.modules, "torch", None)
    result = CliRunner().invoke(app, ["verify", str(SCENARIO)])
    assert result.output.count("make vllm-env") == 1, result.output
    assert result.output.count("not installed") == 1, result.output


def test_fuzz_without_out_writes_to_results_fuzz_seed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["fuzz", "--seed", "4", "--count", "2"])
    assert result.exit_code == 0, result.output
    folder = Path("results") / "fuzz-4"
    assert f"generated 2 scenarios in {folder}" in result.output
    assert sorted(p.name for p in (tmp_path / folder).iterdir()) == ["fuzz-4-0.yaml", "fuzz-4-1.yaml"]
