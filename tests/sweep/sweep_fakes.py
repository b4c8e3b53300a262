"""Picklable stand-ins for ``sim.config.load_scenario`` and ``sim.api.run_scenario``.

Module-level functions, so a process pool or Ray can pickle them by name. The fake
load applies ``key.path=value`` overrides (YAML values) to the scenario mapping;
the fake run writes a tiny bundle whose metrics are exact functions of the
scenario, so tests can check every cell of ``sweep.parquet``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

LOG_ENV = "SWEEP_FAKE_LOG"


class FakeScenarioError(ValueError):
    pass


@dataclass
class FakeScenario:
    seed: int
    data: dict[str, Any]


@dataclass
class FakeResult:
    summary: dict[str, Any]


def fake_load(path: str, overrides: list[str]) -> FakeScenario:
    data = yaml.safe_load(Path(path).read_text())
    for item in overrides:
        key, _, text = item.partition("=")
        *parents, leaf = key.split(".")
        node = data
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = yaml.safe_load(text)
    if data["cache"]["num_blocks"] < 2:
        raise FakeScenarioError(f"cache.num_blocks: must be >= 2, got {data['cache']['num_blocks']}")
    return FakeScenario(seed=data["seed"], data=data)


def expected_summary(num_blocks: int, policy: str, seed: int) -> dict[str, Any]:
    """The summary :func:`fake_run` writes for these values (nested dicts and a null, like the real one)."""
    return {
        "requests": {"total": 4},
        "divergences": 1600 // num_blocks + seed % 3,
        "fallbacks": len(policy) + seed,
        "hit_rate_g0": num_blocks / (num_blocks + 100),
        "outcomes": {"ok": 4 - seed % 2, "crash": seed % 2},
        "crash": None,
        "preemptions": 0,
        "partial": False,
    }


def fake_run(scenario: FakeScenario, out_dir: Path) -> FakeResult:
    data = scenario.data
    log = os.environ.get(LOG_ENV)
    if log:
        with open(log, "a") as fh:
            fh.write(out_dir.name + "\n")
    policy = data["scheduler"]["prefix_policy"]
    if policy == "explode":
        raise RuntimeError("boom: policy explode")
    summary = expected_summary(data["cache"]["num_blocks"], policy, data["seed"])
    from sim.trace.bundle import write_result

    write_result(out_dir, scenario_yaml=yaml.safe_dump(data, sort_keys=False), summary=summary, tables={})
    return FakeResult(summary)
