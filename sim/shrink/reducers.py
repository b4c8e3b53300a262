"""Edits of a scenario dict that keep it well formed (the moves the shrink driver tries).

Every function takes the JSON-able dict of a resolved scenario and returns a
*new* dict (the input is never mutated). Dropping a request also drops what
depends on it: requests that quote its output (``output_of``), ``evict``
actions with ``prefix_of`` it, and its entries in the connector's per-request
maps and lists (``matched_tokens: {r: N}``, ``requests: [r]``, ...).
"""

from __future__ import annotations

import copy
from typing import Any, Callable, Sequence


def request_ids(data: dict) -> list[str]:
    return [r["id"] for r in data["workload"].get("requests") or []]


def _quotes(request: dict) -> set[str]:
    return {seg["output_of"] for seg in request["prompt"] if "output_of" in seg}


def with_requests(data: dict, requests: Sequence[dict]) -> dict:
    """``data`` with only ``requests`` (a subsequence of its script), and nothing that refers to the others."""
    original = set(request_ids(data))
    kept = list(requests)
    while True:  # a request quoting a dropped request's output goes too
        ids = {r["id"] for r in kept}
        nxt = [r for r in kept if _quotes(r) <= ids]
        if len(nxt) == len(kept):
            break
        kept = nxt
    ids = {r["id"] for r in kept}
    out = copy.deepcopy({k: v for k, v in data.items() if k not in ("workload", "actions", "connector")})
    out["workload"] = {
        **copy.deepcopy({k: v for k, v in data["workload"].items() if k != "requests"}),
        "requests": copy.deepcopy(kept),
    }
    out["actions"] = [
        copy.deepcopy(a) for a in data.get("actions", []) if a.get("evict") is None or a["evict"]["prefix_of"] in ids
    ]
    out["connector"] = _filter_connector(data.get("connector", {}), original, ids)
    return out


def _filter_connector(connector: dict, original: set[str], kept: set[str]) -> dict:
    """Drop dropped requests from the connector's per-request maps and lists (keys/items that are request ids)."""
    out: dict[str, Any] = {}
    for key, value in connector.items():
        if isinstance(value, dict) and value and set(value) <= original:
            value = {k: v for k, v in value.items() if k in kept}
        elif isinstance(value, list) and value and all(isinstance(v, str) for v in value) and set(value) <= original:
            value = [v for v in value if v in kept]
        out[key] = copy.deepcopy(value)
    return out


def _streams(request: dict) -> set[str]:
    return {seg.get("content") or f"output of {seg['output_of']}" for seg in request["prompt"]}


def sharing_content(requests: Sequence[dict], target: str) -> list[dict]:
    """The requests whose prompts share a content stream with request ``target`` (it included), in order."""
    wanted = next((_streams(r) for r in requests if r["id"] == target), set())
    return [r for r in requests if r["id"] == target or _streams(r) & wanted]


def with_actions(data: dict, actions: Sequence[dict]) -> dict:
    out = copy.deepcopy({k: v for k, v in data.items() if k != "actions"})
    out["actions"] = copy.deepcopy(list(actions))
    return out


def with_evict_blocks(data: dict, index: int, blocks: Sequence[int]) -> dict:
    out = copy.deepcopy(data)
    out["actions"][index]["evict"]["blocks"] = list(blocks)
    return out


def truncate_prompt(prompt: list[dict], length: int) -> list[dict]:
    """The first ``length`` tokens of a prompt's segments."""
    out: list[dict] = []
    left = length
    for seg in prompt:
        if left <= 0:
            break
        take = min(seg["tokens"], left)
        out.append({**seg, "tokens": take})
        left -= take
    return out


def prompt_length(request: dict) -> int:
    return sum(seg["tokens"] for seg in request["prompt"])


def with_prompt_length(request: dict, length: int) -> dict:
    """``request`` (a new dict) with its prompt truncated to ``length`` tokens."""
    return {**copy.deepcopy(request), "prompt": truncate_prompt(request["prompt"], length)}


def with_max_tokens(request: dict, max_tokens: int) -> dict:
    """``request`` (a new dict) with ``max_tokens`` lowered; ``output_len`` is capped at it."""
    out = {**copy.deepcopy(request), "max_tokens": max_tokens}
    if out.get("output_len") is not None:
        out["output_len"] = min(out["output_len"], max_tokens)
    return out


def with_request_field(data: dict, index: int, **changes: Any) -> dict:
    """``data`` with request ``index`` changed (``prompt_length=N`` truncates; ``max_tokens`` caps ``output_len``)."""
    out = copy.deepcopy(data)
    request = out["workload"]["requests"][index]
    if "prompt_length" in changes:
        request = with_prompt_length(request, changes["prompt_length"])
    if "max_tokens" in changes:
        request = with_max_tokens(request, changes["max_tokens"])
    out["workload"]["requests"][index] = request
    return out


def with_all(data: dict, change: Callable[[dict], dict]) -> dict:
    """``data`` with ``change`` applied to every request."""
    out = copy.deepcopy({k: v for k, v in data.items() if k != "workload"})
    out["workload"] = {
        **copy.deepcopy({k: v for k, v in data["workload"].items() if k != "requests"}),
        "requests": [change(r) for r in data["workload"]["requests"]],
    }
    return out


def event_times(data: dict) -> list[int]:
    """The distinct steps at which requests arrive or actions apply, ascending."""
    times = {int(r["at"]) for r in data["workload"]["requests"]} | {int(a["at"]) for a in data.get("actions", [])}
    return sorted(times)


def shift_from(data: dict, start: int, delta: int) -> dict:
    """Every request and action at step ``>= start`` moved ``delta`` steps earlier."""
    out = copy.deepcopy(data)
    for item in out["workload"]["requests"] + out.get("actions", []):
        if item["at"] >= start:
            item["at"] = int(item["at"]) - delta
    return out


def without_group(data: dict, index: int) -> dict | None:
    """``data`` without explicit group ``index``; evictions of it go, indices above it move down."""
    groups = data["cache"].get("groups")
    if not groups or len(groups) < 2:
        return None
    out = copy.deepcopy(data)
    del out["cache"]["groups"][index]
    remaining = {g if isinstance(g, str) else g["type"] for g in out["cache"]["groups"]}
    actions = []
    for action in out.get("actions", []):
        ev = action.get("evict")
        if ev is not None:
            if isinstance(ev["group"], int):
                if ev["group"] == index:
                    continue
                if ev["group"] > index:
                    ev["group"] -= 1
            elif ev["group"] not in remaining:
                continue
        actions.append(action)
    out["actions"] = actions
    return out


def with_setting(data: dict, section: str, key: str, value: Any) -> dict:
    out = copy.deepcopy(data)
    out[section][key] = value
    return out
