"""``hybridsim verify``: one scenario through hybridsim and through vLLM, compared decision by decision.

The installed vLLM (0.33 or 0.34) must be the release the scenario names
(``vllm_version``): otherwise the scenario is bad input, with a message
naming both releases and how to install the other or change the scenario.
``fuzz`` generates its scenarios for the installed release.

hybridsim runs in-process with ``on_crash: stop`` (vLLM's engine dies at a
crash, so both sides stop there) and the ``schedule`` table on; every other
key is the scenario's. The vLLM side is :mod:`sim.verify.vllm_side` on the
lowered script of :mod:`sim.verify.lower`.

Verdicts (:class:`VerifyStatus`): identical, differ, bad input (including vLLM
not installed, or another release than the scenario's), not verifiable; the
CLI maps them to exit codes (docs/cli.md).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Callable

from sim.api import RunOptions, run_scenario
from sim.config.scenario import Scenario
from sim.engine.build import CapacityWarning, build_components
from sim.verify import vllm_side
from sim.verify.compare import Difference, first_difference
from sim.verify.decisions import decision_trace
from sim.verify.lower import NotVerifiable, lower, not_verifiable_reason
from sim.verify.vllm_side import DecisionTrace


class VerifyStatus(Enum):
    """A verification's verdict; the CLI maps it to an exit code (``sim.cli.verify``)."""

    IDENTICAL = "identical"
    DIFFER = "differ"
    BAD_INPUT = "bad input"
    NOT_VERIFIABLE = "not verifiable"


#: Several verdicts give the first of these present (bad input, else differ, else not verifiable, else identical).
_PRECEDENCE = (VerifyStatus.BAD_INPUT, VerifyStatus.DIFFER, VerifyStatus.NOT_VERIFIABLE)

INSTALL_HINT = "install the vLLM side with `make vllm-env` (see docs/verify.md)"


class VllmNotInstalled(ValueError):
    """vLLM cannot be imported; the message names the install command."""


@dataclass
class Verdict:
    """The outcome of verifying one scenario."""

    name: str
    status: VerifyStatus
    reason: str = ""
    difference: Difference | None = None
    ours: DecisionTrace | None = None
    theirs: DecisionTrace | None = None

    @property
    def label(self) -> str:
        return self.status.value


def require_vllm() -> None:
    """Import vLLM once (about 10 s); raise :class:`VllmNotInstalled` naming ``make vllm-env`` if it is missing."""
    try:
        vllm_side._load_vllm()
    except vllm_side.VllmMissing as exc:
        raise VllmNotInstalled(f"vLLM is not installed or not importable ({exc}); {INSTALL_HINT}") from None


def hybridsim_trace(scenario: Scenario, max_steps: int) -> DecisionTrace:
    """hybridsim's decision trace of ``scenario`` (run with ``on_crash: stop`` and the schedule table)."""
    outputs = scenario.outputs.model_copy(update={"schedule_table": True, "plots": False})
    run = scenario.model_copy(update={"on_crash": "stop", "outputs": outputs})
    result = run_scenario(run, None, options=RunOptions(max_steps=max_steps, write_plots=False))
    return decision_trace(result.tables, result.summary)


def verify_scenario(scenario: Scenario, quiet: bool = False) -> Verdict:
    """Verify one loaded scenario (vLLM must be importable: see :func:`require_vllm`).

    Raises :class:`~sim.verify.vllm_side.VersionMismatch` when the installed
    vLLM is not the scenario's ``vllm_version``.

    Build-time warnings (e.g. a pool that cannot hold a request alone) are
    shown once, from the first of the two builds; ``quiet`` hides them.
    """
    if scenario.cluster is not None:
        from sim.verify.cluster import verify_cluster

        return verify_cluster(scenario)
    reason = not_verifiable_reason(scenario)
    if reason is not None:
        return Verdict(scenario.name, VerifyStatus.NOT_VERIFIABLE, reason)
    vllm_side.check_release(scenario.vllm_version)
    with warnings.catch_warnings():
        if quiet:
            warnings.simplefilter("ignore", CapacityWarning)
        components = build_components(scenario)
    script = lower(scenario, components)
    theirs = vllm_side.run_script(script)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CapacityWarning)
        ours = hybridsim_trace(scenario, script["max_steps"])
    diff = first_difference(ours, theirs)
    return Verdict(scenario.name, VerifyStatus.DIFFER if diff else VerifyStatus.IDENTICAL, "", diff, ours, theirs)


def verify_file(path: str | Path, overrides: list[str] | None = None) -> Verdict:
    from sim.config import load_scenario

    return verify_scenario(load_scenario(path, overrides or []))


def overall_status(statuses: list[VerifyStatus]) -> VerifyStatus:
    """One verdict for several scenarios: bad input, else differ, else not verifiable, else identical."""
    return next((s for s in _PRECEDENCE if s in statuses), VerifyStatus.IDENTICAL)


def verify_paths(
    paths: list[Path],
    table: Path | None,
    echo: Callable[[str], None],
    overrides: list[str] | None = None,
    *,
    force: bool = False,
) -> VerifyStatus:
    """``hybridsim verify``: verify each scenario file, print verdicts and first differences; the overall verdict.

    ``table``: one scenario -> the CSV file; several -> a directory of ``<name>.csv``; ``overrides``
    (``key.path=value``) apply to every scenario. Tables are written by :func:`sim.trace.output.write_file` (a CSV cannot
    carry an ownership stamp, so an existing file there is replaced only with ``force``, kept aside).
    Bad input (a scenario that does not load or build, vLLM missing) is
    reported per scenario and gives exit 2.
    """
    from sim.config import ScenarioError
    from sim.verify.compare import write_table
    from sim.workload.errors import WorkloadError

    try:
        require_vllm()
    except VllmNotInstalled as exc:
        echo(f"error: {exc}")
        return VerifyStatus.BAD_INPUT
    statuses: list[VerifyStatus] = []
    for path in paths:
        try:
            verdict = verify_file(path, overrides)
        except (ScenarioError, WorkloadError, FileNotFoundError, NotVerifiable, vllm_side.VersionMismatch) as exc:
            status = VerifyStatus.NOT_VERIFIABLE if isinstance(exc, NotVerifiable) else VerifyStatus.BAD_INPUT
            echo(f"{path}: {'not verifiable' if status is VerifyStatus.NOT_VERIFIABLE else 'error'}: {exc}")
            statuses.append(status)
            continue
        statuses.append(verdict.status)
        line = f"{path}: {verdict.label}"
        if verdict.reason:
            line += f" ({verdict.reason})"
        echo(line)
        if verdict.difference is not None:
            echo(verdict.difference.describe())
        if table is not None and verdict.ours is not None and verdict.theirs is not None:
            target = table if len(paths) == 1 else table / f"{verdict.name}.csv"
            notes: list[str] = []
            written = write_table(target, verdict.ours, verdict.theirs, force=force, notes=notes)
            echo(f"  table: {written}")
            for note in notes:
                echo(f"warning: {note}")
    return overall_status(statuses)


@dataclass
class FuzzCounts:
    identical: int = 0
    differing: int = 0
    not_verifiable: int = 0
    refused: int = 0

    def line(self) -> str:
        return (
            f"identical {self.identical}, differing {self.differing}, not verifiable {self.not_verifiable}, "
            f"refused by hybridsim {self.refused}"
        )


def fuzz_command(
    seed: int,
    count: int,
    use_vllm: bool,
    out_dir: Path | None,
    echo: Callable[[str], None],
    vllm_version: str | None = None,
    *,
    force: bool = False,
) -> VerifyStatus:
    """``hybridsim fuzz``: generate ``count`` scenarios of ``seed``; with ``use_vllm`` verify each.

    The scenarios are for ``vllm_version`` (default: the installed vLLM's
    release with ``use_vllm``, else the newest hybridsim mirrors).

    Without ``use_vllm`` every scenario is written to ``out_dir``; with it, each
    differing scenario, with its first difference (``<name>.diff.txt``). ``out_dir``
    defaults to ``results/fuzz-<seed>``.
    Files go through :func:`sim.trace.output.write_file` inside ``out_dir`` (a real folder, never a link;
    a file there that hybridsim did not write is refused unless ``force``, then kept aside).
    ``DIFFER`` if any differ, ``BAD_INPUT`` if vLLM is missing or is not ``vllm_version``, else ``IDENTICAL``.
    """
    from sim.config import ScenarioError
    from sim.config.load import scenario_from_text
    from sim.config.vllm_versions import NEWEST
    from sim.trace.output import open_output_dir, write_file
    from sim.verify.fuzz import generate, scenario_yaml
    from sim.workload.errors import WorkloadError

    notes: list[str] = []

    def save(name: str, text: str) -> None:
        assert out_dir is not None
        write_file(out_dir / name, text, force=force, notes=notes, within=out_dir, option="-o/--out")
        while notes:
            echo(f"warning: {notes.pop(0)}")

    if use_vllm:
        try:
            require_vllm()
        except VllmNotInstalled as exc:
            echo(f"error: {exc}")
            return VerifyStatus.BAD_INPUT
        installed = vllm_side.installed_release()
        if vllm_version is not None and vllm_version != installed:
            echo(
                f"error: --vllm-version {vllm_version} but vLLM {vllm_side.vllm_version()} is installed "
                f"(`make vllm-env VLLM={vllm_version}`)"
            )
            return VerifyStatus.BAD_INPUT
        vllm_version = installed
    out_dir = out_dir or Path("results") / f"fuzz-{seed}"
    version = vllm_version or NEWEST
    with open_output_dir(out_dir):
        pass  # refused at once when it is a link or a file
    counts = FuzzCounts()
    for index in range(count):
        data = generate(seed, index, version)
        text = scenario_yaml(data)
        name = str(data["name"])
        if not use_vllm:
            save(f"{name}.yaml", text)
            continue
        try:
            verdict = verify_scenario(scenario_from_text(text, f"{name}.yaml"), quiet=True)
        except (ScenarioError, WorkloadError, ValueError) as exc:
            counts.refused += 1
            echo(f"{name}: refused by hybridsim: {exc}")
            continue
        if verdict.status is VerifyStatus.IDENTICAL:
            counts.identical += 1
        elif verdict.status is VerifyStatus.NOT_VERIFIABLE:
            counts.not_verifiable += 1
            echo(f"{name}: not verifiable ({verdict.reason})")
        else:
            counts.differing += 1
            assert verdict.difference is not None
            save(f"{name}.yaml", text)
            save(f"{name}.diff.txt", verdict.difference.describe() + "\n")
            echo(
                f"{name}: differ at step {verdict.difference.step}: {verdict.difference.what} "
                f"(written to {out_dir / (name + '.yaml')})"
            )
    if use_vllm:
        echo(f"fuzz seed {seed}, {count} scenarios for vLLM {vllm_side.vllm_version()}: {counts.line()}")
        return VerifyStatus.DIFFER if counts.differing else VerifyStatus.IDENTICAL
    echo(f"fuzz seed {seed}: generated {count} scenarios in {out_dir}")
    return VerifyStatus.IDENTICAL
