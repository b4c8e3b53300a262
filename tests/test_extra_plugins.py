"""An installed plug-in of each kind (connector, prefix, eviction, checkpoint policy) changes no outcome.

A user's environment may hold plug-ins registered through entry points; they add names to the registries
and nothing else: every run decides the same (byte-identical tables), every error still names the valid
choices (read from the registries: tests/support/registries.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support.registries import BUILTIN_NAMES, EXTRA, NAMES

from sim.api import RunOptions, run_scenario
from sim.config import load_scenario
from sim.trace.diff import diff_traces
from sim.trace.tables import TABLE_NAMES

ROOT = Path(__file__).resolve().parents[1]
# A crash under max_per_group with the scripted connector; the NIXL-like remote connector; group_coherent
# eviction under pressure.
RUNS = [
    ("repro/pr48425-mamba-deeper-ext16.yaml", ["scheduler.prefix_policy=max_per_group"]),
    ("repro/nixl-mamba-deeper.yaml", []),
    ("golden-pressure.yaml", ["cache.eviction_policy=group_coherent"]),
]


def _run(scenario: str, overrides: list[str], out: Path) -> Path:
    loaded = load_scenario(ROOT / "scenarios" / scenario, overrides)
    run_scenario(loaded, out, options=RunOptions(write_plots=False, progress=False))
    return out


@pytest.fixture(scope="module")
def baseline(tmp_path_factory) -> dict[str, Path]:
    """The runs without any plug-in installed."""
    root = tmp_path_factory.mktemp("baseline")
    return {scenario: _run(scenario, overrides, root / str(i)) for i, (scenario, overrides) in enumerate(RUNS)}


def test_the_extra_plugins_are_listed_but_are_no_builtins(extra_plugins) -> None:
    for key, names in NAMES.items():
        assert names()[0] == EXTRA, key
        assert EXTRA not in BUILTIN_NAMES[key](), key


@pytest.mark.parametrize("scenario, overrides", RUNS, ids=[s for s, _ in RUNS])
def test_an_installed_plugin_changes_no_run(
    scenario: str, overrides: list[str], baseline: dict[str, Path], tmp_path: Path, extra_plugins
) -> None:
    out = _run(scenario, overrides, tmp_path / "with-plugins")
    report = diff_traces(baseline[scenario], out, tables=TABLE_NAMES)
    assert report.identical, report.format()
    assert (out / "summary.json").read_bytes() == (baseline[scenario] / "summary.json").read_bytes()
