"""``run`` without ``-o``: ``results/<name>``, and with ``--set``/``--seed`` a folder of its own, so a run with
overrides never silently replaces the bundle of the run as written."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from sim.cli import app
from sim.cli.output import default_folder_name, run_targets

TINY = """
name: tiny
clock: steps
cache: {block_size: 16, num_blocks: 40, groups: [full_attention, mamba]}
workload:
  requests:
    - {id: r0, at: 0, prompt: [{content: doc, tokens: 40}], max_tokens: 2}
outputs: {plots: false}
"""


def test_the_default_name_is_the_scenario_name_or_names_the_overrides():
    assert default_folder_name("demo", []) == "demo"
    assert (
        default_folder_name("demo", ["cache.num_blocks=120", "scheduler.prefix_policy=reconciled"])
        == "demo@cache.num_blocks=120,scheduler.prefix_policy=reconciled"
    )
    assert default_folder_name("demo", ["cache.groups=[full_attention, mamba]"]) == (
        "demo@cache.groups=_full_attention__mamba_"
    )
    assert run_targets([Path("a.yaml")], ["demo"], None, ["seed=3"]) == [Path("results") / "demo@seed=3"]
    assert run_targets([Path("a.yaml")], ["demo"], Path("x"), ["seed=3"]) == [Path("x")]


def test_long_override_lists_are_cut_but_stay_distinct():
    one = default_folder_name("demo", [f"workload.requests.0.prompt.0.tokens={'1' * 200}"])
    two = default_folder_name("demo", [f"workload.requests.0.prompt.0.tokens={'1' * 199}2"])
    assert len(one) < 128 and len(two) < 128 and one != two


def test_run_with_set_keeps_the_plain_runs_bundle(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("tiny.yaml").write_text(TINY)
    plain = CliRunner().invoke(app, ["run", "tiny.yaml", "-q"])
    assert plain.exit_code == 0, plain.output
    before = (tmp_path / "results" / "tiny" / "summary.json").read_bytes()
    varied = CliRunner().invoke(app, ["run", "tiny.yaml", "-q", "--set", "cache.num_blocks=30", "--seed", "2"])
    assert varied.exit_code == 0, varied.output
    assert "writing results/tiny@cache.num_blocks=30,seed=2" in varied.stderr
    assert (tmp_path / "results" / "tiny" / "summary.json").read_bytes() == before
    assert (tmp_path / "results" / "tiny@cache.num_blocks=30,seed=2" / "summary.json").is_file()
