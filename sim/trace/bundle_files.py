"""Reading a result bundle's own files without trusting the bundle (docs/limits.md).

A bundle may come from a bug report or a CI artifact, so its readers (``show``, ``compare``, ``explain``,
``plot``, ``trace diff``, ``replay``, a sweep's resume) trust nothing in it:

* **Paths stay inside.** A name the manifest lists is used only when it is a plain relative path inside the
  bundle (:func:`member_path`): no absolute path (``/proc/self/mem``), no ``..``, no backslash or NUL.
* **Sizes are bounded before reading.** JSON files (``summary.json``, ``manifest.json``, ``crash.json``)
  are read through :mod:`sim.inputfile` within the ``json_bytes`` limit (:func:`read_json`); a table's
  per-group columns are bounded by :data:`MAX_GROUPS` before any column is built.
* **Values are checked against the schema.** ``summary.json`` against :data:`SUMMARY_SCHEMA`
  (:func:`check_summary`): a known key with a value of the wrong type is one line naming the file and the
  key. Keys the schema does not know are kept (extensions); the tables are checked by
  :func:`sim.trace.tables.normalize_table`.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path, PurePosixPath
from typing import Any, Iterable

from sim.inputfile import InputFileError, read_bytes

#: Most KV-cache groups a bundle's tables may have (a column ``hit_g99999999999`` is refused, not built).
MAX_GROUPS = 1024

_GROUP_COLUMN = re.compile(r"^(.*)_g(\d+)$")


class BundleFileError(ValueError):
    """A bundle file that cannot be trusted: ``str()`` is one line naming the file and the field."""


def member_path(directory: Path, rel: object) -> Path | None:
    """``directory / rel`` when ``rel`` names a file inside the bundle, else ``None``.

    Inside means a non-empty relative POSIX path whose parts are plain names: not absolute, no ``.`` or
    ``..`` part, no backslash, NUL or control character."""
    if not isinstance(rel, str) or not rel or len(rel) > 4096:
        return None
    if any(c in rel for c in "\\\0") or not rel.isprintable():
        return None
    parts = PurePosixPath(rel).parts
    if PurePosixPath(rel).is_absolute() or not parts or any(p in (".", "..") for p in parts):
        return None
    if rel.endswith("/") or "//" in rel:
        return None
    return directory.joinpath(*parts)


def read_json(path: Path, what: str) -> Any:
    """A bundle's JSON file: a regular file within the ``json_bytes`` limit, valid JSON (one-line errors)."""
    try:
        data = read_bytes(path, what, "json_bytes")
    except InputFileError as exc:
        raise BundleFileError(str(exc)) from None
    try:
        return json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BundleFileError(f"{path}: not valid JSON ({type(exc).__name__})") from None
    except RecursionError:
        raise BundleFileError(f"{path}: JSON nested too deeply") from None


def check_group_columns(path: Path, columns: Iterable[object]) -> None:
    """Refuse a table whose per-group column names (``hit_g<N>``) claim more than :data:`MAX_GROUPS` groups."""
    for column in columns:
        m = _GROUP_COLUMN.match(str(column))
        if m and (len(m.group(2)) > 6 or int(m.group(2)) >= MAX_GROUPS):
            raise BundleFileError(
                f"{path}: column {str(column)[:40]!r}: a group index from 0 to {MAX_GROUPS - 1} was expected"
            )


# ---------------------------------------------------------------- summary.json

NUMBER = "number"  # an int or float (not a bool), finite
OPT_NUMBER = "number or null"
INT = "integer"
TEXT = "string"
OPT_TEXT = "string or null"
BOOL = "boolean"
COUNTS = {"*": INT}

#: The shape of ``summary.json`` that readers rely on (docs/results.md): nested mappings of key to kind,
#: ``"*"`` standing for any key; a list ``[kind]`` is a list of that kind. Keys not listed are not checked.
SUMMARY_SCHEMA: dict[str, Any] = {
    "name": TEXT,
    "status": TEXT,
    "clock": TEXT,
    "connector": TEXT,
    "policy": TEXT,
    "message": TEXT,
    "lookup_path": TEXT,
    "partial": BOOL,
    "partial_reason": OPT_TEXT,
    "seed": INT,
    "steps": INT,
    "num_steps": INT,
    "num_blocks": {"kind": "integer or null"},
    "simulated_s": NUMBER,
    "block_sizes": [INT],
    "groups": [TEXT],
    "crash": {"kind": "mapping or null"},
    "admissions": {
        "admitted": INT,
        "attempts": INT,
        "fallbacks": INT,
        "hit_diverged": INT,
        "tokens_recomputed": INT,
        "by_outcome": COUNTS,
        "by_policy": {"*": COUNTS},
        "crash_reasons": COUNTS,
        "divergences": COUNTS,
    },
    "cache": {"hit_rate": {"*": OPT_NUMBER}, "prompt_tokens": INT, "first_admissions": INT, "*": "any"},
    "evictions": {"total": INT, "by_group": {"*": {"total": INT, "by_cause": COUNTS}}},
    "goodput": {"*": OPT_NUMBER},
    "latency_s": {"*": {"*": OPT_NUMBER}},
    "requests": {"by_outcome": COUNTS, "*": INT},
    "throughput": {"*": OPT_NUMBER},
}


def _is(kind: str, value: Any) -> bool:
    if kind == "any":
        return True
    if value is None:
        return kind.endswith("or null")
    if kind in (NUMBER, OPT_NUMBER):
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if kind in (INT, "integer or null"):
        return isinstance(value, int) and not isinstance(value, bool)
    if kind in (TEXT, OPT_TEXT):
        return isinstance(value, str)
    if kind == BOOL:
        return isinstance(value, bool)
    if kind == "mapping or null":
        return isinstance(value, dict)
    raise AssertionError(kind)


def _check(node: Any, schema: Any, path: str, file: Path) -> None:
    def fail(expected: str) -> None:
        got = "null" if node is None else type(node).__name__
        raise BundleFileError(f"{file}: {path or '<root>'}: expected {expected}, got {got}")

    if isinstance(schema, str):
        if not _is(schema, node):
            fail(schema if schema != NUMBER else "a finite number")
        return
    if isinstance(schema, list):
        if not isinstance(node, list):
            fail(f"a list of {schema[0]}s")
        for i, item in enumerate(node):
            _check(item, schema[0], f"{path}.{i}", file)
        return
    if set(schema) == {"kind"}:
        if not _is(schema["kind"], node):
            fail(schema["kind"])
        return
    if not isinstance(node, dict):
        fail("a mapping")
    for key, value in node.items():
        sub = schema.get(key, schema.get("*"))
        if sub is not None:
            name = str(key) if str(key).isprintable() and len(str(key)) <= 40 else repr(str(key)[:40])
            _check(value, sub, f"{path}.{name}" if path else name, file)


def check_summary(summary: Any, file: Path) -> dict[str, Any]:
    """``summary`` if it has the shape of :data:`SUMMARY_SCHEMA`, else a :class:`BundleFileError` naming the
    first key whose value has the wrong type."""
    if not isinstance(summary, dict) or not summary:
        raise BundleFileError(f"{file}: expected a non-empty JSON object")
    _check(summary, SUMMARY_SCHEMA, "", file)
    return summary
