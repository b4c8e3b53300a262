"""Stage 4 of a run: :func:`write_bundle` writes a :class:`~sim.results.finalize.RunResult` to a directory.

The bundle is ``scenario.resolved.yaml``, ``summary.json`` (``partial: true``
unless the run completed or crashed the way the scenario asked) and the
tables, written by :func:`sim.trace.bundle.write_result` (which owns how a
bundle is put on disk), and with ``workload.sessions`` the ``sessions/turns``
and ``sessions/sessions`` tables. A crash also writes ``crash.json`` and a replay
bundle (``replay/replay.yaml`` + ``replay/crash.json``) that
``hybridsim replay`` reproduces; ``crash.json`` names the ``explain``, ``replay``, ``shrink`` and
``export vllm-test`` commands for it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

from sim.config import resolved_yaml
from sim.config.scenario import Scenario
from sim.results.finalize import RunResult
from sim.trace.bundle import write_result, write_session_tables


def _replay_yaml(scenario: Scenario, crash_step: int) -> str:
    """The resolved scenario cut down to what reproduces the crash: arrivals and actions up to the crash step."""
    data = json.loads(scenario.model_dump_json())
    data["on_crash"] = "stop"
    data["name"] = f"{scenario.name}-replay"
    if scenario.clock == "steps":
        data["actions"] = [a for a in data.get("actions", []) if a["at"] <= crash_step]
        wl = data.get("workload", {})
        if wl.get("requests") is not None:
            wl["requests"] = [r for r in wl["requests"] if r.get("at", 0) <= crash_step]
    cut = Scenario.model_validate(data)
    return resolved_yaml(cut)


def _write_crash(out: Path, scenario: Scenario, crash: dict[str, object], final: Path) -> None:
    """``crash.json`` (with the crashing admission's per-group hits) and the replay bundle, into ``out``
    (the staging folder); the commands it names point at ``final``, where the bundle will be."""
    detail = {k: v for k, v in crash.items() if k != "attempt"}
    if "attempt" in crash:
        detail["explain"] = f"hybridsim explain {final} {crash['request_id']} --attempt {crash['attempt']}"
    detail["next"] = (
        f"hybridsim replay {final / 'replay'} reproduces it; hybridsim shrink {final} -o small.yaml reduces it to a "
        "minimal scenario; hybridsim export vllm-test small.yaml -o test_repro.py writes a pytest against vLLM"
    )
    crash_step = int(str(crash["step"]))
    text = json.dumps(detail, indent=2, sort_keys=True) + "\n"
    (out / "crash.json").write_text(text, encoding="utf-8")
    replay = out / "replay"
    replay.mkdir(exist_ok=True)
    (replay / "crash.json").write_text(text, encoding="utf-8")
    (replay / "replay.yaml").write_text(_replay_yaml(scenario, crash_step), encoding="utf-8")


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
            _write_crash(stage, scenario, crash, out)
        if result.session_tables:
            write_session_tables(result.session_tables, stage, scenario.outputs.tables_format)
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
