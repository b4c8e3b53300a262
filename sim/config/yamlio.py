"""Safe, bounded YAML reading that remembers where every key came from: the one loader for input files.

Every YAML file a user hands the tool (scenarios, sweep/grid files, ``hardware.overrides_path``, a bundle's
``scenario.resolved.yaml``) is read through :func:`read_yaml_file` / :func:`load_yaml_file`, so each gets the
same limits (:mod:`sim.limits`), the same refusal of non-standard tags and duplicate keys, and errors of one
line naming the file.

``parse_yaml`` composes the document with PyYAML's *safe* loader and builds
plain dicts, lists and scalars itself, recording the 1-based line of every key
and list item under its key path. Only the standard YAML tags are accepted: a
``!!python/...`` (or any other application) tag is an error, never code.
Duplicate keys are an error too (PyYAML would silently keep the last).
libyaml's C parser is used when PyYAML was built with it (its nodes carry the
same line marks); otherwise the pure-Python one.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, Iterable

import yaml

KeyPath = tuple[Any, ...]

_STD = "tag:yaml.org,2002:"
#: The safe loader: libyaml's C parser when available (same nodes and marks, several times faster).
SafeLoader: type = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
#: The safe dumper, C emitter when available (same output for plain data).
SafeDumper: type = getattr(yaml, "CSafeDumper", yaml.SafeDumper)

_ALLOWED_TAGS = {_STD + t for t in ("str", "int", "float", "bool", "null", "map", "seq", "timestamp")}


class ScenarioError(ValueError):
    """A scenario that cannot be loaded; ``str()`` is one line: ``FILE:LINE: key.path: message``."""

    def __init__(self, message: str, errors: list[str] | None = None):
        super().__init__(message)
        self.errors = errors or [message]


def format_path(path: Iterable[Any]) -> str:
    return ".".join(str(p) for p in path)


def did_you_mean(word: str, options: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest option, or ``''``."""
    close = difflib.get_close_matches(str(word), list(options), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


class YamlDoc:
    """Parsed data plus the line of every key path in it."""

    def __init__(self, data: Any, lines: dict[KeyPath, int], filename: str):
        self.data = data
        self.lines = lines
        self.filename = filename

    def line_of(self, path: KeyPath) -> int:
        """Line of ``path``, or of its nearest ancestor that is in the file (1 for the root)."""
        p = tuple(path)
        while p:
            if p in self.lines:
                return self.lines[p]
            p = p[:-1]
        return self.lines.get((), 1)

    def where(self, path: KeyPath) -> str:
        return f"{self.filename}:{self.line_of(path)}"


def _tag_name(tag: str) -> str:
    return "!!" + tag[len(_STD) :] if tag.startswith(_STD) else tag


def parse_yaml(text: str, filename: str) -> YamlDoc:
    """Parse one YAML document safely; errors are :class:`ScenarioError` with ``FILE:LINE``.

    Bounded (:mod:`sim.limits`): the text's size, the nesting depth, and the number of values built, counted
    as aliases are expanded (a "billion laughs" document fails after ``yaml_nodes`` values, in bounded memory).
    """
    from sim.limits import limit, over

    if len(text) > limit("yaml_bytes"):
        raise ScenarioError(f"{filename}:1: <file>: " + over("yaml_bytes", len(text), f"{len(text)} characters"))
    max_depth, max_nodes = limit("yaml_depth"), limit("yaml_nodes")
    built = [0]
    loader = SafeLoader(text)
    lines: dict[KeyPath, int] = {}
    try:
        root = loader.get_single_node()
        if root is None:
            return YamlDoc(None, {(): 1}, filename)
        lines[()] = root.start_mark.line + 1

        def build(node: yaml.Node, path: KeyPath) -> Any:
            built[0] += 1
            if built[0] > max_nodes:
                raise ScenarioError(
                    f"{filename}:{node.start_mark.line + 1}: {format_path(path) or '<root>'}: "
                    + over("yaml_nodes", built[0], "the document expands (aliases included) to more values")
                )
            if len(path) > max_depth:
                raise ScenarioError(
                    f"{filename}:{node.start_mark.line + 1}: {format_path(path[:3])}...: "
                    + over("yaml_depth", len(path), f"nesting is {len(path)} levels deep or more")
                )
            if node.tag not in _ALLOWED_TAGS:
                where = f"{filename}:{node.start_mark.line + 1}"
                raise ScenarioError(
                    f"{where}: {format_path(path) or '<root>'}: tag {_tag_name(node.tag)} is not allowed "
                    "(valid: plain YAML scalars, mappings and lists)"
                )
            if isinstance(node, yaml.MappingNode):
                loader.flatten_mapping(node)
                out: dict[Any, Any] = {}
                for knode, vnode in node.value:
                    if not isinstance(knode, yaml.ScalarNode):
                        raise ScenarioError(
                            f"{filename}:{knode.start_mark.line + 1}: {format_path(path) or '<root>'}: "
                            "a key must be a plain scalar"
                        )
                    key = build(knode, path)
                    if key in out:
                        raise ScenarioError(
                            f"{filename}:{knode.start_mark.line + 1}: {format_path(path + (key,))}: duplicate key"
                        )
                    lines[path + (key,)] = knode.start_mark.line + 1
                    out[key] = build(vnode, path + (key,))
                return out
            if isinstance(node, yaml.SequenceNode):
                items = []
                for i, item in enumerate(node.value):
                    lines[path + (i,)] = item.start_mark.line + 1
                    items.append(build(item, path + (i,)))
                return items
            return loader.construct_object(node, deep=True)

        data = build(root, ())
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else 1
        problem = exc.problem or exc.context or "invalid YAML"
        raise ScenarioError(f"{filename}:{line}: <yaml>: {problem}") from None
    except RecursionError:
        raise ScenarioError(f"{filename}:1: <yaml>: " + over("yaml_depth", 0, "nesting is too deep to read")) from None
    finally:
        loader.dispose()
    return YamlDoc(data, lines, filename)


def parse_scalar(text: str) -> Any:
    """A ``--set`` value: a YAML scalar or flow collection (``16``, ``null``, ``[a, b]``, ``{x: 1}``)."""
    doc = parse_yaml(text, "<--set>")
    return doc.data


def read_yaml_file(file: Path, what: str) -> str:
    """The text of a YAML input file, read through :mod:`sim.inputfile` (a regular file, checked before it is
    opened, within the ``yaml_bytes`` limit, UTF-8); anything else is a :class:`ScenarioError` naming the file
    (and, for bad bytes, the byte offset). ``what`` names the kind of file in the message (``scenario``,
    ``sweep file``)."""
    from sim.inputfile import InputFileError, read_text

    try:
        return read_text(file, what, "yaml_bytes")
    except InputFileError as exc:
        raise ScenarioError(str(exc)) from None


def load_yaml_file(file: str | Path, what: str) -> YamlDoc:
    """Read and parse one YAML input file (:func:`read_yaml_file` then :func:`parse_yaml`)."""
    path = Path(file)
    return parse_yaml(read_yaml_file(path, what), str(path))
