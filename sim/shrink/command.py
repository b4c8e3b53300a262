"""What ``hybridsim shrink`` does around the driver: find the scenario, show progress, write, report."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Sequence

from sim.config import ScenarioError, load_scenario
from sim.config.scenario import Scenario
from sim.shrink.driver import ShrinkResult, shrink
from sim.shrink.output import write_shrunk
from sim.shrink.property import DEFAULT_CONTRAST


def scenario_file(source: Path) -> Path:
    """The scenario a shrink starts from: a YAML file, or in a bundle its replay (else its resolved scenario)."""
    if source.is_dir():
        for candidate in (source / "replay" / "replay.yaml", source / "replay.yaml", source / "scenario.resolved.yaml"):
            if candidate.is_file():
                return candidate
        raise ScenarioError(
            f"{source}: not a result or replay bundle (no replay/replay.yaml, replay.yaml or "
            "scenario.resolved.yaml); give a bundle directory or a scenario YAML"
        )
    if not source.is_file():
        raise ScenarioError(f"{source}: no such scenario file or bundle directory")
    return source


class _Bar:
    """A rich progress display: the pass, candidate runs, and the current best's size."""

    def __init__(self, name: str) -> None:
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        self.bar = Progress(
            TextColumn(f"[bold]shrink {name}"),
            BarColumn(),
            TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(),
            transient=True,
        )
        self.task = self.bar.add_task("shrink", total=None, info="")

    def __enter__(self) -> "_Bar":
        self.bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.bar.stop()

    def update(self, pass_name: str, runs: int, sizes: dict) -> None:
        info = (
            f"{pass_name:<12} {runs} runs  best: {sizes['requests']} requests, {sizes['actions']} actions, "
            f"{sizes['tokens']} prompt tokens"
        )
        self.bar.update(self.task, info=info)


def run_shrink(
    source: Path,
    out: Path,
    keep: str,
    overrides: Sequence[str],
    progress: bool,
    contrast: str = DEFAULT_CONTRAST,
    *,
    force: bool = False,
    notes: list[str] | None = None,
) -> ShrinkResult:
    """Shrink ``source`` into ``out``; returns the result (``interrupted`` after Ctrl-C, best so far written).

    ``out`` is checked before the shrink starts (:func:`sim.trace.output.check_output_file`): a link, a folder
    or a file hybridsim did not write (without ``force``) is refused at once."""
    from sim.trace.output import check_output_file

    path = scenario_file(source)
    scenario: Scenario = load_scenario(path, list(overrides))
    if out.exists() and out.is_dir() and not out.is_symlink():
        raise ScenarioError(f"-o/--out {out}: is a directory; give the path of the YAML file to write")
    check_output_file(out, force=force, option="-o/--out")
    started = time.perf_counter()
    isolated = None
    if scenario.cluster is not None:  # a crashed cluster shrinks as its crashing instance alone
        from sim.shrink.isolate import isolate_crash

        isolated = isolate_crash(scenario)
        scenario = isolated.scenario
    if progress:
        with _Bar(scenario.name) as bar:
            result = shrink(scenario, keep, progress=bar.update, contrast=contrast)
    else:
        result = shrink(scenario, keep, contrast=contrast)
    write_shrunk(result, str(source), out, force=force, notes=notes)
    result.wall_s = time.perf_counter() - started
    result.isolated = isolated.note() if isolated is not None else None
    return result
