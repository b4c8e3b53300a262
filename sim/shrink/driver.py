"""The shrink driver: greedy delta debugging over a scenario until no move keeps the property.

:func:`shrink` runs the original once (uncapped) to fix the property
(:mod:`sim.shrink.property`), then repeats rounds of passes until a whole round
changes nothing:

1. once: a ``clock: time`` replay becomes a step script, and a model preset's
   layout explicit ``cache.groups`` (:mod:`sim.shrink.convert`), each kept only
   if the property holds;
2. drop requests (ddmin; first everything that arrives after the property's step, then
   everything that shares no content stream with the request showing the property),
   drop actions (ddmin), drop blocks from each ``evict`` (ddmin), drop explicit
   groups, drop the connector;
3. whole-workload moves (every ``max_tokens`` to 1; every prompt halved, in
   whole blocks); shorten each prompt (whole scheduler blocks first, then
   tokens) and its ``max_tokens``; close the gaps between arrival steps;
4. shrink ``num_blocks``, ``max_num_seqs`` and ``max_num_batched_tokens``.

Each candidate is validated and run in process by :func:`~sim.shrink.probe.probe`,
capped at ``cap`` steps (the original property step plus a margin); a
candidate the validator or builder rejects fails, and so does one that trips
the capacity warning (a request no empty pool can hold) when the original did
not: a shrunk scenario never warns because of its own shrinking. The
original's warning is shown once per shrink; candidates' are never shown. For
a ``contrast`` property each candidate that shows the base property runs a
second time under the contrast policy, and the final scenario's contrast run
is checked to its end (``ShrinkResult.contrast_to_end``). Failures are memoised by the
candidate's canonical JSON. Every choice is a function of the input alone (no
clock, no randomness), so the same input gives the same output. Ctrl-C stops
the search and keeps the best scenario found so far (``interrupted``).
"""

from __future__ import annotations

import json
import math
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from sim.config.scenario import Scenario
from sim.core.policy import prefix_policy_names
from sim.engine.build import CapacityWarning, build_kv_cache_config
from sim.shrink import convert, reducers
from sim.shrink.probe import Observation, probe, under_policy, with_contrast, with_difference
from sim.shrink.property import DEFAULT_CONTRAST, Contrast, Property, ShrinkError, property_for


@dataclass(frozen=True)
class Figures:
    """Sizes of a scenario that the report compares before and after."""

    requests: int
    actions: int
    prompt_tokens: int
    groups: int
    num_blocks: int
    steps: int

    def line(self, after: "Figures") -> str:
        pairs = [
            (name, getattr(self, name), getattr(after, name))
            for name in ("requests", "actions", "prompt_tokens", "groups", "num_blocks", "steps")
        ]
        return ", ".join(f"{name.replace('_', ' ')} {a} -> {b}" for name, a, b in pairs)


def figures(scenario: Scenario, obs: Observation) -> Figures:
    """Requests/tokens of what arrived (a trace counts its arrived requests), actions, groups, blocks, steps run."""
    return Figures(
        requests=len(obs.arrivals),
        actions=len(scenario.actions),
        prompt_tokens=sum(r.num_prompt_tokens for _, r in obs.arrivals),
        groups=len(build_kv_cache_config(scenario).groups),
        num_blocks=obs.num_blocks,
        steps=obs.steps,
    )


@dataclass
class ShrinkResult:
    scenario: Scenario
    property: Property
    before: Figures
    after: Figures
    property_step_before: int
    property_step_after: int
    candidates: int
    conversions: list[str] = field(default_factory=list)
    interrupted: bool = False
    #: For a ``contrast``: the final scenario's uncapped run under the contrast policy (``None``: no contrast).
    contrast_run: Observation | None = None
    #: Wall time of the shrink, set by the command for the terminal; never written into the scenario.
    wall_s: float | None = None
    #: A crashed cluster's input: which instance was shrunk alone (:mod:`sim.shrink.isolate`), for the terminal.
    isolated: str | None = None


#: Called after each candidate run with (pass name, candidate runs so far, current best figures).
ProgressFn = Callable[[str, int, dict], None]


def step_cap(property_step: int) -> int:
    """Candidate runs stop this many steps in: a bit beyond the original property step."""
    return property_step + max(32, property_step // 4) + 1


class _Search:
    def __init__(self, data: dict, obs: Observation, prop: Property, cap: int, progress: ProgressFn | None) -> None:
        self.best = data
        self.best_obs = obs
        self.prop = prop
        self.cap = cap
        #: The original trips the capacity warning, so a candidate may too.
        self.may_warn = obs.capacity_warning is not None
        self.runs = 0
        self.pass_name = "start"
        self.progress = progress
        #: Candidates that failed (a success becomes the best, so it is never asked again).
        self._failed: set[str] = set()

    def evaluate(self, candidate: dict) -> Observation | None:
        """Run ``candidate``: its observation if it keeps the property no later than the best, else ``None``."""
        self.runs += 1
        try:
            scenario = Scenario.model_validate(candidate)
            obs = probe(scenario, self.cap)
            if obs.capacity_warning is not None and not self.may_warn:
                return None
            if isinstance(self.prop, Contrast):
                if not self._shown_in_time(self.prop.base, obs):
                    return None  # no need to run the contrast
                obs = with_contrast(scenario, obs, self.prop.contrast_policy, self.cap)
            if self.prop.needs_vllm:
                obs = with_difference(scenario, obs)
        except ValueError:  # pydantic, scenario and workload errors: a malformed candidate
            return None
        return obs if self._shown_in_time(self.prop, obs) else None

    def _shown_in_time(self, prop: Property, obs: Observation) -> bool:
        return prop.holds(obs) and prop.step(obs) <= prop.step(self.best_obs)

    def test(self, candidate: dict | None) -> bool:
        """Run ``candidate``; when it keeps the property it becomes the best. The best itself is no change."""
        if candidate is None or candidate == self.best:
            return False
        key = json.dumps(candidate, sort_keys=True)
        if key in self._failed:
            return False
        obs = self.evaluate(candidate)
        if obs is None:
            self._failed.add(key)
        else:
            self.best, self.best_obs = candidate, obs
        if self.progress is not None:
            self.progress(self.pass_name, self.runs, self._sizes())
        return obs is not None

    def _sizes(self) -> dict:
        reqs = self.best["workload"].get("requests") or []
        return {
            "requests": len(self.best_obs.arrivals),
            "actions": len(self.best.get("actions", [])),
            "tokens": sum(reducers.prompt_length(r) for r in reqs) if reqs else 0,
        }

    # ------------------------------------------------------------ generic moves

    def ddmin(self, items: Sequence, build: Callable[[list], dict | None], min_len: int = 0) -> bool:
        """Remove chunks of ``items`` while ``build(rest)`` keeps the property; True if anything went."""
        items = list(items)
        changed = False
        if min_len == 0 and items and self.test(build([])):
            return True
        n = 2
        while len(items) > min_len:
            chunk = max(1, math.ceil(len(items) / n))
            for i in range(0, len(items), chunk):
                rest = items[:i] + items[i + chunk :]
                if len(rest) >= max(min_len, 1) and self.test(build(rest)):
                    items, changed = rest, True
                    n = max(n - 1, 2)
                    break
            else:
                if chunk == 1:
                    break
                n = min(len(items), 2 * n)
        return changed

    def minimize(self, value: int, low: int, build: Callable[[int], dict | None], align: int = 1) -> bool:
        """Lower ``value`` toward ``low`` in steps of ``align`` (smallest first, then bisect)."""
        k_max = (value - low) // align
        if k_max <= 0:
            return False
        if self.test(build(value - k_max * align)):
            return True
        good, bad = 0, k_max
        while bad - good > 1:
            mid = (good + bad) // 2
            if self.test(build(value - mid * align)):
                good = mid
            else:
                bad = mid
        return good > 0

    # ------------------------------------------------------------ passes

    def drop_requests(self) -> bool:
        reqs = self.best["workload"].get("requests")
        if not reqs:
            return False
        changed = False
        step = self.prop.step(self.best_obs)
        if self.best.get("clock") == "steps":
            early = [r for r in reqs if r["at"] <= step]
            if early and len(early) < len(reqs):
                changed |= self.test(reducers.with_requests(self.best, early))
        target = self.prop.request(self.best_obs)
        if target is not None:  # a big jump first: only the requests that share content with the target
            reqs = self.best["workload"]["requests"]
            related = reducers.sharing_content(reqs, target)
            if len(related) < len(reqs):
                changed |= self.test(reducers.with_requests(self.best, related))
        base = self.best
        changed |= self.ddmin(base["workload"]["requests"], lambda rest: reducers.with_requests(base, rest), min_len=1)
        return changed

    def drop_actions(self) -> bool:
        base = self.best
        if not base.get("actions"):
            return False
        return self.ddmin(base["actions"], lambda rest: reducers.with_actions(base, rest))

    def drop_evict_blocks(self) -> bool:
        changed = False
        for i in range(len(self.best.get("actions", []))):
            base = self.best
            ev = base["actions"][i].get("evict")
            if ev is not None and len(ev["blocks"]) > 1:

                def without_blocks(rest: list[Any], i: int = i, b: dict[str, Any] = base) -> dict[str, Any]:
                    return reducers.with_evict_blocks(b, i, rest)

                changed |= self.ddmin(ev["blocks"], without_blocks, min_len=1)
        return changed

    def drop_groups(self) -> bool:
        changed = False
        i = 0
        while i < len(self.best["cache"].get("groups") or []):
            if self.test(reducers.without_group(self.best, i)):
                changed = True
            else:
                i += 1
        return changed

    def drop_connector(self) -> bool:
        if self.best.get("connector", {}).get("type", "none") == "none":
            return False
        return self.test({**self.best, "connector": {"type": "none"}})

    def shorten_requests(self) -> bool:
        reqs = self.best["workload"].get("requests")
        if not reqs:
            return False
        block = build_kv_cache_config(Scenario.model_validate(self.best)).scheduler_block_size
        changed = False
        for i in range(len(reqs)):
            for align in (block, 1):
                length = reducers.prompt_length(self.best["workload"]["requests"][i])
                base = self.best

                def with_prompt_length(n: int, b: dict[str, Any] = base, i: int = i) -> dict[str, Any]:
                    return reducers.with_request_field(b, i, prompt_length=n)

                changed |= self.minimize(length, 1, with_prompt_length, align=align)
            base = self.best
            max_tokens = base["workload"]["requests"][i]["max_tokens"]

            def with_max_tokens(n: int, b: dict[str, Any] = base, i: int = i) -> dict[str, Any]:
                return reducers.with_request_field(b, i, max_tokens=n)

            changed |= self.minimize(max_tokens, 1, with_max_tokens)
        return changed

    def shrink_all(self) -> bool:
        """Whole-workload moves, cheap to try and big when they work: every ``max_tokens`` to 1, then every
        prompt cut to half its length (in whole scheduler blocks) while that keeps the property."""
        reqs = self.best["workload"].get("requests")
        if not reqs or len(reqs) < 2:
            return False
        changed = self.test(reducers.with_all(self.best, lambda r: reducers.with_max_tokens(r, 1)))
        block = build_kv_cache_config(Scenario.model_validate(self.best)).scheduler_block_size
        while True:
            halved = reducers.with_all(
                self.best, lambda r: reducers.with_prompt_length(r, _half(reducers.prompt_length(r), block))
            )
            if halved == self.best or not self.test(halved):
                return changed
            changed = True

    def compact_arrivals(self) -> bool:
        if self.best.get("clock") != "steps" or not self.best["workload"].get("requests"):
            return False
        changed = False
        position = 0
        while position < len(reducers.event_times(self.best)):
            times = reducers.event_times(self.best)
            start = times[position]
            previous = times[position - 1] if position else 0
            if start > previous:
                base = self.best

                def shifted(t: int, b: dict[str, Any] = base, s: int = start) -> dict[str, Any]:
                    return reducers.shift_from(b, s, s - t)

                changed |= self.minimize(start, previous, shifted)
            position += 1
        return changed

    def shrink_limits(self) -> bool:
        changed = False
        block = build_kv_cache_config(Scenario.model_validate(self.best)).scheduler_block_size
        for section, key, low, align in (
            ("cache", "num_blocks", 2, 1),
            ("scheduler", "max_num_seqs", 1, 1),
            ("scheduler", "max_num_batched_tokens", block, block),
        ):
            value = self.best[section].get(key)
            if value is None:
                continue
            base = self.best

            def with_value(v: int, b: dict[str, Any] = base, s: str = section, k: str = key) -> dict[str, Any]:
                return reducers.with_setting(b, s, k, v)

            changed |= self.minimize(value, low, with_value, align=align)
        return changed

    def rounds(self) -> None:
        passes = [
            ("whole workload", self.shrink_all),
            ("requests", self.drop_requests),
            ("actions", self.drop_actions),
            ("evict blocks", self.drop_evict_blocks),
            ("groups", self.drop_groups),
            ("connector", self.drop_connector),
            ("prompts", self.shorten_requests),
            ("arrivals", self.compact_arrivals),
            ("limits", self.shrink_limits),
        ]
        while True:
            changed = False
            for name, run in passes:
                self.pass_name = name
                changed |= run()
            if not changed:
                return


def _half(length: int, block: int) -> int:
    """Half of ``length`` in whole blocks (at least one token)."""
    return max(1, (length // 2) // block * block or length // 2)


def _fix_num_blocks(data: dict, num_blocks: int) -> dict:
    """Pin the derived block count so the limits pass can shrink it."""
    if data["cache"].get("num_blocks") is not None:
        return data
    out = json.loads(json.dumps(data))
    out["cache"]["num_blocks"] = num_blocks
    out["cache"].pop("kv_memory_gb", None)
    return out


def _observe_original(scenario: Scenario, keep: str, contrast: str) -> Observation:
    """The original's uncapped run, with what ``keep`` may read (the contrast run, vLLM's difference)."""
    if contrast not in prefix_policy_names():
        raise ShrinkError(f"--contrast {contrast!r}: not a prefix policy; valid: {', '.join(prefix_policy_names())}")
    original = probe(scenario)
    if original.capacity_warning is not None:  # once per shrink: the input's own warning
        warnings.warn(original.capacity_warning, CapacityWarning, stacklevel=3)
    if keep == "first-difference":
        original = with_difference(scenario, original)
    if keep in ("auto", "contrast") and scenario.scheduler.prefix_policy != contrast:
        try:
            original = with_contrast(scenario, original, contrast, None)
        except ValueError as exc:
            if keep == "contrast":
                raise ShrinkError(f"--contrast {contrast}: the scenario cannot run under it ({exc})") from None
    return original


def shrink(
    scenario: Scenario, keep: str = "auto", progress: ProgressFn | None = None, contrast: str = DEFAULT_CONTRAST
) -> ShrinkResult:
    """Reduce ``scenario`` while it keeps the ``keep`` property (see the module docstring); ``contrast`` is the
    policy a ``contrast`` property compares with."""
    original = _observe_original(scenario, keep, contrast)
    prop = property_for(keep, original)
    prop_step = prop.step(original)
    before = figures(scenario, original)
    data = scenario.model_dump(mode="json")
    if prop.crash:
        data["on_crash"] = "stop"
    data["name"] = f"{scenario.name}-shrunk"
    search = _Search(data, original, prop, step_cap(prop_step), progress)
    conversions: list[str] = []
    interrupted = False
    contrast_run = None
    try:
        search.pass_name = "convert"
        first = search.evaluate(data)
        if first is None:
            raise ShrinkError(f"the scenario does not keep its own property when run capped at {search.cap} steps")
        search.best_obs = first
        step_script = convert.to_step_script(search.best, original.arrivals, original.num_blocks)
        if search.test(step_script):
            conversions.append("time-clock replay -> step-clock script")
        explicit = convert.to_explicit_groups(search.best, build_kv_cache_config(Scenario.model_validate(search.best)))
        if search.test(explicit):
            conversions.append("model preset -> explicit cache.groups")
        search.test(_fix_num_blocks(search.best, search.best_obs.num_blocks))
        search.rounds()
        if prop.contrast_policy is not None:  # the contrast, to the end
            contrast_run = probe(under_policy(Scenario.model_validate(search.best), prop.contrast_policy))
    except KeyboardInterrupt:
        interrupted = True
    best = Scenario.model_validate(search.best)
    final = search.best_obs
    return ShrinkResult(
        scenario=best,
        property=prop,
        before=before,
        after=figures(best, final),
        property_step_before=prop_step,
        property_step_after=prop.step(final),
        candidates=search.runs,
        conversions=conversions,
        interrupted=interrupted,
        contrast_run=contrast_run,
    )
