"""``hybridsim export vllm-test``: the written module is the harness, one data literal and fixed code; it passes
against vLLM 0.33 (both sides of a contrast), fails when its expectation is edited, and no name runs code.

The tests that run vLLM skip when it is not installed, unless ``HYBRIDSIM_REQUIRE_VLLM=1`` (then they fail).
All exported modules run in ONE pytest subprocess (vLLM's import costs about ten seconds).
"""

from __future__ import annotations

import ast
import copy
import functools
import inspect
import io
import json
import os
import subprocess
import sys
import tokenize
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from sim.cli import app
from sim.config import load_scenario, scenario_from_text
from sim.config.scenario import Scenario
from sim.export.vllm_test import HEADER, ExportError, case, export_vllm_test, module_text
from sim.shrink import shrink
from sim.shrink.output import scenario_yaml
from sim.verify import vllm_side

ROOT = Path(__file__).resolve().parents[2]
REPRO = ROOT / "scenarios" / "repro"

#: The module-level names of an exported module besides the harness's.
TEST_NAMES = {"CASE", "_script", "_observed", "test_vllm_decides_as_hybridsim"}
CONTRAST_NAMES = TEST_NAMES | {"test_contrast_policy_runs_clean"}


def _shrunk(name: str, overrides: list[str]) -> Scenario:
    return scenario_from_text(scenario_yaml(shrink(load_scenario(REPRO / name, overrides)).scenario))


@functools.cache
def _crash_scenario() -> Scenario:
    """The shrunk crash of #46453's mamba-deeper case under max_per_group (num_new_tokens > 0), which runs
    clean under pr48425: the module asserts both sides."""
    return _shrunk("pr48425-mamba-deeper-ext16.yaml", ["scheduler.prefix_policy=max_per_group"])


@functools.cache
def _crash_case() -> dict[str, Any]:
    return case(_crash_scenario(), "crash.yaml")


@pytest.fixture(scope="module")
def values_scenario() -> Scenario:
    """The shrunk recompute of vLLM's test_hybrid_per_group_hit_divergence_with_connector (pr48425, an evict)."""
    return _shrunk("pr48425-mamba-deeper-ext16.yaml", [])


@pytest.fixture(scope="module")
def fuzz_scenario() -> Scenario:
    """The shrunk crash of hybridsim fuzz's scenario (seed 1, index 80)."""
    from sim.verify.fuzz import generate

    return scenario_from_text(scenario_yaml(shrink(Scenario.model_validate(generate(1, 80))).scenario))


# ------------------------------------------------------------------ reading a module


def _case_node(tree: ast.Module) -> ast.Constant:
    """The one string literal of ``CASE = json.loads(<literal>)``."""
    [assign] = [n for n in tree.body if isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == "CASE"]
    call = assign.value
    assert isinstance(call, ast.Call) and ast.unparse(call.func) == "json.loads" and len(call.args) == 1
    literal = call.args[0]
    assert isinstance(literal, ast.Constant) and isinstance(literal.value, str)
    return literal


def _case_of(text: str) -> dict[str, Any]:
    return json.loads(_case_node(ast.parse(text)).value)


def _skeleton(text: str) -> str:
    """The module's code with the CASE literal blanked: what must not depend on the scenario."""
    tree = ast.parse(text)
    _case_node(tree).value = ""
    return ast.dump(tree)


def _comments(text: str) -> list[str]:
    return [t.string for t in tokenize.generate_tokens(io.StringIO(text).readline) if t.type == tokenize.COMMENT]


def _top_level_names(text: str) -> set[str]:
    names: set[str] = set()
    for node in ast.parse(text).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


HARNESS_NAMES = _top_level_names(inspect.getsource(vllm_side))


# ------------------------------------------------------------------ the module


def test_the_module_is_the_harness_one_case_literal_and_fixed_code() -> None:
    text = export_vllm_test(_crash_scenario(), "crash.yaml")
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
    assert _top_level_names(text) == HARNESS_NAMES | CONTRAST_NAMES
    document = _case_of(text)
    assert document == _crash_case()
    assert document["expected"]["crash"] == {
        "step": 2,
        "request": "r",
        "type": "AssertionError",
        "message": "num_new_tokens > 0",
    }
    # Both sides of the contrast: the crash under max_per_group, a clean run under pr48425.
    assert document["script"]["prefix_policy"] == "max_per_group"
    contrast = document["contrast"]
    assert contrast["policy"] == "pr48425" and contrast["script"] == {"prefix_policy": "pr48425"}
    assert contrast["expected"]["crash"] is None and contrast["expected"]["admissions"][-1][-1] == "admitted"
    # The scenario's name and source are data only: not in a comment.
    assert not [c for c in _comments(text) if "crash" in c or "mamba-deeper" in c]


def test_requests_and_evictions_are_described_in_the_data(values_scenario) -> None:
    text = export_vllm_test(values_scenario, "values.yaml")
    document = _case_of(text)
    assert document["contrast"] is None and _top_level_names(text) == HARNESS_NAMES | TEST_NAMES
    assert [label for label, _ in document["streams"]] == ["doc"]
    for request, note in zip(values_scenario.workload.requests or [], document["notes"]["requests"]):
        assert note.startswith(f"{request.id}: doc[0:")
    evict = values_scenario.actions[0].evict
    assert evict is not None
    block = evict.blocks[0]
    assert (
        f"evict {evict.prefix_of}'s prompt block {block} (tokens {block * 16}-{block * 16 + 15}) "
        "from group 0 (full_attention)"
    ) in document["notes"]["actions"][0]
    assert document["expected"]["crash"] is None
    assert all(row[-1] in ("admitted", "no_blocks", "skipped") for row in document["expected"]["admissions"])


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


def test_a_cluster_is_not_exported_as_its_first_engine(tmp_path: Path) -> None:
    """A cluster is several engines: the export refuses it and says how to get one engine's scenario (it
    lowered the scenario without its cluster section before: a test of a run that never happened)."""
    source = tmp_path / "cluster.yaml"
    source.write_text(
        (REPRO / "pr48425-mamba-deeper-ext16.yaml").read_text().split("actions:")[0] + "cluster: {instances: 2}\n"
    )
    res = CliRunner().invoke(app, ["export", "vllm-test", str(source), "-o", str(tmp_path / "test_x.py")])
    assert res.exit_code == 2, res.output
    assert "cluster: several engines, not one" in res.output and "shrink" in res.output
    assert not (tmp_path / "test_x.py").exists()


# ------------------------------------------------------------------ hostile names

#: Strings that broke the old generator: code after a newline, docstring and string quotes, a comment that
#: swallows the rest of a line, a character outside identifiers, NFKC-equal names, line separators.
NASTY = [
    'r\nimport os; os.system("echo PWNED")\n#',
    '"""',
    "'''",
    "doc\nprint('PWNED'),\n#",
    "x²",
    "doc",
    "ｄｏｃ",
    "\\",
    "a\u2028b\x85c\rd",
    "\x00",
    "{CASE}",
    "'); print('PWNED'); ('",
]


def renamed(document: dict[str, Any], ids: dict[str, str], text: str) -> dict[str, Any]:
    """``document`` with its request ids renamed consistently (values and keys equal to one) and every label,
    name, source, note and crash message replaced by ``text``: names no validator has seen."""

    def walk(value: Any) -> Any:
        if isinstance(value, dict):
            return {ids.get(k, k): walk(v) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v) for v in value]
        return ids.get(value, value) if isinstance(value, str) else value

    out = walk(copy.deepcopy(document))
    out["source"] = out["scenario"] = out["script"]["name"] = text
    out["streams"] = [[text + str(i), base] for i, (_, base) in enumerate(out["streams"])]
    out["notes"] = {key: [text for _ in notes] for key, notes in out["notes"].items()}
    out["asserts"] = [text for _ in out["asserts"]]
    return out


def _test_part(text: str) -> str:
    """What follows the verbatim harness (the header before it is fixed text: checked here too)."""
    head = HEADER + inspect.getsource(vllm_side)
    assert text.startswith(head)
    return text[len(head) :]


@functools.cache
def _benign_test_part() -> tuple[str, list[str]]:
    tail = _test_part(module_text(_crash_case()))
    return _skeleton(tail), _comments(tail)


def _check_fixed_code(document: dict[str, Any]) -> None:
    """The module for ``document`` is the fixed header and harness, then a part that parses, embeds the document
    exactly, and is otherwise the benign module's, comment for comment: no string of the document became code,
    a comment, a docstring or a name."""
    tail = _test_part(module_text(document))
    assert _case_of(tail) == document
    assert (_skeleton(tail), _comments(tail)) == _benign_test_part()
    assert _top_level_names(tail) == CONTRAST_NAMES
    assert tail.isascii()  # every name escaped in the JSON


unicode_text = st.one_of(
    st.sampled_from(NASTY),
    st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=24),
)


@settings(max_examples=100, deadline=None)
@given(ids=st.lists(unicode_text, min_size=2, max_size=2, unique=True), text=unicode_text)
def test_any_ids_labels_and_names_give_a_module_of_fixed_code(ids: list[str], text: str) -> None:
    document = _crash_case()
    old = sorted({r["id"] for r in document["script"]["requests"]})
    _check_fixed_code(renamed(document, dict(zip(old, ids)), text))


def test_nfkc_equal_ids_stay_two_requests() -> None:
    document = renamed(_crash_case(), {"seed3": "doc", "r": "ｄｏｃ"}, "ｄｏｃ")
    _check_fixed_code(document)
    requests = _case_of(module_text(document))["script"]["requests"]
    assert [r["id"] for r in requests] == ["doc", "ｄｏｃ"]


# ------------------------------------------------------------------ against vLLM


def _with(document: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    out = copy.deepcopy(document)
    target = out
    for key in path[:-1]:
        target = target[key]
    assert target[path[-1]] != value
    target[path[-1]] = value
    return out


def _at_release(scenario: Scenario, release: str) -> Scenario:
    """``scenario`` validated again for vLLM ``release`` (the newer release's keys, at their defaults, cleared)."""
    return Scenario.model_validate({**scenario.model_dump(mode="json"), "vllm_version": release})


@pytest.mark.slow
def test_exported_tests_pass_against_vllm_and_fail_when_edited(
    vllm, tmp_path: Path, values_scenario, fuzz_scenario
) -> None:
    # Scenarios for the installed release (with the new knobs at their defaults both releases decide alike).
    crash_file = tmp_path / "crash.yaml"
    crash_file.write_text(scenario_yaml(_at_release(_crash_scenario(), vllm)))
    res = CliRunner().invoke(app, ["export", "vllm-test", str(crash_file), "-o", str(tmp_path / "test_crash.py")])
    assert res.exit_code == 0, res.output
    crash = case(_at_release(_crash_scenario(), vllm), "crash.yaml")
    values = case(_at_release(values_scenario, vllm), "values.yaml")
    modules = {
        "test_values": values,
        "test_fuzz": case(_at_release(fuzz_scenario, vllm), "fuzz-1-80.yaml"),
        # Edited expectations: another crash message; the contrast's last admission; one admission's local tokens.
        "test_crash_edited": _with(crash, ("expected", "crash", "message"), "num_new_tokens > 1"),
        "test_contrast_edited": _with(crash, ("contrast", "expected", "admissions", -1, -1), "crash"),
        "test_values_edited": _with(
            values, ("expected", "admissions", 1, 4), values["expected"]["admissions"][1][4] + 16
        ),
        # Hostile ids and names: the module still runs as the benign one and runs nothing else.
        "test_hostile_crash": renamed(crash, {"seed3": NASTY[0], "r": "ｄｏｃ"}, NASTY[3]),
        "test_hostile_values": renamed(values, {"seed3": "doc", "r": NASTY[11]}, NASTY[1]),
    }
    for name, document in modules.items():
        (tmp_path / f"{name}.py").write_text(module_text(document), encoding="utf-8")
    report = tmp_path / "report.xml"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env["VLLM_TARGET_DEVICE"] = "cpu"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-s",
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
    assert "PWNED" not in run.stdout + run.stderr
    outcomes = {}
    for test in ET.parse(report).getroot().iter("testcase"):
        failed = test.find("failure") is not None or test.find("error") is not None
        outcomes[(test.get("classname"), test.get("name"))] = "failed" if failed else "passed"
    main, contrast = "test_vllm_decides_as_hybridsim", "test_contrast_policy_runs_clean"
    assert outcomes == {
        ("test_crash", main): "passed",
        ("test_crash", contrast): "passed",
        ("test_values", main): "passed",
        ("test_fuzz", main): "passed",
        ("test_crash_edited", main): "failed",
        ("test_crash_edited", contrast): "passed",
        ("test_contrast_edited", main): "passed",
        ("test_contrast_edited", contrast): "failed",
        ("test_values_edited", main): "failed",
        ("test_hostile_crash", main): "passed",
        ("test_hostile_crash", contrast): "passed",
        ("test_hostile_values", main): "passed",
    }, outcomes
