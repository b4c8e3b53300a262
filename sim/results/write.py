"""Stage 4 of a run: :func:`write_bundle` writes a :class:`~sim.results.finalize.RunResult` to a directory.

The bundle is ``scenario.resolved.yaml``, ``summary.json`` (``partial: true``
unless the run completed or crashed the way the scenario asked) and the
tables, written by :func:`sim.trace.bundle.write_result` (which owns how a
bundle is put on disk). A crash also writes ``crash.json`` and a replay
bundle (``replay/replay.yaml`` + ``replay/crash.json``) that
``hybridsim replay`` reproduces.
"""

from __future__ import annotations

import json
from pathlib import Path

from sim.config import resolved_yaml
from sim.config.scenario import Scenario
from sim.results.finalize import RunResult
from sim.trace.bundle import write_result


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


def _write_crash(out: Path, scenario: Scenario, detail: dict[str, object], crash_step: int) -> None:
    """``crash.json`` (with the crashing admission's per-group hits) and the replay bundle."""
    text = json.dumps(detail, indent=2, sort_keys=True) + "\n"
    (out / "crash.json").write_text(text, encoding="utf-8")
    replay = out / "replay"
    replay.mkdir(exist_ok=True)
    (replay / "crash.json").write_text(text, encoding="utf-8")
    (replay / "replay.yaml").write_text(_replay_yaml(scenario, crash_step), encoding="utf-8")


def write_bundle(result: RunResult, out_dir: str | Path) -> Path:
    """Write ``result``'s bundle into ``out_dir``; sets ``result.path`` and ``result.summary["partial"]``."""
    scenario = result.scenario
    if scenario is None:
        raise ValueError("write_bundle needs a RunResult from finalize() (it carries the scenario)")
    out = Path(out_dir)
    partial = result.is_partial
    if not result.scenario_yaml:
        result.scenario_yaml = resolved_yaml(scenario)
    write_result(
        out,
        scenario_yaml=result.scenario_yaml,
        summary=result.summary,
        tables=result.tables,
        tables_format=scenario.outputs.tables_format,
        partial=partial,
    )
    result.summary["partial"] = partial
    result.path = out
    crash = result.crash_detail
    if crash is not None:
        _write_crash(out, scenario, crash, int(crash["step"]))
    return out
