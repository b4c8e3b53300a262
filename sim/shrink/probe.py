"""One cheap in-process run of a candidate scenario: no bundle, no tables, no plots.

:func:`probe` builds the components, runs the engine loop (capped at
``max_steps``) and reads what a shrink property needs straight from the loop
and the recorder's columns: the crash, every admission attempt's outcome
signature, the number of steps, and each arrived request with the step it
arrived at (what :mod:`sim.shrink.convert` turns into a step-clock script).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sim.config.scenario import Scenario
from sim.core.request import Request
from sim.engine.loop import InvariantViolation, StopRun
from sim.engine.run import RunOptions, build_run


@dataclass(frozen=True)
class AdmissionSignature:
    """What makes two admissions "of the same kind" for a shrink property.

    ``shape`` is the admission's :class:`AdmissionShape`; ``tainted`` whether a
    ``corrupt`` outcome comes from reusing a tainted block rather than from the
    admission's own claim.
    """

    outcome: str
    shape: "AdmissionShape"
    tainted: bool


@dataclass(frozen=True)
class CrashSite:
    """A crash: its reason and where it happened.

    ``site`` is :meth:`AdmissionShape.label` of the crashing admission attempt, or
    ``step`` when the crash is not at an admission (e.g. a decode allocation).
    """

    step: int
    request_id: str | None
    reason: str
    site: str


@dataclass(frozen=True)
class AdmissionShape:
    """The kind of an admission attempt, as a crash property compares it.

    ``kind`` is the admissions table's ``kind``; ``local`` / ``external``
    whether the local prefix hit / the connector supplied tokens; ``diverged``
    whether the per-group hits (``hit_g*``) were not all equal.
    """

    kind: str
    local: bool
    external: bool
    diverged: bool

    def label(self) -> str:
        parts = [
            self.kind,
            "local hit" if self.local else "no local hit",
            "external tokens" if self.external else "no external tokens",
            "per-group hits diverged" if self.diverged else "per-group hits equal",
        ]
        return ", ".join(parts)


@dataclass
class Observation:
    """What one capped run showed."""

    crash: CrashSite | None
    #: One (step, request id, signature) per admission attempt that was admitted (outcome ok/recompute/corrupt/crash).
    admissions: list[tuple[int, str, AdmissionSignature]]
    steps: int
    #: Requests that arrived, in arrival order, with the step each arrived at.
    arrivals: list[tuple[int, Request]]
    num_blocks: int
    #: First difference from vLLM (``hybridsim verify``'s compare); filled only for a property that needs it.
    difference: Any = None


def with_difference(scenario: Scenario, obs: Observation) -> Observation:
    """``obs`` with the first difference between hybridsim and vLLM on ``scenario`` (``None`` if identical).

    Raises :class:`ValueError` when the scenario is not verifiable or vLLM is missing.
    """
    from sim.verify.run import EXIT_NOT_VERIFIABLE, require_vllm, verify_scenario

    require_vllm()
    verdict = verify_scenario(scenario)
    if verdict.exit_code == EXIT_NOT_VERIFIABLE:
        raise ValueError(f"not verifiable: {verdict.reason}")
    obs.difference = verdict.difference
    return obs


def probe(scenario: Scenario, max_steps: int | None = None) -> Observation:
    """Run ``scenario`` in process (at most ``max_steps`` steps) and observe it.

    Build errors (a candidate the builder rejects) propagate as the builder's
    exceptions; the caller decides that such a candidate fails the property.
    """
    run = build_run(scenario, RunOptions(max_steps=max_steps))
    components, loop = run.components, run.loop
    try:
        run.env.run(until=loop.process)
    except (StopRun, InvariantViolation):  # a crash, a stall, the step cap: what was recorded is the observation
        pass
    cols = components.recorder.admissions.data
    admissions: list[tuple[int, str, AdmissionSignature]] = []
    crash_site = "step"
    for i, outcome in enumerate(cols["outcome"]):
        if outcome == "not_admitted":
            continue
        hits = {cols[f"hit_g{g}"][i] for g in range(components.recorder.num_groups)}
        shape = AdmissionShape(
            kind=cols["kind"][i],
            local=cols["local_tokens"][i] > 0,
            external=cols["external_tokens"][i] > 0,
            diverged=len(hits) > 1,
        )
        admissions.append(
            (cols["step"][i], cols["request_id"][i], AdmissionSignature(outcome, shape, bool(cols["taint_origin"][i])))
        )
        c = loop.crash
        if c is not None and outcome == "crash" and cols["request_id"][i] == c.request_id and cols["step"][i] == c.step:
            crash_site = shape.label()
    crash = None
    if loop.crash is not None:
        c = loop.crash
        crash = CrashSite(step=c.step, request_id=c.request_id, reason=c.reason, site=crash_site)
    by_id = {r.request_id: r for r in loop.requests}
    arrivals = sorted(
        ((t.arrival_step, by_id[rid]) for rid, t in loop.times.items()),
        key=lambda item: (item[0], item[1].arrival_time),
    )
    return Observation(
        crash=crash,
        admissions=admissions,
        steps=loop.step,
        arrivals=arrivals,
        num_blocks=components.kv_cache_config.num_blocks,
    )
