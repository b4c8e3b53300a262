"""The admission study's table reads a sweep and measures who was moved back (docs/admission.md)."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from sim.analysis.admission_study import load_sweep, markdown_table, with_fairness
from sim.cli import app

BASE = """
name: reorder
clock: steps
vllm_version: "0.34"
cache: {block_size: 16, num_blocks: 30, groups: [full_attention]}
scheduler: {max_num_seqs: 1, max_num_batched_tokens: 256, cache_aware_admission_threshold: 0.0}
workload:
  requests:
    - {id: r0, at: 0, prompt: [{content: a, tokens: 64}], max_tokens: 3}
    - {id: r1, at: 1, prompt: [{content: b, tokens: 48}], max_tokens: 2}
    - {id: r2, at: 1, prompt: [{content: a, tokens: 32}, {content: t2, tokens: 8}], max_tokens: 2}
    - {id: r3, at: 1, prompt: [{content: a, tokens: 64}, {content: t3, tokens: 8}], max_tokens: 2}
outputs: {plots: false}
"""


def test_the_window_moves_the_cold_request_back_and_the_table_says_by_how_much(tmp_path: Path) -> None:
    (tmp_path / "base.yaml").write_text(BASE)
    sweep = tmp_path / "admission-toy.yaml"
    sweep.write_text("scenario: base.yaml\nseeds: 1\nscheduler.cache_aware_admission_window: [0, 4]\n")
    out = tmp_path / "sweep-admission-toy"
    result = CliRunner().invoke(app, ["sweep", str(sweep), "-j", "1", "-o", str(out)])
    assert result.exit_code == 0, result.output
    df = with_fairness(load_sweep(out)).sort_values("window")
    assert list(df["workload"]) == ["toy", "toy"] and list(df["window"]) == [0, 4]
    off, on = df.iloc[0], df.iloc[1]
    # Window 4 admits r3 (64 cached tokens) and r2 (32) before r1 (none): r1 waits 4 steps longer, alone.
    assert (off["moved_back"], on["moved_back"]) == (0, 1)
    assert on["added_wait_mean"] == on["added_wait_max"] == 4.0
    table = markdown_table(df)
    assert "| 4 | 0 | - |" in table and "4.00 / 4.00" in table
