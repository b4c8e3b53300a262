"""Limits that can be raised, streamed traces, too-long prompts rejected as vLLM does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sim.cli import app
from sim.config import ScenarioError, scenario_from_text
from sim.trace.bundle import load_result

FIXTURES = Path(__file__).resolve().parent / "bad_input"
LINE = {"timestamp": 0, "input_length": 600, "output_length": 2, "hash_ids": [1, 2]}


def invoke(*args: str | Path):
    return CliRunner().invoke(app, [str(a) for a in args])


def write_trace(path: Path, n: int, tail: str = "") -> Path:
    lines = [json.dumps({**LINE, "timestamp": 10 * i}) for i in range(n)]
    path.write_text("\n".join(lines) + "\n" + tail)
    return path


def test_a_limit_can_be_raised_by_its_environment_variable(monkeypatch) -> None:
    text = (FIXTURES / "base.yaml").read_text().replace("num_blocks: 50", "num_blocks: 60000000")
    with pytest.raises(ScenarioError, match="HYBRIDSIM_MAX_NUM_BLOCKS"):
        scenario_from_text(text)
    monkeypatch.setenv("HYBRIDSIM_MAX_NUM_BLOCKS", "100000000")
    assert scenario_from_text(text).cache.num_blocks == 60_000_000
    monkeypatch.setenv("HYBRIDSIM_MAX_NUM_BLOCKS", "lots")
    with pytest.raises(ValueError, match="HYBRIDSIM_MAX_NUM_BLOCKS='lots': expected a positive integer"):
        scenario_from_text(text)


def test_trace_request_limit_stops_reading(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HYBRIDSIM_MAX_REQUESTS", "5")
    trace = write_trace(tmp_path / "t.jsonl", 6)
    res = invoke("workload", "stats", trace)
    assert res.exit_code == 2 and "t.jsonl:6:" in res.stderr and "HYBRIDSIM_MAX_REQUESTS" in res.stderr


def test_workload_stats_limit_stops_reading(tmp_path: Path) -> None:
    """Line 4 is garbage: --limit 3 never reads it; without a limit it is reported."""
    trace = write_trace(tmp_path / "t.jsonl", 3, tail="{garbage\n")
    assert invoke("workload", "stats", trace).exit_code == 2
    res = invoke("workload", "stats", trace, "--limit", "3")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["requests"] == 3


def test_limit_keeps_the_earliest_by_arrival_from_a_stream(tmp_path: Path) -> None:
    rows = [{**LINE, "timestamp": t} for t in (5000, 1000, 3000, 1000, 9000)]
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    text = f"""
name: s
cache: {{block_size: 16, num_blocks: 500, groups: [full_attention]}}
workload: {{trace: {{format: mooncake, path: {tmp_path / "t.jsonl"}}}, limit: 3}}
"""
    from sim.engine.build import build_components

    scenario = scenario_from_text(text)
    requests = build_components(scenario).requests
    assert [r.request_id for r in requests] == ["mc2", "mc4", "mc3"]


TOO_LONG = """
name: tl
cache: {block_size: 16, num_blocks: 500, groups: [full_attention, mamba]}
scheduler: {max_model_len: 100}
workload:
  requests:
    - {id: ok1, prompt: [{content: doc, tokens: 32}], max_tokens: 2}
    - {id: big, prompt: [{content: doc, tokens: 3200}], max_tokens: 2}
    - {id: ok2, at: 2, prompt: [{content: doc, tokens: 48}], max_tokens: 2}
"""


def test_too_long_prompts_are_rejected_and_the_run_goes_on(tmp_path: Path) -> None:
    path = tmp_path / "tl.yaml"
    path.write_text(TOO_LONG)
    res = invoke("run", path, "-o", tmp_path / "out", "--no-plots")
    assert res.exit_code == 0, res.output
    assert "rejected (prompt > max_model_len)" in res.stdout
    result = load_result(tmp_path / "out")
    outcomes = result.requests.set_index("request_id")["outcome"]
    assert outcomes.to_dict() == {"ok1": "ok", "ok2": "ok", "big": "rejected"}
    assert result.summary["requests"]["by_outcome"]["rejected"] == 1
    assert not (result.admissions["request_id"] == "big").any()  # never reached the scheduler


def test_too_long_error_names_both_fixes_not_num_blocks(tmp_path: Path) -> None:
    path = tmp_path / "tl.yaml"
    path.write_text(TOO_LONG.replace("num_blocks: 500", "num_blocks: 20"))
    res = invoke("validate", path, "--set", "workload.too_long=error")
    assert res.exit_code == 2
    line = res.stderr.strip()
    assert "scheduler.max_model_len" in line and "3200-token prompt of request 'big'" in line
    assert "longer context" in line and "raise scheduler.max_model_len" in line and "num_blocks" not in line


def test_strict_booleans_in_the_scenario() -> None:
    text = (FIXTURES / "base.yaml").read_text()
    for bad in ('"yes"', "1", '"true"'):
        with pytest.raises(ScenarioError, match="check_invariants"):
            scenario_from_text(text + f"check_invariants: {bad}\n")
    assert scenario_from_text(text + "check_invariants: true\n").check_invariants is True


def test_azure_reader_never_echoes_the_header(tmp_path: Path) -> None:
    secret = "root:$6$Zm9vYmFy$c2VjcmV0aGFzaA:19000:0:99999:7:::"
    (tmp_path / "shadow").write_text(secret + "\n")
    res = invoke("workload", "stats", tmp_path / "shadow", "--format", "azure")
    assert res.exit_code == 2 and "missing column" in res.stderr
    assert "c2VjcmV0aGFzaA" not in res.output and "$6$" not in res.output
