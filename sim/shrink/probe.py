"""One cheap in-process run of a candidate scenario: no bundle, no tables, no plots.

:func:`probe` builds the components, runs the engine loop (capped at
``max_steps``) and reads what a shrink property needs straight from the loop
and the recorder's columns: the crash, every admission attempt's outcome
signature, the number of steps, and each arrived request with the step it
arrived at (what :mod:`sim.shrink.convert` turns into a step-clock script).

A :class:`~sim.engine.build.CapacityWarning` raised while building the run is
caught and kept in the observation (``capacity_warning``), never printed: a
shrink runs hundreds of candidates and decides itself what to show.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, NamedTuple, Sequence

from sim.config.scenario import Scenario
from sim.core.request import Request
from sim.engine.build import CapacityWarning
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
    ``step`` when the crash is not at an admission (e.g. a decode allocation);
    ``divergence`` the :func:`divergence_kind` of that admission's per-group hits
    (``""`` when the crash is not at an admission).
    """

    step: int
    request_id: str | None
    reason: str
    site: str
    divergence: str = ""


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


NO_DIVERGENCE = "none"


def divergence_kind(hits: Sequence[int], group_types: Sequence[str]) -> str:
    """How an admission's per-group hits (``hit_g*``) diverge, by group type, deepest first.

    ``none`` when every group hit the same number of tokens; else the group
    types ranked by their hit, ties joined with ``=``: ``mamba > full_attention``
    (the Mamba state reaches deeper than full attention's blocks, #46453's
    pattern) is another cause than ``full_attention > mamba``.
    """
    if len(set(hits)) <= 1:
        return NO_DIVERGENCE
    tiers: dict[int, list[str]] = {}
    for hit, kind in zip(hits, group_types):
        if kind not in tiers.setdefault(hit, []):
            tiers[hit].append(kind)
    return " > ".join(" = ".join(tiers[hit]) for hit in sorted(tiers, reverse=True))


class Admitted(NamedTuple):
    """One admission attempt that was admitted (outcome ok/recompute/corrupt/crash)."""

    step: int
    request_id: str
    signature: AdmissionSignature
    #: :func:`divergence_kind` of its per-group hits.
    divergence: str


@dataclass
class Observation:
    """What one capped run showed."""

    crash: CrashSite | None
    #: One entry per admission attempt that was admitted, in order.
    admissions: list[Admitted]
    steps: int
    #: Requests that arrived, in arrival order, with the step each arrived at.
    arrivals: list[tuple[int, Request]]
    num_blocks: int
    #: The run's ``scheduler.prefix_policy``.
    policy: str = ""
    #: First difference from vLLM (``hybridsim verify``'s compare); filled only for a property that needs it.
    difference: Any = None
    #: The capacity warning the build gave (``None``: every request fits an empty pool).
    capacity_warning: str | None = None
    #: The same scenario run under another prefix policy; filled only for a property that needs it.
    contrast: "Observation | None" = None


def with_difference(scenario: Scenario, obs: Observation) -> Observation:
    """``obs`` with the first difference between hybridsim and vLLM on ``scenario`` (``None`` if identical).

    Raises :class:`ValueError` when the scenario is not verifiable or vLLM is missing.
    """
    from sim.verify.run import VerifyStatus, require_vllm, verify_scenario

    require_vllm()
    verdict = verify_scenario(scenario)
    if verdict.status is VerifyStatus.NOT_VERIFIABLE:
        raise ValueError(f"not verifiable: {verdict.reason}")
    obs.difference = verdict.difference
    return obs


def under_policy(scenario: Scenario, policy: str) -> Scenario:
    """``scenario`` with ``scheduler.prefix_policy`` replaced (validated again: a :class:`ValueError` if refused)."""
    data = scenario.model_dump(mode="json")
    data["scheduler"]["prefix_policy"] = policy
    return Scenario.model_validate(data)


def with_contrast(scenario: Scenario, obs: Observation, policy: str, max_steps: int | None) -> Observation:
    """``obs`` with ``contrast``: the run of ``scenario`` under ``policy``, capped as ``obs``'s run was."""
    obs.contrast = probe(under_policy(scenario, policy), max_steps)
    return obs


def probe(scenario: Scenario, max_steps: int | None = None) -> Observation:
    """Run ``scenario`` in process (at most ``max_steps`` steps) and observe it.

    Build errors (a candidate the builder rejects) propagate as the builder's
    exceptions; the caller decides that such a candidate fails the property.
    """
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", CapacityWarning)
        run = build_run(scenario, RunOptions(max_steps=max_steps, retire_finished=False))
    capacity = [str(w.message) for w in caught if issubclass(w.category, CapacityWarning)]
    for w in caught:  # anything else is not ours to swallow
        if not issubclass(w.category, CapacityWarning):
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    components, loop = run.components, run.loop
    try:
        run.env.run(until=loop.process)
    except (StopRun, InvariantViolation):  # a crash, a stall, the step cap: what was recorded is the observation
        pass
    recorder = components.recorder
    cols = {name: list(recorder.column_values("admissions", name)) for name in recorder.admissions.names}
    group_types = [g.spec.kind for g in components.kv_cache_config.groups]
    admissions: list[Admitted] = []
    crash_site, crash_divergence = "step", ""
    for i, outcome in enumerate(cols["outcome"]):
        if outcome == "not_admitted":
            continue
        hits = [cols[f"hit_g{g}"][i] for g in range(components.recorder.num_groups)]
        shape = AdmissionShape(
            kind=cols["kind"][i],
            local=cols["local_tokens"][i] > 0,
            external=cols["external_tokens"][i] > 0,
            diverged=len(set(hits)) > 1,
        )
        signature = AdmissionSignature(outcome, shape, bool(cols["taint_origin"][i]))
        admitted = Admitted(cols["step"][i], cols["request_id"][i], signature, divergence_kind(hits, group_types))
        admissions.append(admitted)
        c = loop.crash
        if c is not None and outcome == "crash" and admitted.request_id == c.request_id and admitted.step == c.step:
            crash_site, crash_divergence = shape.label(), admitted.divergence
    crash = None
    if loop.crash is not None:
        c = loop.crash
        crash = CrashSite(
            step=c.step, request_id=c.request_id, reason=c.reason, site=crash_site, divergence=crash_divergence
        )
    by_id = {r.request_id: r for r in loop.held_requests()}
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
        policy=scenario.scheduler.prefix_policy,
        capacity_warning=capacity[0] if capacity else None,
    )
