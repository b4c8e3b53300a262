"""Load a scenario file into a validated :class:`Scenario`; dump it back with every default.

Errors are :class:`ScenarioError` with one line ``FILE:LINE: key.path: message``
(an unknown key adds a did-you-mean and the valid keys). ``--set key.path=value``
overrides are applied to the parsed data before validation; an error in an
overridden value points at the override instead of a file line.

Paths: every string under a key named ``path`` or ending in ``_path`` is taken
relative to the scenario file's folder and stored absolute, so the resolved
scenario loads the same from anywhere.
"""

from __future__ import annotations

import os
import types
import typing
from pathlib import Path
from typing import Any, Sequence

import yaml
from pydantic import BaseModel, ValidationError

from sim.config.scenario import Scenario
from sim.config.yamlio import (
    KeyPath,
    SafeDumper,
    ScenarioError,
    YamlDoc,
    did_you_mean,
    format_path,
    parse_scalar,
    parse_yaml,
    read_yaml_file,
)


def load_scenario(path: str | os.PathLike[str], overrides: Sequence[str] = ()) -> Scenario:
    """Read, override, resolve paths, validate. Raises :class:`ScenarioError`."""
    file = Path(path)
    text = read_yaml_file(file, "scenario")

    return scenario_from_text(text, str(file), base_dir=file.resolve().parent, overrides=overrides)


def scenario_from_text(
    text: str,
    filename: str = "<scenario>",
    *,
    base_dir: str | os.PathLike[str] | None = None,
    overrides: Sequence[str] = (),
) -> Scenario:
    """As :func:`load_scenario`, from a string; relative paths resolve against ``base_dir`` (default: cwd)."""
    doc = parse_yaml(text, filename)
    if doc.data is None:
        raise ScenarioError(f"{filename}:1: <root>: the scenario is empty")
    if not isinstance(doc.data, dict):
        raise ScenarioError(f"{doc.where(())}: <root>: a scenario is a mapping of keys (name, model, cache, ...)")
    set_labels: dict[KeyPath, str] = {}
    for item in overrides:
        key_path, value = _parse_override(item)
        _apply_override(doc, key_path, value)
        set_labels[key_path] = f"--set {item if len(item) <= 80 else item[:80] + '...'}"
    _resolve_paths(doc.data, Path(base_dir) if base_dir is not None else Path.cwd())
    try:
        return Scenario.model_validate(doc.data)
    except ValidationError as exc:
        # An unknown key is most often the typo behind a missing one: report it first.
        errors = sorted(exc.errors(), key=lambda e: e["type"] != "extra_forbidden")
        messages = [_format_error(doc, set_labels, err) for err in errors]
        raise ScenarioError(messages[0], messages) from None


def resolved_yaml(scenario: Scenario) -> str:
    """The scenario with every default filled in; loading it back gives an equal :class:`Scenario`."""
    data = scenario.model_dump(mode="json")
    return yaml.dump(data, Dumper=SafeDumper, sort_keys=False, default_flow_style=False, allow_unicode=True)


# --------------------------------------------------------------------------- overrides


def _parse_override(item: str) -> tuple[KeyPath, Any]:
    key, sep, raw = item.partition("=")
    key = key.strip()
    if not sep or not key or any(not part for part in key.split(".")):
        raise ScenarioError(f"--set {item}: <override>: expected key.path=value (e.g. cache.block_size=32)")
    try:
        value = parse_scalar(raw) if raw.strip() else None
    except ScenarioError as exc:
        raise ScenarioError(f"--set {item}: {key}: value is not valid YAML ({exc})") from None
    path: list[Any] = [int(p) if p.isdigit() else p for p in key.split(".")]
    return tuple(path), value


def _apply_override(doc: YamlDoc, path: KeyPath, value: Any) -> None:
    node = doc.data
    for i, part in enumerate(path[:-1]):
        nxt = path[i + 1]
        if isinstance(node, dict):
            if part not in node or node[part] is None:
                node[part] = [] if isinstance(nxt, int) else {}
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and part < len(node):
            node = node[part]
        else:
            raise ScenarioError(f"--set {format_path(path)}: {format_path(path[: i + 1])}: no such item to set into")
    last = path[-1]
    if isinstance(node, dict):
        node[last] = value
    elif isinstance(node, list) and isinstance(last, int) and last <= len(node):
        if last == len(node):
            node.append(value)
        else:
            node[last] = value
    else:
        raise ScenarioError(f"--set {format_path(path)}: {format_path(path)}: no such item to set")


# --------------------------------------------------------------------------- paths


def _is_path_key(key: Any) -> bool:
    return isinstance(key, str) and (key == "path" or key.endswith("_path"))


def _resolve_paths(node: Any, base: Path) -> None:
    if isinstance(node, dict):
        for key, value in node.items():
            if _is_path_key(key) and isinstance(value, str) and value:
                node[key] = os.path.normpath(str(base / os.path.expanduser(value)))
            else:
                _resolve_paths(value, base)
    elif isinstance(node, list):
        for item in node:
            _resolve_paths(item, base)


# --------------------------------------------------------------------------- errors


def _yaml_path(data: Any, loc: Sequence[Any], keep_last: bool) -> KeyPath:
    """Map a pydantic ``loc`` onto keys present in the data; union tags and validator names are dropped.

    A union tag can equal a real key (a segment's tag ``content`` and its key
    ``content``): a key whose value is a scalar while the loc goes on is a tag.
    With ``keep_last``, a last ``loc`` key that is not in the data (a missing or
    unknown key) is kept.
    """
    path: list[Any] = []
    node = data
    last = len(loc) - 1
    for i, part in enumerate(loc):
        if isinstance(node, dict) and part in node and (i == last or isinstance(node[part], (dict, list))):
            path.append(part)
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            path.append(part)
            node = node[part]
        elif keep_last and i == last and not isinstance(node, list):
            path.append(part)
    return tuple(path)


_BOUNDS = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<="}
_BOUND_CTX = {"greater_than": "gt", "greater_than_equal": "ge", "less_than": "lt", "less_than_equal": "le"}


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation can hold (through Optional, list, dict, Annotated, Union)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    out: list[type[BaseModel]] = []
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _models_in(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType, list, tuple, dict) or origin is not None:
        for arg in typing.get_args(annotation):
            out.extend(_models_in(arg))
    return out


def _keys_at(path: KeyPath) -> list[str]:
    """Field names valid at ``path`` (the mapping that holds the bad key)."""
    candidates: list[type[BaseModel]] = [Scenario]
    for part in path:
        if isinstance(part, int):
            continue
        nxt: list[type[BaseModel]] = []
        for model in candidates:
            field = model.model_fields.get(part)
            if field is not None:
                nxt.extend(_models_in(field.annotation))
        if nxt:
            candidates = nxt
    names: list[str] = []
    for model in candidates:
        for name in model.model_fields:
            if name not in names:
                names.append(name)
    return names


def _format_error(doc: YamlDoc, set_labels: dict[KeyPath, str], err: Any) -> str:
    loc = tuple(err["loc"])
    kind = err["type"]
    path = _yaml_path(doc.data, loc, keep_last=kind in ("missing", "extra_forbidden"))
    msg = str(err["msg"])
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    if msg.startswith("@"):
        sub, _, msg = msg[1:].partition(": ")
        path = path + tuple(int(p) if p.isdigit() else p for p in sub.split("."))
    if kind == "extra_forbidden":
        key = path[-1] if path else loc[-1]
        valid = _keys_at(path[:-1])
        msg = f"unknown key {key!r}{did_you_mean(str(key), valid)} (valid: {', '.join(valid)})"
    elif kind == "literal_error":
        msg = f"invalid value {_short(err.get('input'))} (valid: {err['ctx']['expected']})"
    elif kind == "missing":
        msg = "required key is missing"
    elif kind in _BOUNDS:
        msg = f"must be {_BOUNDS[kind]} {err['ctx'][_BOUND_CTX[kind]]} (got {_short(err.get('input'))})"
    elif kind == "finite_number":
        msg = f"must be a finite number (got {_short(err.get('input'))}); NaN and infinity are refused"
    where = _where(doc, set_labels, path)
    return f"{where}: {format_path(path) or '<root>'}: {msg}"


def _short(value: Any, width: int = 40) -> str:
    """``repr(value)``, cut to ``width`` characters (a 400-digit integer is not echoed whole)."""
    text = repr(value)
    return text if len(text) <= width else text[:width] + "..."


def _where(doc: YamlDoc, set_labels: dict[KeyPath, str], path: KeyPath) -> str:
    p = tuple(path)
    while p:
        if p in set_labels:
            return set_labels[p]
        if p in doc.lines:
            break
        p = p[:-1]
    return doc.where(path)
