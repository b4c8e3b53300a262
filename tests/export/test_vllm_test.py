"""``hybridsim export vllm-test``: the written module is self-contained, readable, passes against vLLM 0.33
and fails when its expectation is edited.

The tests that run vLLM skip when it is not installed, unless ``HYBRIDSIM_REQUIRE_VLLM=1`` (then they fail).
All exported modules run in ONE pytest subprocess (vLLM's import costs about ten seconds).
"""

from __future__ import annotations

import ast
import inspect
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sim.cli import app
from sim.config import load_scenario, scenario_from_text
from sim.export.vllm_test import ExportError, export_vllm_test
from sim.shrink import shrink
from sim.shrink.output import scenario_yaml
from sim.verify import vllm_side

ROOT = Path(__file__).resolve().parents[2]
REPRO = ROOT / "scenarios" / "repro"


def _shrunk(name: str, overrides: list[str]):
    return scenario_from_text(scenario_yaml(shrink(load_scenario(REPRO / name, overrides)).scenario))


@pytest.fixture(scope="module")
def crash_scenario():
    """The shrunk crash of #46453's mamba-deeper case under max_per_group (num_new_tokens > 0)."""
    return _shrunk("pr48425-mamba-deeper-ext16.yaml", ["scheduler.prefix_policy=max_per_group"])


@pytest.fixture(scope="module")
def values_scenario():
    """The shrunk recompute of vLLM's test_hybrid_per_group_hit_divergence_with_connector (pr48425, an evict)."""
    return _shrunk("pr48425-mamba-deeper-ext16.yaml", [])


@pytest.fixture(scope="module")
def fuzz_scenario():
    """The shrunk crash of hybridsim fuzz's scenario (seed 1, index 80)."""
    from sim.config.scenario import Scenario
    from sim.verify.fuzz import generate

    return scenario_from_text(scenario_yaml(shrink(Scenario.model_validate(generate(1, 80))).scenario))


def test_the_module_embeds_the_harness_verbatim_and_imports_no_hybridsim(crash_scenario) -> None:
    text = export_vllm_test(crash_scenario, "crash.yaml")
    assert inspect.getsource(vllm_side) in text
    tree = ast.parse(text)
    imported = {
        alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names
    }
    imported |= {
        node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module
    }
    assert "sim" not in imported
    assert imported <= set(sys.stdlib_module_names) | {"vllm", "torch"}
    assert text.count("\nEXPECTED = {") == 1 and text.count("\nSCRIPT = {") == 1
    assert "'crash': {'step': 1, 'request': 'r', 'type': 'AssertionError', 'message': 'num_new_tokens > 0'}" in text


def test_requests_are_named_and_evicted_blocks_commented(values_scenario) -> None:
    text = export_vllm_test(values_scenario, "values.yaml")
    assert re.search(r"^DOC = \d+ \* TOKEN_STRIDE  # doc$", text, re.M)
    for request in values_scenario.workload.requests:
        assert f"'id': {request.id!r}" in text and f"# {request.id}: doc[0:" in text
    evict = values_scenario.actions[0]
    assert evict.evict is not None
    block = evict.evict.blocks[0]
    assert (
        f"evict {evict.evict.prefix_of}'s prompt block {block} (tokens {block * 16}-{block * 16 + 15}) "
        "from group 0 (full_attention)"
    ) in text
    assert "'crash': None" in text and "'recompute'" not in text  # values, not hybridsim's verdicts


def test_a_time_clock_scenario_cannot_be_exported(tmp_path: Path) -> None:
    scenario = load_scenario(ROOT / "scenarios" / "demo-pressure.yaml")
    if scenario.clock == "steps":
        scenario = scenario.model_copy(update={"clock": "time"})
    with pytest.raises(ExportError, match="clock: time"):
        export_vllm_test(scenario, "x.yaml")
    res = CliRunner().invoke(
        app, ["export", "vllm-test", str(REPRO / "nixl-mamba-deeper.yaml"), "-o", str(tmp_path / "test_x.py")]
    )
    assert res.exit_code == 2 and "remote" in res.output


# ------------------------------------------------------------------ against vLLM


def _edit_once(text: str, old: str, new: str) -> str:
    assert text.count(old) == 1, old
    return text.replace(old, new)


@pytest.mark.slow
def test_exported_tests_pass_against_vllm_and_fail_when_edited(
    vllm, tmp_path: Path, crash_scenario, values_scenario, fuzz_scenario
) -> None:
    crash_file = tmp_path / "crash.yaml"
    crash_file.write_text(scenario_yaml(crash_scenario))
    res = CliRunner().invoke(app, ["export", "vllm-test", str(crash_file), "-o", str(tmp_path / "test_crash.py")])
    assert res.exit_code == 0, res.output
    crash = (tmp_path / "test_crash.py").read_text()
    values = export_vllm_test(values_scenario, "values.yaml")
    (tmp_path / "test_values.py").write_text(values)
    (tmp_path / "test_fuzz.py").write_text(export_vllm_test(fuzz_scenario, "fuzz-1-80.yaml"))
    # Edited expectations: another crash message; one admission's local tokens.
    (tmp_path / "test_crash_edited.py").write_text(
        _edit_once(crash, "'message': 'num_new_tokens > 0'}", "'message': 'num_new_tokens > 1'}")
    )
    row = next(
        line
        for line in values.splitlines()
        if line.strip().startswith("(") and "'first'" in line and ", True, " not in line and "[0, 0], 0," not in line
    )
    fields = row.strip().rstrip(",")
    parsed = ast.literal_eval(fields)
    edited = parsed[:4] + (parsed[4] + 16,) + parsed[5:]
    (tmp_path / "test_values_edited.py").write_text(_edit_once(values, fields, repr(edited)))
    report = tmp_path / "report.xml"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env["VLLM_TARGET_DEVICE"] = "cpu"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            f"--junitxml={report}",
            "--rootdir",
            str(tmp_path),
            str(tmp_path),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    outcomes = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        failed = case.find("failure") is not None or case.find("error") is not None
        outcomes[case.get("classname")] = "failed" if failed else "passed"
    assert outcomes == {
        "test_crash": "passed",
        "test_values": "passed",
        "test_fuzz": "passed",
        "test_crash_edited": "failed",
        "test_values_edited": "failed",
    }, outcomes
