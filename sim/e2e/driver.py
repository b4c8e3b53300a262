"""``hybridsim fuzz --e2e``: ``count`` scenarios of ``seed`` through the user path; failures written out.

Each scenario is walked in its own folder under a temporary work directory (removed afterwards). A
scenario with a failing check is written to ``OUT/<name>/``: ``scenario.yaml`` (and the trace it reads),
``failure.txt`` (each failed command line, its exit code and the tail of its output) and ``pytest.txt``
(how to turn it into a regression test). ``OUT/summary.json`` holds the figures: scenarios, refused,
crashed, failures, checks run and seconds.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import yaml

from sim.e2e.path import walk
from sim.e2e.scenarios import generate


@dataclass
class E2EFigures:
    """What a fuzz run did."""

    seed: int
    scenarios: int = 0
    refused: int = 0
    crashed: int = 0
    failed: int = 0
    checks: Counter = field(default_factory=Counter)
    statuses: Counter = field(default_factory=Counter)
    seconds: float = 0.0

    def line(self) -> str:
        return (
            f"fuzz --e2e seed {self.seed}: {self.scenarios} scenarios, {self.failed} failed, {self.refused} refused, "
            f"{self.crashed} crashed, {sum(self.checks.values())} checks, {self.seconds:.0f} s"
        )

    def as_dict(self) -> dict:
        return {
            "seed": self.seed,
            "scenarios": self.scenarios,
            "failed": self.failed,
            "refused": self.refused,
            "crashed": self.crashed,
            "checks": dict(sorted(self.checks.items())),
            "statuses": dict(sorted(self.statuses.items())),
            "seconds": round(self.seconds, 1),
        }


def _vllm_installed() -> bool:
    from sim.verify import vllm_side

    return vllm_side.vllm_available()


def fuzz_e2e(
    seed: int,
    count: int,
    out_dir: Path,
    echo: Callable[[str], None],
    *,
    start: int = 0,
    use_vllm: bool | None = None,
) -> E2EFigures:
    """Walk scenarios ``start .. start + count - 1`` of ``seed``; ``use_vllm`` None: when vLLM is installed."""
    from sim.config.vllm_versions import NEWEST
    from sim.verify import vllm_side

    vllm = _vllm_installed() if use_vllm is None else use_vllm
    version = vllm_side.installed_release() if vllm else NEWEST
    figures = E2EFigures(seed=seed)
    began = time.perf_counter()
    cwd = Path.cwd()
    with tempfile.TemporaryDirectory(prefix="hybridsim-e2e-") as tmp:
        for index in range(start, start + count):
            data, files = generate(seed, index, version)
            name = str(data["name"])
            work = Path(tmp) / name
            work.mkdir()
            for file_name, text in files.items():
                (work / file_name).write_text(text, encoding="utf-8")
            scenario = work / "scenario.yaml"
            scenario.write_text(yaml.safe_dump(data, sort_keys=False, width=120), encoding="utf-8")
            rng = np.random.default_rng([seed, index, 1])
            os.chdir(work)  # relative paths (a shrunk scenario's trace) resolve as for a user in that folder
            try:
                result = walk(scenario, work, rng, vllm)
            finally:
                os.chdir(cwd)
            figures.scenarios += 1
            figures.checks.update(result.checks)
            if result.refused:
                figures.refused += 1
                echo(f"{name}: refused: {result.refused}")
            else:
                figures.statuses[result.status] += 1
            figures.crashed += int(result.crashed)
            if result.failures:
                figures.failed += 1
                _write_failure(out_dir, name, work, files, result.failures)
                echo(f"{name}: FAILED {result.failures[0].what.splitlines()[0]} (written to {out_dir / name})")
            shutil.rmtree(work, ignore_errors=True)
    figures.seconds = time.perf_counter() - began
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "summary.json").write_text(json.dumps(figures.as_dict(), indent=2) + "\n", encoding="utf-8")
    echo(figures.line())
    return figures


def _write_failure(out_dir: Path, name: str, work: Path, files: dict[str, str], failures: list) -> None:
    folder = out_dir / name
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(work / "scenario.yaml", folder / "scenario.yaml")
    for file_name in files:
        shutil.copyfile(work / file_name, folder / file_name)
    text = "\n".join(f.describe() for f in failures)
    (folder / "failure.txt").write_text(text, encoding="utf-8")
    (folder / "pytest.txt").write_text(
        "A regression test: copy scenario.yaml (and any trace file) into tests/, then in a test run the failed\n"
        "command(s) above through support.cli.invoke (the same in-process command) and assert the exit code\n"
        "and files the check expects (sim/e2e/path.py).\n",
        encoding="utf-8",
    )
