"""The end-to-end fuzz (sim.e2e): its scenarios, its failure records, and a fixed-seed walk (slow tier)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml
from support.registries import BUILTIN_NAMES

from sim.config.load import scenario_from_text
from sim.e2e import driver
from sim.e2e.path import Failure, Walk
from sim.e2e.scenarios import CONNECTORS, generate


def _connector_types(data: dict) -> set[str]:
    connector = data.get("connector", {})
    kinds = {connector.get("type", "none")}
    if "wraps" in connector:
        kinds.add(connector["wraps"]["type"])
    return kinds


def test_scenarios_are_deterministic_and_valid() -> None:
    for index in range(40):
        data, files = generate(7, index)
        assert generate(7, index) == (data, files)
        if not files:  # a trace scenario reads its file relative to itself: checked in the walk below
            scenario_from_text(yaml.safe_dump(data), f"{data['name']}.yaml")


def test_scenarios_cover_every_builtin_connector_and_policy() -> None:
    """Derived from the registries: a new built-in must be added to the generator (an installed plug-in not)."""
    seen: dict[str, set[str]] = {
        "connector.type": set(),
        "scheduler.prefix_policy": set(),
        "cache.eviction_policy": set(),
    }
    kinds: set[str] = set()
    for index in range(300):
        data, files = generate(3, index)
        seen["connector.type"] |= _connector_types(data)
        seen["scheduler.prefix_policy"].add(data["scheduler"].get("prefix_policy", "pr48425"))
        seen["cache.eviction_policy"].add(data["cache"].get("eviction_policy", "lru"))
        kinds.add("trace" if files else data["clock"])
        kinds |= {"sessions"} if "sessions" in data["workload"] else set()
        kinds |= {"crash-record"} if data["on_crash"] == "record" else set()
        kinds |= {a_kind for a in data.get("actions", []) for a_kind in a if a_kind != "at"}
    for key, names in seen.items():
        assert set(BUILTIN_NAMES[key]()) <= names, key
    assert set(CONNECTORS) == set(BUILTIN_NAMES["connector.type"]())
    assert {"steps", "time", "trace", "sessions", "crash-record", "evict", "reset_prefix_cache"} <= kinds
    assert "connector_fault" in kinds


def test_a_failed_check_is_written_out_as_a_scenario_and_the_command(tmp_path: Path, monkeypatch) -> None:
    def failing_walk(scenario: Path, work: Path, rng, vllm: bool) -> Walk:
        return Walk(
            status="complete", checks=["run", "show"], failures=[Failure(["show", str(work)], 1, "show: exit 1")]
        )

    monkeypatch.setattr(driver, "walk", failing_walk)
    figures = driver.fuzz_e2e(5, 2, tmp_path / "out", lambda line: None, use_vllm=False)
    assert (figures.scenarios, figures.failed) == (2, 2)
    folder = tmp_path / "out" / "e2e-5-0"
    assert yaml.safe_load((folder / "scenario.yaml").read_text())["name"] == "e2e-5-0"
    assert "$ hybridsim show" in (folder / "failure.txt").read_text()
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["failed"] == 2


#: The CI walk: a fixed seed and count (about a minute of CPU on 2 cores without vLLM; vLLM adds verify,
#: export and its import).
CI_SEED, CI_COUNT = 29, 16


@pytest.mark.slow
def test_fixed_seed_walks_the_whole_user_path_without_a_failure(tmp_path: Path) -> None:
    lines: list[str] = []
    started = time.process_time()
    figures = driver.fuzz_e2e(CI_SEED, CI_COUNT, tmp_path / "out", lines.append)
    assert figures.failed == 0, "\n".join(lines)
    assert figures.refused == 0, "\n".join(lines)
    assert figures.scenarios == CI_COUNT and figures.checks["trace diff"] == CI_COUNT
    assert time.process_time() - started < 180
