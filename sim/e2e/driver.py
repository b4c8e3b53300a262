"""``hybridsim fuzz --e2e``: ``count`` scenarios of ``seed`` through the user path; failures written out.

Each scenario is walked in a temporary folder of its own (removed afterwards). A scenario with a failing
check is written to ``OUT/<name>/``: ``scenario.yaml`` (and the trace it reads), ``failure.txt`` (each
failed command line, its exit code and the tail of its output) and ``pytest.txt`` (how to turn it into a
regression test). ``OUT/summary.json`` holds the figures: scenarios, refused, crashed, failures, checks run
and seconds. Every file goes through :func:`sim.trace.output.write_file` (``OUT`` is a real folder, never a
link; a file there that hybridsim did not write is refused unless ``force``, then kept aside). A trace
file has no room for an ownership stamp: one byte-identical to the trace about to be written (the same
scenario of the same seed, written by an earlier run) counts as hybridsim's.
"""

from __future__ import annotations

import hashlib
import json
import os
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
from sim.trace.output import check_output_file, open_output_dir, write_file


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
    interrupted: bool = False

    def line(self) -> str:
        return (
            f"fuzz --e2e seed {self.seed}: {self.scenarios} scenarios, {self.failed} failed, {self.refused} refused, "
            f"{self.crashed} crashed, {sum(self.checks.values())} checks, {self.seconds:.0f} s"
            + (" (interrupted)" if self.interrupted else "")
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
            "interrupted": self.interrupted,
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
    vllm_version: str | None = None,
    force: bool = False,
) -> E2EFigures:
    """Walk scenarios ``start .. start + count - 1`` of ``seed``; ``use_vllm`` None: when vLLM is installed.

    The scenarios are for ``vllm_version`` (default: the installed vLLM's release, else the newest hybridsim
    mirrors). The checks against vLLM (``verify``, the exported tests) run only when the installed vLLM is
    that release: with another one installed they are skipped, and a warning says so."""
    from sim.config.vllm_versions import NEWEST
    from sim.verify import vllm_side

    vllm = _vllm_installed() if use_vllm is None else use_vllm
    installed = vllm_side.installed_release() if vllm else None
    version = vllm_version or installed or NEWEST
    if installed is not None and installed != version:
        echo(
            f"warning: the scenarios are for vLLM {version} but vLLM {vllm_side.vllm_version()} is installed: "
            "the checks against vLLM (verify, exported tests) are skipped"
        )
        vllm = False
    with open_output_dir(out_dir):
        pass  # refused at once when it is a link or a file, not after an hour of walking
    check_output_file(out_dir / "summary.json", force=force, option="-o/--out")
    save = _Saver(out_dir, force, echo)
    figures = E2EFigures(seed=seed)
    began = time.perf_counter()
    cwd = Path.cwd()
    try:
        for index in range(start, start + count):
            data, files = generate(seed, index, version)
            name = str(data["name"])
            files = {"scenario.yaml": yaml.safe_dump(data, sort_keys=False, width=120), **files}
            with tempfile.TemporaryDirectory(prefix=f"hybridsim-{name}-", ignore_cleanup_errors=True) as tmp:
                work = Path(tmp)
                for file_name, text in files.items():
                    write_file(work / file_name, text, stamped=False, within=work)
                rng = np.random.default_rng([seed, index, 1])
                os.chdir(work)  # relative paths (a shrunk scenario's trace) resolve as for a user in that folder
                try:
                    result = walk(work / "scenario.yaml", work, rng, vllm)
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
                _write_failure(save, name, files, result.failures)
                echo(f"{name}: FAILED {result.failures[0].what.splitlines()[0]} (written to {out_dir / name})")
    except KeyboardInterrupt:  # SIGINT/SIGTERM: the figures so far are written, then the command stops (130)
        figures.interrupted = True
        _finish(figures, began, save, echo)
        raise
    _finish(figures, began, save, echo)
    return figures


def _finish(figures: E2EFigures, began: float, save: _Saver, echo: Callable[[str], None]) -> None:
    figures.seconds = time.perf_counter() - began
    save("summary.json", json.dumps(figures.as_dict(), indent=2) + "\n")
    echo(figures.line())


class _Saver:
    """Writes files under the output folder through :func:`write_file`, echoing its notes as warnings."""

    def __init__(self, out_dir: Path, force: bool, echo: Callable[[str], None]) -> None:
        self.out_dir, self.force, self.echo = out_dir, force, echo

    def __call__(self, relative: str, text: str) -> None:
        """A file already there with exactly ``text`` counts as ours (replacing it loses nothing): the proof
        for a trace, which has no room for a stamp, written by an earlier run of the same seed."""
        notes: list[str] = []
        write_file(
            self.out_dir / relative,
            text,
            force=self.force,
            known_sha256=hashlib.sha256(text.encode("utf-8")).hexdigest(),
            notes=notes,
            within=self.out_dir,
            option="-o/--out",
        )
        for note in notes:
            self.echo(f"warning: {note}")


def _write_failure(save: _Saver, name: str, files: dict[str, str], failures: list) -> None:
    for file_name, text in files.items():
        save(f"{name}/{file_name}", text)
    save(f"{name}/failure.txt", "\n".join(f.describe() for f in failures))
    save(
        f"{name}/pytest.txt",
        "A regression test: copy scenario.yaml (and any trace file) into tests/, then in a test run the failed\n"
        "command(s) above through support.cli.invoke (the same in-process command) and assert the exit code\n"
        "and files the check expects (sim/e2e/path.py).\n",
    )
