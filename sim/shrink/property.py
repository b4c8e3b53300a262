"""The property a shrink keeps (``--keep``), fixed from the original scenario's run.

* ``crash-reason``: the candidate crashes with exactly the original reason
  string (e.g. ``AssertionError: num_new_tokens > 0``) at an admission of the
  same kind (:class:`~sim.shrink.probe.AdmissionShape`: the admissions table's
  ``kind`` — ``first``, ``after_async_load``, ... —, whether there was a local
  hit, whether the connector supplied tokens, whether the per-group hits
  diverged), or, when the original crash is not at an admission, also not at
  one. The crashing request and step may change.
* ``outcome``: the original's *target admission* is its first admission with
  the worst outcome (``crash`` > ``corrupt`` > ``recompute``). The candidate
  keeps the property when one of its admissions has the same
  :class:`~sim.shrink.probe.AdmissionSignature` (outcome, the admission's
  shape as above, tainted or direct) and, unless that outcome is ``crash``, the
  candidate does not crash.
* ``first-difference``: ``hybridsim verify``'s comparison still finds a
  difference between hybridsim and vLLM 0.33, in the same item: the
  difference's ``what`` with list indices dropped (``kv_events[0].block_id``
  and ``kv_events[3].block_id`` are the same item). The candidate must be
  verifiable (step clock, a verifiable policy and connector); each candidate
  runs vLLM's scheduler in process (:mod:`sim.verify.run`), so this is slower.

The default (``auto``) is ``crash-reason`` when the original crashes, else ``outcome``.
A run capped at the step limit that has not shown the property fails it, and
the driver accepts a candidate only if it shows the property no later than
the best scenario so far (steps are one of the sizes being reduced).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Protocol

from sim.shrink.probe import AdmissionSignature, Observation

KEEP_CHOICES = ("auto", "crash-reason", "outcome", "first-difference")
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
    reason: str
    site: str
    name: str = "crash-reason"
    needs_vllm: bool = False

    def holds(self, obs: Observation) -> bool:
        return obs.crash is not None and obs.crash.reason == self.reason and obs.crash.site == self.site

    def step(self, obs: Observation) -> int:
        assert obs.crash is not None
        return obs.crash.step

    def request(self, obs: Observation) -> str | None:
        assert obs.crash is not None
        return obs.crash.request_id

    def describe(self) -> str:
        where = "outside an admission" if self.site == "step" else f"at an admission ({self.site})"
        return f"crash {self.reason!r} {where}"


@dataclass(frozen=True)
class SameOutcome:
    target: AdmissionSignature
    name: str = "outcome"
    needs_vllm: bool = False

    def holds(self, obs: Observation) -> bool:
        if self.target.outcome != "crash" and obs.crash is not None:
            return False
        return any(sig == self.target for _, _, sig in obs.admissions)

    def step(self, obs: Observation) -> int:
        return next(step for step, _, sig in obs.admissions if sig == self.target)

    def request(self, obs: Observation) -> str | None:
        return next(rid for _, rid, sig in obs.admissions if sig == self.target)

    def describe(self) -> str:
        t = self.target
        return f"an admission with outcome {t.outcome!r} ({t.shape.label()}, {'tainted' if t.tainted else 'direct'})"


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

    def request(self, obs: Observation) -> str | None:
        return None

    def describe(self) -> str:
        return f"hybridsim and vLLM 0.33 first differ in {self.item}"


def property_for(keep: str, original: Observation) -> Property:
    """The property ``keep`` asks for, as the original run shows it; :class:`ShrinkError` if it shows none."""
    if keep not in KEEP_CHOICES:
        raise ShrinkError(f"--keep {keep!r}: valid: {', '.join(KEEP_CHOICES)}")
    if keep == "auto":
        keep = "crash-reason" if original.crash is not None else "outcome"
    if keep == "first-difference":
        if original.difference is None:
            raise ShrinkError("--keep first-difference: hybridsim and vLLM agree on this scenario (verify: identical)")
        return FirstDifference(difference_item(original.difference.what))
    if keep == "crash-reason":
        if original.crash is None:
            raise ShrinkError("--keep crash-reason: the scenario does not crash")
        return CrashReason(original.crash.reason, original.crash.site)
    worst = max(
        (sig for _, _, sig in original.admissions if sig.outcome in _RANK),
        key=lambda sig: _RANK[sig.outcome],
        default=None,
    )
    if worst is None:
        raise ShrinkError("--keep outcome: every admission is ok (no recompute, corrupt or crash to keep)")
    return SameOutcome(worst)
