"""Stage 4 of a run: :func:`write_bundle` writes a :class:`~sim.results.finalize.RunResult` to a directory.

The bundle is ``scenario.resolved.yaml``, ``summary.json`` (``partial: true``
unless the run completed or crashed the way the scenario asked) and the
tables, written by :func:`sim.trace.bundle.write_result` (which owns how a
bundle is put on disk), and with ``workload.sessions`` the ``sessions/turns``
and ``sessions/sessions`` tables; with ``cluster.tier`` the ``tier/tier_events`` table. A crash also writes ``crash.json`` and a replay
bundle (``replay/replay.yaml`` + ``replay/crash.json``, the scenario cut at the crash step by
:mod:`sim.results.replay_cut`) that ``hybridsim replay`` reproduces; ``crash.json`` names the ``explain``,
``replay``, ``shrink`` and ``export vllm-test`` commands for it. If the replay cannot be derived the bundle is
written without ``replay/`` and ``crash.json`` says why in ``replay_note`` (one line).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

from sim.config import resolved_yaml
from sim.config.scenario import Scenario
from sim.results.finalize import RunResult
from sim.results.replay_cut import replay_scenario
from sim.trace.bundle import SESSIONS_DIR, TIER_DIR, write_result, write_side_tables
from sim.trace.output import write_file


def _arrived(result: RunResult, crash_step: int) -> set[str]:
    """The requests the run had seen by the crash step (its ``requests`` table: arrived, rejected or run)."""
    requests = result.tables.get("requests")
    if requests is None or requests.empty:
        return set()
    seen = (requests["outcome"] != "not_arrived") & (requests["arrival_s"] <= crash_step)
    return {str(rid) for rid in requests.loc[seen, "request_id"]}


def _replay_yaml(result: RunResult, scenario: Scenario, crash_step: int) -> tuple[str | None, str | None]:
    """``(replay.yaml text, None)``, or ``(None, note)`` when the replay cannot be derived: deriving an extra
    file never costs the run's bundle, so any failure becomes a one-line note in ``crash.json``."""
    try:
        return resolved_yaml(replay_scenario(scenario, crash_step, _arrived(result, crash_step))), None
    except Exception as exc:  # any failure to derive the replay is noted, never raised
        first = (str(exc).strip().splitlines() or [""])[0]
        return None, f"replay/ not written: deriving the replay scenario failed ({type(exc).__name__}: {first})"


def _write_crash(out: Path, result: RunResult, scenario: Scenario, crash: dict[str, object], final: Path) -> None:
    """``crash.json`` (with the crashing admission's per-group hits) and the replay bundle, into ``out``
    (the staging folder); the commands it names point at ``final``, where the bundle will be."""
    detail = {k: v for k, v in crash.items() if k != "attempt"}
    if "attempt" in crash:
        detail["explain"] = f"hybridsim explain {final} {crash['request_id']} --attempt {crash['attempt']}"
    replay_text, note = _replay_yaml(result, scenario, int(str(crash["step"])))
    replay_hint = f"hybridsim replay {final / 'replay'} reproduces it; " if replay_text is not None else ""
    cluster = scenario.cluster
    if cluster is not None and (cluster.tier is not None or cluster.disaggregated):
        # shrink isolates the crashing instance, which a shared tier or P/D roles tie to the others
        detail["next"] = (
            f"{replay_hint}hybridsim shrink reduces a crashed cluster to its crashing instance alone, which a "
            "shared tier or P/D roles tie to the others: it takes no such cluster"
        )
    else:
        alone = " (the crashing instance alone)" if cluster is not None else ""
        detail["next"] = (
            f"{replay_hint}hybridsim shrink {final} -o small.yaml reduces it to a minimal scenario{alone}; "
            "hybridsim export vllm-test small.yaml -o test_repro.py writes a pytest against vLLM"
        )
    if note is not None:
        detail["replay_note"] = note
    text = json.dumps(detail, indent=2, sort_keys=True) + "\n"
    write_file(out / "crash.json", text, stamped=False)
    if replay_text is None:
        return
    write_file(out / "replay" / "crash.json", text, stamped=False)
    write_file(out / "replay" / "replay.yaml", replay_text, stamped=False)


def write_bundle(
    result: RunResult,
    out_dir: str | Path,
    *,
    force: bool = False,
    draw: Callable[[RunResult, Path], list[Path]] | None = None,
) -> Path:
    """Write ``result``'s bundle into ``out_dir``, whole (:func:`sim.trace.bundle.write_result` stages it
    in a sibling folder and swaps it in); sets ``result.path``, ``result.summary["partial"]`` and, when
    ``draw`` is given (the plotting caller's ``(result, plots_dir) -> paths``), ``result.plots``.
    ``force`` takes over a folder holding files hybridsim did not write (they are kept aside)."""
    scenario = result.scenario
    if scenario is None:
        raise ValueError("write_bundle needs a RunResult from finalize() (it carries the scenario)")
    out = Path(out_dir)
    partial = result.is_partial
    if not result.scenario_yaml:
        result.scenario_yaml = resolved_yaml(scenario)
    result.summary["partial"] = partial
    crash = result.crash_detail

    def extras(stage: Path) -> None:
        if crash is not None:
            _write_crash(stage, result, scenario, crash, out)
        if result.session_tables:
            write_side_tables(SESSIONS_DIR, result.session_tables, stage, scenario.outputs.tables_format)
        if result.tier_tables:
            write_side_tables(TIER_DIR, result.tier_tables, stage, scenario.outputs.tables_format)
        if draw is not None:
            result.plots = [out / p.relative_to(stage) for p in draw(result, stage / "plots")]

    status, message = result.summary.get("status", ""), result.summary.get("message", "")
    write_result(
        out,
        scenario_yaml=result.scenario_yaml,
        summary=result.summary,
        tables=result.tables,
        tables_format=scenario.outputs.tables_format,
        partial=partial,
        reason=f"{status}: {message}" if partial else None,
        extras=extras,
        force=force,
        notes=result.notes,
    )
    result.path = out
    return out
