"""The property a shrink keeps (``--keep``), fixed from the original scenario's run.

A bug report is only as good as its cause: two crashes with the same message
(``AssertionError: num_new_tokens > 0``) can come from different code, so the
default keeps the cause, not just the message.

* ``crash-reason``: the candidate crashes with exactly the original reason
  string at an admission of the same shape
  (:class:`~sim.shrink.probe.AdmissionShape`: the admissions table's ``kind``
  — ``first``, ``after_async_load``, ... —, whether there was a local hit,
  whether the connector supplied tokens, whether the per-group hits diverged),
  or, when the original crash is not at an admission, also not at one. The
  crashing request and step may change.
* ``outcome``: the original's *target admission* is its first admission with
  the worst outcome (``crash`` > ``corrupt`` > ``recompute``). The candidate
  keeps the property when one of its admissions has the same
  :class:`~sim.shrink.probe.AdmissionSignature` (outcome, the admission's
  shape as above, tainted or direct) and, unless that outcome is ``crash``, the
  candidate does not crash.
* ``divergence``: ``crash-reason`` (or, when the original does not crash,
  ``outcome``) and, at the crashing (target) admission, the same
  :func:`~sim.shrink.probe.divergence_kind` of the per-group hits:
  ``mamba > full_attention`` (the Mamba state deeper than full attention),
  ``full_attention > mamba`` or ``none``.
* ``contrast``: ``divergence`` under the scenario's prefix policy, and the
  same scenario under the contrast policy (``pr48425``, or ``--contrast``)
  runs clean: no crash (for a crash), else no crash and no admission with the
  target outcome. The contrast run is capped at the same step as the
  candidate's; the driver checks the final scenario's contrast run to its end.
* ``first-difference``: ``hybridsim verify``'s comparison still finds a
  difference between hybridsim and vLLM 0.33, in the same item: the
  difference's ``what`` with list indices dropped (``kv_events[0].block_id``
  and ``kv_events[3].block_id`` are the same item). The candidate must be
  verifiable (step clock, a verifiable policy and connector); each candidate
  runs vLLM's scheduler in process (:mod:`sim.verify.run`), so this is slower.

The default (``auto``) is ``contrast`` when the original shows a crash or bad
outcome that the contrast policy does not (a bug the prefix policy causes),
else ``divergence``. A run capped at the step limit that has not shown the
property fails it, and the driver accepts a candidate only if it shows the
property no later than the best scenario so far (steps are one of the sizes
being reduced).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Protocol

from sim.shrink.probe import AdmissionSignature, Admitted, Observation

KEEP_CHOICES = ("auto", "crash-reason", "outcome", "divergence", "contrast", "first-difference")
#: The policy a ``contrast`` compares with unless ``--contrast`` names another: vLLM 0.33 with #48425 merged.
DEFAULT_CONTRAST = "pr48425"
_RANK = {"recompute": 1, "corrupt": 2, "crash": 3}


class ShrinkError(ValueError):
    """The input cannot be shrunk for the chosen property (no crash, nothing bad happens, ...)."""


class Property(Protocol):
    @property
    def name(self) -> str:
        """The ``--keep`` choice this property answers."""
        ...

    @property
    def needs_vllm(self) -> bool:
        """The property reads ``Observation.difference`` (the driver then runs vLLM for each candidate)."""
        ...

    @property
    def contrast_policy(self) -> str | None:
        """The prefix policy whose run the property reads as ``Observation.contrast`` (``None``: no contrast run)."""
        ...

    @property
    def crash(self) -> bool:
        """The property is a crash (the shrunk scenario then stops at it: ``on_crash: stop``)."""
        ...

    def holds(self, obs: Observation) -> bool: ...

    def step(self, obs: Observation) -> int:
        """The step at which ``obs`` shows the property (it holds)."""
        ...

    def request(self, obs: Observation) -> str | None:
        """The request that shows the property in ``obs`` (it holds), if one does."""
        ...

    def describe(self) -> str: ...


@dataclass(frozen=True)
class CrashReason:
    """The crash reason at the same admission shape; with ``divergence`` set, also its divergence kind."""

    reason: str
    site: str
    divergence: str | None = None
    needs_vllm: bool = False
    contrast_policy: None = None
    crash: bool = True

    @property
    def name(self) -> str:
        return "crash-reason" if self.divergence is None else "divergence"

    def holds(self, obs: Observation) -> bool:
        c = obs.crash
        if c is None or c.reason != self.reason or c.site != self.site:
            return False
        return self.divergence is None or c.divergence == self.divergence

    def step(self, obs: Observation) -> int:
        assert obs.crash is not None
        return obs.crash.step

    def request(self, obs: Observation) -> str | None:
        assert obs.crash is not None
        return obs.crash.request_id

    def describe(self) -> str:
        where = "outside an admission" if self.site == "step" else f"at an admission ({self.site})"
        return f"crash {self.reason!r} {where}" + _divergence_text(self.divergence)


def _divergence_text(divergence: str | None) -> str:
    if not divergence:  # not kept, or a crash outside an admission (no per-group hits)
        return ""
    if divergence == "none":
        return ", per-group hits equal"
    return f", per-group hits {divergence}"


@dataclass(frozen=True)
class SameOutcome:
    """An admission with the target signature; with ``divergence`` set, also of that divergence kind."""

    target: AdmissionSignature
    divergence: str | None = None
    needs_vllm: bool = False
    contrast_policy: None = None

    @property
    def name(self) -> str:
        return "outcome" if self.divergence is None else "divergence"

    @property
    def crash(self) -> bool:
        return self.target.outcome == "crash"

    def _matches(self, a: Admitted) -> bool:
        return a.signature == self.target and (self.divergence is None or a.divergence == self.divergence)

    def holds(self, obs: Observation) -> bool:
        if self.target.outcome != "crash" and obs.crash is not None:
            return False
        return any(self._matches(a) for a in obs.admissions)

    def step(self, obs: Observation) -> int:
        return next(a.step for a in obs.admissions if self._matches(a))

    def request(self, obs: Observation) -> str | None:
        return next(a.request_id for a in obs.admissions if self._matches(a))

    def describe(self) -> str:
        t = self.target
        return (
            f"an admission with outcome {t.outcome!r} ({t.shape.label()}, {'tainted' if t.tainted else 'direct'})"
            + _divergence_text(self.divergence)
        )


#: A property that a contrast run can be checked against (crash or outcome, with its divergence kind).
Base = CrashReason | SameOutcome


def clean(base: Base, obs: Observation) -> bool:
    """``obs`` (a run under the contrast policy) shows none of what ``base`` keeps: no crash, and for an outcome
    property no admission with its outcome."""
    if obs.crash is not None:
        return False
    return isinstance(base, CrashReason) or all(a.signature.outcome != base.target.outcome for a in obs.admissions)


@dataclass(frozen=True)
class Contrast:
    """``base`` under the scenario's policy, and a clean run under ``contrast_policy``."""

    base: Base
    contrast_policy: str
    name: str = "contrast"
    needs_vllm: bool = False

    @property
    def crash(self) -> bool:
        return self.base.crash

    def holds(self, obs: Observation) -> bool:
        return self.base.holds(obs) and obs.contrast is not None and clean(self.base, obs.contrast)

    def step(self, obs: Observation) -> int:
        return self.base.step(obs)

    def request(self, obs: Observation) -> str | None:
        return self.base.request(obs)

    def describe(self) -> str:
        what = "no crash" if isinstance(self.base, CrashReason) else f"no crash and no {self.base.target.outcome!r}"
        return f"{self.base.describe()}; under prefix_policy {self.contrast_policy} it runs clean ({what})"


def difference_item(what: str) -> str:
    """A difference's item without list indices: ``admissions[2].local`` -> ``admissions[].local``."""
    return re.sub(r"\[\d+\]", "[]", what)


@dataclass(frozen=True)
class FirstDifference:
    item: str
    name: str = "first-difference"
    needs_vllm: bool = True

    def holds(self, obs: Observation) -> bool:
        return obs.difference is not None and difference_item(obs.difference.what) == self.item

    def step(self, obs: Observation) -> int:
        assert obs.difference is not None
        return obs.difference.step if obs.difference.step is not None else obs.steps

    contrast_policy: None = None
    crash: bool = False

    def request(self, obs: Observation) -> str | None:
        return None

    def describe(self) -> str:
        return f"hybridsim and vLLM 0.33 first differ in {self.item}"


def property_for(keep: str, original: Observation) -> Property:
    """The property ``keep`` asks for, as the original run shows it; :class:`ShrinkError` if it shows none.

    For ``auto`` and ``contrast`` the caller fills ``original.contrast`` with the
    run under the contrast policy (left ``None`` when the scenario already runs
    under it).
    """
    if keep not in KEEP_CHOICES:
        raise ShrinkError(f"--keep {keep!r}: valid: {', '.join(KEEP_CHOICES)}")
    if keep == "first-difference":
        if original.difference is None:
            raise ShrinkError("--keep first-difference: hybridsim and vLLM agree on this scenario (verify: identical)")
        return FirstDifference(difference_item(original.difference.what))
    if keep == "crash-reason":
        if original.crash is None:
            raise ShrinkError("--keep crash-reason: the scenario does not crash")
        return CrashReason(original.crash.reason, original.crash.site)
    if keep == "outcome":
        return SameOutcome(_worst(original, keep))
    base: Base
    if original.crash is not None:
        base = CrashReason(original.crash.reason, original.crash.site, original.crash.divergence)
    else:
        target = _worst(original, keep)
        base = SameOutcome(target, next(a.divergence for a in original.admissions if a.signature == target))
    contrast = original.contrast
    if keep == "divergence":
        return base
    if keep == "contrast":
        if contrast is None:
            raise ShrinkError(
                "--keep contrast: the scenario already runs under the contrast policy; name another with --contrast"
            )
        if not clean(base, contrast):
            why = f"crashes ({contrast.crash.reason})" if contrast.crash is not None else "shows it too"
            raise ShrinkError(f"--keep contrast: under the contrast policy the scenario {why}: nothing to contrast")
    elif contrast is None or not clean(base, contrast):  # auto
        return base
    assert contrast is not None
    return Contrast(base, contrast.policy)


def _worst(original: Observation, keep: str) -> AdmissionSignature:
    worst = max(
        (a.signature for a in original.admissions if a.signature.outcome in _RANK),
        key=lambda sig: _RANK[sig.outcome],
        default=None,
    )
    if worst is None:
        raise ShrinkError(f"--keep {keep}: every admission is ok (no recompute, corrupt or crash to keep)")
    return worst
