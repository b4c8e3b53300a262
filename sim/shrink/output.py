"""Write a shrunk scenario: an ordinary scenario YAML with a comment header.

The YAML holds only keys that differ from their defaults (loading it gives the
same :class:`Scenario` as the shrink produced); each request and action is one
flow-style line, like the hand-written reproductions in ``scenarios/repro/``.
The header says what the scenario preserves (the ``--keep`` property: for a
``contrast``, also how the final scenario runs under the contrast policy), where
it came from, the reduction figures and the hybridsim version; it holds no
timestamp, so the same input gives byte-identical output. The header quotes
user strings (the source path, a crash reason): each line is escaped so that it
stays one comment line (:func:`comment_text`).
"""

from __future__ import annotations

from pathlib import Path

import yaml

import sim
from sim.config.scenario import Scenario
from sim.shrink.driver import ShrinkResult


def _flow(item: object) -> str:
    return yaml.safe_dump(item, default_flow_style=True, sort_keys=False, width=10**6).strip()


def _whole(value: object) -> object:
    return int(value) if isinstance(value, float) and value.is_integer() else value


def scenario_yaml(scenario: Scenario) -> str:
    """``scenario`` as compact YAML (non-default keys; one line per request and action)."""
    data = scenario.model_dump(mode="json", exclude_defaults=True)
    data["on_crash"] = scenario.on_crash  # always say it: a shrunk crash stops the run
    # Values the validator derives anyway.
    if data.get("outputs", {}).get("schedule_table") == (scenario.clock == "steps"):
        data["outputs"].pop("schedule_table")
    if not data.get("outputs", True):
        data.pop("outputs")
    derived_mode = "align" if scenario.cache.enable_prefix_caching else "none"
    if data.get("cache", {}).get("mamba_cache_mode") == derived_mode:
        data["cache"].pop("mamba_cache_mode")
    lines: list[str] = []
    for key, value in data.items():
        if key == "workload" and value.get("requests") is not None:
            lines.append("workload:")
            rest = {k: v for k, v in value.items() if k != "requests"}
            if rest:
                lines.extend("  " + line for line in _block(rest).splitlines())
            lines.append("  requests:")
            lines.extend(f"  - {_flow(_request_first(r))}" for r in value["requests"])
        elif key == "actions":
            lines.append("actions:")
            lines.extend(f"- {_flow({**a, 'at': _whole(a['at'])})}" for a in value)
        else:
            lines.extend(_block({key: value}).splitlines())
    return "\n".join(lines) + "\n"


def _block(data: dict) -> str:
    [(key, value)] = data.items() if len(data) == 1 else [(None, None)]
    if key is not None and not isinstance(value, (dict, list)):
        return yaml.safe_dump(data, sort_keys=False, default_flow_style=False)
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=120)


def _request_first(request: dict) -> dict:
    """A request's keys in reading order: id, at, prompt, max_tokens, then the rest."""
    ordered = {"id": request["id"], "at": _whole(request.get("at", 0))}
    for key in ("prompt", "max_tokens"):
        ordered[key] = request[key]
    ordered.update({k: v for k, v in request.items() if k not in ordered})
    return ordered


def comment_text(text: str) -> str:
    """``text`` safe inside one YAML comment line: every non-printable character (newlines, tabs, U+0085,
    U+2028, lone surrogates, ...) escaped as ``\\xNN`` / ``\\uNNNN``; what stays is what YAML accepts."""
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in text)


def _contrast_line(result: ShrinkResult) -> str | None:
    run, policy = result.contrast_run, result.property.contrast_policy
    if run is None or policy is None:
        return None
    if run.crash is None:
        return f"Under prefix_policy {policy} it runs clean to the end ({run.steps} steps)."
    return (
        f"Under prefix_policy {policy} it runs clean for the steps the shrink checked, "
        f"but crashes later, at step {run.crash.step} ({run.crash.reason})."
    )


def header(result: ShrinkResult, source: str) -> str:
    r = result
    lines = [
        f"Shrunk by `hybridsim shrink` (hybridsim {sim.__version__}) from {source}.",
        f"Preserves ({r.property.name}): {r.property.describe()};",
        f"  original at step {r.property_step_before}, here at step {r.property_step_after}.",
        f"Reduction: {r.before.line(r.after)}; {r.candidates} candidate runs.",
    ]
    contrast = _contrast_line(r)
    if contrast is not None:
        lines.append(contrast)
    if r.conversions:
        lines.append(f"Rewritten: {'; '.join(r.conversions)}.")
    if r.interrupted:
        lines.append("Interrupted: this is the smallest scenario found before Ctrl-C, not a fixed point.")
    return "".join(f"# {comment_text(line)}\n" for line in lines)


def write_shrunk(
    result: ShrinkResult, source: str, out: Path, *, force: bool = False, notes: list[str] | None = None
) -> None:
    """Write header + YAML to ``out`` through :func:`sim.trace.output.write_file` (a fresh temporary file,
    renamed into place; a link at ``out`` is refused; a file hybridsim did not write is kept unless
    ``force``, then kept aside with a line in ``notes``)."""
    from sim.trace.output import write_file

    write_file(
        out, header(result, source) + scenario_yaml(result.scenario), force=force, notes=notes, option="-o/--out"
    )
