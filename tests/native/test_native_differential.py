"""The compiled core decides exactly what the interpreted one does.

Needs the compiled build (``hybridsim native build``): without a fresh one
these tests skip, unless ``HYBRIDSIM_REQUIRE_NATIVE=1`` (CI), where they fail.
Each check runs whole scenarios in subprocesses, since a process runs one build
(sim.native): the golden traces must come out byte-identical from the compiled
build; every repro and pathology scenario and a batch of random fuzz scenarios
must give byte-identical tables (schedule table on) both ways; and the compiled
build must make the real vLLM 0.33 scheduler's decisions on fuzz scenarios.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sim import native
from sim.native import decide, read_manifest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
WORKER = ROOT / "tests" / "support" / "native_run.py"
FUZZ_SEED = 20261201


@pytest.fixture(scope="module", autouse=True)
def _fresh_build() -> None:
    status = decide(read_manifest(), env={})
    if not status.compiled:
        if os.environ.get("HYBRIDSIM_REQUIRE_NATIVE") == "1":
            pytest.fail(f"HYBRIDSIM_REQUIRE_NATIVE=1 but {status.reason}")
        pytest.skip(status.reason)


def _env(compiled: bool) -> dict[str, str]:
    return {**os.environ, "HYBRIDSIM_NATIVE": "1" if compiled else "0", "PYTHONPATH": str(ROOT / "tests")}


def _fingerprints(specs: list[str], compiled: bool) -> dict:
    done = subprocess.run(
        [sys.executable, str(WORKER), *specs], env=_env(compiled), capture_output=True, text=True, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def _hybridsim(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sim", *args], env=_env(True), capture_output=True, text=True, cwd=ROOT
    )


def test_golden_traces_are_byte_identical_from_the_compiled_core() -> None:
    done = _hybridsim("golden", "check", "--jobs", "1")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def test_compiled_and_interpreted_tables_are_byte_identical() -> None:
    files = sorted(str(p) for d in ("repro", "pathologies") for p in (ROOT / "scenarios" / d).glob("*.yaml"))
    specs = files + [f"fuzz:{FUZZ_SEED}:{i}" for i in range(100)]
    compiled = _fingerprints(specs, compiled=True)
    interpreted = _fingerprints(specs, compiled=False)
    assert sorted(compiled["compiled"]) == sorted(native.COMPILED_MODULES), compiled["status"]
    assert interpreted["compiled"] == []
    for spec in specs:
        assert compiled["runs"][spec] == interpreted["runs"][spec], f"{spec}: a table differs between the builds"


def test_the_compiled_core_makes_vllms_decisions(vllm) -> None:
    done = _hybridsim("fuzz", "--seed", str(FUZZ_SEED), "--count", "40", "--vllm")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "identical 40, differing 0" in done.stdout, done.stdout[-3000:]


def test_interpreted_plugin_policies_subclass_the_compiled_policies() -> None:
    """A plugin policy is interpreted Python subclassing ``sim.core.policy.prefix`` (compiled):
    under the compiled core it runs, through ``super()`` too, and decides what it decides
    under the interpreted core."""
    worker = ROOT / "tests" / "support" / "native_plugin_policy.py"
    scenario = str(ROOT / "scenarios" / "repro" / "pr48425-mamba-deeper-ext16.yaml")
    out = {}
    for compiled in (True, False):
        done = subprocess.run(
            [sys.executable, str(worker), scenario], env=_env(compiled), capture_output=True, text=True, cwd=ROOT
        )
        assert done.returncode == 0, done.stderr[-3000:]
        out[compiled] = json.loads(done.stdout)
    assert "sim.core.policy.prefix" in out[True]["compiled"]
    assert out[False]["compiled"] == []
    assert all(n > 0 for n in out[True]["calls"].values()), out[True]["calls"]
    assert out[True]["calls"] == out[False]["calls"]
    assert out[True]["runs"] == out[False]["runs"]
