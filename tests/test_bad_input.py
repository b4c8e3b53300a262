"""Bad input through the CLI: exit 2, one line on stderr naming the file, key or line and what is valid, no traceback.

The fixtures are in tests/bad_input/ (base.yaml is the valid scenario they vary).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support.registries import EXTRA, Valid
from typer.testing import CliRunner

from sim.cli import app

FIXTURES = Path(__file__).resolve().parent / "bad_input"

# fixture file -> fragments its one-line error must contain (the file is always checked separately).
# (A list of valid names is read from its registry: an installed plug-in adds one.)
CASES: dict[str, tuple[str | Valid, ...]] = {
    "malformed.yaml": ("malformed.yaml:4:", "expected ',' or '}'"),
    "unknown-key.yaml": ("unknown-key.yaml:4:", "scheduler.prefix_polcy", "did you mean 'prefix_policy'?"),
    "wrong-type.yaml": ("wrong-type.yaml:3:", "cache.block_size", "valid integer"),
    "negative-blocks.yaml": ("negative-blocks.yaml:3:", "cache.num_blocks", ">= 2", "-5"),
    "zero-block-size.yaml": ("zero-block-size.yaml:3:", "cache.block_size", ">= 1"),
    "too-little-kv-memory.yaml": ("cache.kv_memory_gb", "max seq len (8192)", "443023360 bytes", "startup check"),
    "unknown-preset.yaml": ("unknown-preset.yaml:2:", "model.preset", "did you mean 'nemotron-h-8b'?"),
    "unknown-policy.yaml": ("scheduler.prefix_policy", "'reconcilled'", Valid("scheduler.prefix_policy")),
    "unknown-connector.yaml": ("connector.type", "'lmcachee'", Valid("connector.type")),
    "missing-trace.yaml": ("no-such-trace.jsonl", "trace file: file not found"),
    "malformed-trace.yaml": ("malformed-trace.jsonl:2:", "invalid JSON"),
    "empty-workload.yaml": ("empty-workload.yaml:4:", "'requests' must hold at least one request"),
    "conflicting-memory.yaml": ("conflicting-memory.yaml:4:", "cache.kv_memory_gb", "not both"),
    "python-tag.yaml": ("python-tag.yaml:3:", "seed", "!!python/object/apply", "is not allowed"),
    "unknown-eviction-policy.yaml": ("cache.eviction_policy", "'lfu'", Valid("cache.eviction_policy")),
    "bad-eviction-option.yaml": ("cache.eviction_options", "option window must be a positive integer, got 0"),
    "marconi-without-model.yaml": ("cache.eviction_policy", "marconi needs the step-time model"),
    "unknown-checkpoint-policy.yaml": (
        "cache.mamba_checkpoint_policy",
        "'branchpoints'",
        Valid("cache.mamba_checkpoint_policy"),
    ),
    "bad-checkpoint-option.yaml": ("cache.mamba_checkpoint_options", "option k must be a positive integer, got 0"),
    "placement-without-mamba.yaml": ("cache.mamba_checkpoint_policy", "needs a mamba group with prefix caching"),
}


def invoke(*args: str | Path):
    return CliRunner().invoke(app, [str(a) for a in args])


def assert_one_line_error(res, *fragments: str | Valid) -> str:
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output and "Traceback" not in res.stderr
    lines = res.stderr.splitlines()
    assert len(lines) == 1, res.stderr
    line = lines[0]
    assert line.startswith("error: ")
    for fragment in map(str, fragments):
        assert fragment in line, f"{fragment!r} not in {line!r}"
    return line


def test_the_base_fixture_is_valid(tmp_path: Path) -> None:
    res = invoke("run", FIXTURES / "base.yaml", "-o", tmp_path, "--no-plots", "-q")
    assert res.exit_code == 0, res.output


@pytest.mark.parametrize("name", sorted(CASES))
def test_run_rejects_bad_scenario_in_one_line(name: str, tmp_path: Path) -> None:
    res = invoke("run", FIXTURES / name, "-o", tmp_path / "out", "--no-plots", "-q")
    assert_one_line_error(res, name, *CASES[name])
    assert not (tmp_path / "out" / "summary.json").exists()


@pytest.mark.parametrize("name", sorted(CASES))
def test_validate_rejects_bad_scenario_in_one_line(name: str) -> None:
    assert_one_line_error(invoke("validate", FIXTURES / name), name, *CASES[name])


@pytest.mark.parametrize(
    "name", [n for n, fragments in sorted(CASES.items()) if any(isinstance(f, Valid) for f in fragments)]
)
def test_an_installed_plugin_joins_the_valid_names(name: str, extra_plugins) -> None:
    line = assert_one_line_error(invoke("validate", FIXTURES / name), name, *CASES[name])
    assert f"valid: {EXTRA}, " in line


def test_python_tag_is_never_executed(tmp_path: Path, monkeypatch) -> None:
    import os

    calls = []
    monkeypatch.setattr(os, "system", lambda cmd: calls.append(cmd) or 0)
    invoke("validate", FIXTURES / "python-tag.yaml")
    assert calls == []


def test_output_directory_under_a_regular_file(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory\n")
    res = invoke("run", FIXTURES / "base.yaml", "-o", blocker / "out", "--no-plots", "-q")
    assert_one_line_error(res, "-o/--out", str(blocker / "out"), "Not a directory", "writable directory")
    res = invoke("run", FIXTURES / "base.yaml", "-o", blocker, "--no-plots", "-q")
    assert_one_line_error(res, "-o/--out", str(blocker))


def test_missing_scenario_file_and_bad_override() -> None:
    assert_one_line_error(invoke("run", FIXTURES / "nope.yaml"), "nope.yaml", "cannot read scenario")
    res = invoke("run", FIXTURES / "base.yaml", "--set", "cache.num_blok=10", "--no-plots", "-q")
    assert_one_line_error(res, "cache.num_blok", "num_blocks")


def test_malformed_trace_through_workload_stats() -> None:
    res = invoke("workload", "stats", FIXTURES / "malformed-trace.jsonl")
    assert_one_line_error(res, "malformed-trace.jsonl:2:", "invalid JSON")


def test_debug_shows_the_traceback() -> None:
    res = invoke("--debug", "validate", FIXTURES / "unknown-policy.yaml")
    assert res.exit_code == 2
    assert "Traceback" in res.stderr
    assert res.stderr.rstrip().splitlines()[-1].startswith("error: ")
