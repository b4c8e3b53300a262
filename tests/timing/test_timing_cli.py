"""``hybridsim timing check|fit`` through typer's CliRunner, and the written overrides in a scenario."""

from pathlib import Path

import yaml
from synthetic_profile import TRUE
from typer.testing import CliRunner

from sim.cli import app
from sim.config import ScenarioError, load_scenario

A100 = Path(__file__).resolve().parents[1] / "data" / "profiles" / "a100" / "meta-llama" / "Meta-Llama-3-8B"


WORKLOAD = (
    "workload:\n  generator:\n    arrivals: {process: poisson, rate: 1.0}\n    count: 2\n"
    "    structure: {kind: unique, prompt: {dist: uniform, low: 60, high: 64}}\n"
    "    output: {dist: uniform, low: 2, high: 4}\n"
)


def invoke(*args):
    return CliRunner(env={"COLUMNS": "200"}).invoke(app, [str(a) for a in args])


def test_check_prints_steps_and_mape_per_regime():
    res = invoke("timing", "check", A100, "--hardware", "a100-80g")
    assert res.exit_code == 0, res.output
    assert "decode b=1 at 1024" in res.output and "prefill 2048 on 0" in res.output
    summary = {line.split()[0]: line.split() for line in res.output.splitlines()[-4:]}
    assert set(summary) == {"prefill", "decode", "mixed", "all"}
    assert float(summary["prefill"][2].rstrip("%")) <= 5.0 and float(summary["decode"][2].rstrip("%")) <= 5.0


def test_fit_writes_overrides_a_scenario_includes(synthetic_profile, tmp_path):
    out = tmp_path / "hw.yaml"
    res = invoke("timing", "fit", synthetic_profile, "--hardware", "a100-80g", "--layers", "4", "-o", out)
    assert res.exit_code == 0, res.output
    doc = yaml.safe_load(out.read_text())
    assert doc["overrides"]["gemm_row_tile"] == TRUE.gemm_row_tile
    check = invoke(
        "timing", "check", synthetic_profile, "--hardware", "a100-80g", "--layers", "4", "--overrides", out, "--summary"
    )
    assert check.exit_code == 0, check.output
    assert "all" in check.output.splitlines()[-1]
    scenario = tmp_path / "s.yaml"
    scenario.write_text(
        "name: t\nclock: time\nmodel: {preset: llama-3.1-8b}\n"
        "hardware: {preset: a100-80g, overrides_path: hw.yaml, overrides: {attn_floor_s: 0.0001}}\n" + WORKLOAD
    )
    over = load_scenario(scenario).hardware.overrides
    assert over.gemm_row_tile == TRUE.gemm_row_tile  # from the file
    assert over.attn_floor_s == 0.0001  # the inline value wins


def test_bad_overrides_file_names_file_and_key(tmp_path):
    (tmp_path / "hw.yaml").write_text("overrides: {compute_eficiency: 0.5}\n")
    scenario = tmp_path / "s.yaml"
    scenario.write_text(
        "name: t\nclock: time\nmodel: {preset: llama-3.1-8b}\n"
        "hardware: {preset: a100-80g, overrides_path: hw.yaml}\n" + WORKLOAD
    )
    try:
        load_scenario(scenario)
    except ScenarioError as exc:
        assert "hw.yaml" in str(exc) and "compute_eficiency" in str(exc) and "hardware.overrides_path" in str(exc)
    else:
        raise AssertionError("a bad overrides file must be rejected")


def test_bad_input_exits_2(tmp_path):
    res = invoke("timing", "check", tmp_path / "nope", "--hardware", "a100-80g")
    assert res.exit_code == 2 and "not a directory" in res.output
    res = invoke("timing", "check", A100, "--hardware", "a100")
    assert res.exit_code == 2 and "--hardware" in res.output
