"""Named plug-in classes: built-ins registered in code, third-party ones through entry points.

One :class:`Registry` per extension point (prefix-boundary policies,
connectors). Invariants: a name maps to one class; built-ins win over an
entry point of the same name; an entry point is loaded only when its name is
asked for, and must load a subclass of the registry's base class.
"""

from __future__ import annotations

import difflib
import inspect
from importlib.metadata import EntryPoint, entry_points
from typing import Generic, TypeAlias, TypeVar

T = TypeVar("T")

#: A plug-in option as a scenario file can give it: a JSON-like value (YAML scalars, lists and string-keyed
#: mappings of them). Each class checks its own options' types in its ``__init__``.
OptionValue: TypeAlias = "str | int | float | bool | None | list[OptionValue] | dict[str, OptionValue]"


class Registry(Generic[T]):
    """Classes of one kind by name; ``key`` is the scenario key that selects them (for error messages).

    ``options_key`` is the scenario mapping that holds a class's options; by default the mapping that
    holds ``key`` itself (``connector.type`` sits beside the connector's options, so ``type`` is valid there).
    """

    def __init__(
        self, base: type[T], entry_point_group: str, key: str, what: str, options_key: str | None = None
    ) -> None:
        self.base = base
        self.entry_point_group = entry_point_group
        self.key = key
        self.what = what
        parent, _, leaf = key.rpartition(".")
        self.options_key = options_key or parent
        self._sibling_keys = [leaf] if self.options_key == parent else []
        self._classes: dict[str, type[T]] = {}

    def register(self, cls: type[T], name: str | None = None) -> type[T]:
        """Register ``cls`` under ``name`` (default ``cls.name``); usable as a decorator."""
        key = name or getattr(cls, "name", "")
        if not key:
            raise ValueError(f"{self.what} {cls.__qualname__} has no name")
        existing = self._classes.get(key)
        if existing is not None and existing is not cls:
            raise ValueError(f"{self.what} {key!r} is already registered to {existing.__qualname__}")
        self._classes[key] = cls
        return cls

    def _plugins(self) -> dict[str, EntryPoint]:
        return {ep.name: ep for ep in entry_points(group=self.entry_point_group)}

    def names(self) -> list[str]:
        """Every name: built-ins and installed plug-ins, sorted."""
        return sorted(set(self._classes) | set(self._plugins()))

    def builtin_names(self) -> list[str]:
        """The names registered in code (built-ins and in-process registrations, no entry points), sorted."""
        return sorted(self._classes)

    def get_class(self, name: str) -> type[T]:
        """The class called ``name``; an unknown name raises a ValueError listing the valid ones."""
        cls = self._classes.get(name)
        if cls is not None:
            return cls
        plugin = self._plugins().get(name)
        if plugin is None:
            raise ValueError(
                f"{self.key}: unknown {self.what} {name!r}{_did_you_mean(name, self.names())}; "
                f"valid: {', '.join(self.names())}"
            )
        loaded = plugin.load()
        if not (isinstance(loaded, type) and issubclass(loaded, self.base)):
            raise ValueError(f"{self.key}: entry point {name!r} does not load a {self.base.__name__} subclass")
        return loaded

    def create(self, name: str, /, **options: OptionValue) -> T:
        """Instantiate ``name`` with ``options``; an unknown option lists the valid keys, an option declared
        ``bool`` must be a boolean, other bad options raise a ValueError naming them."""
        cls = self.get_class(name)
        _check_options(cls, options, self.options_key, self._sibling_keys)
        try:
            return cls(**options)
        except TypeError as exc:
            given = ", ".join(sorted(options)) or "none"
            raise ValueError(f"{self.what} {name!r} ({self.key}): {exc} (options given: {given})") from None


def _did_you_mean(word: str, options: list[str]) -> str:
    close = difflib.get_close_matches(str(word), options, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _check_options(cls: type[object], options: dict[str, OptionValue], section: str, sibling_keys: list[str]) -> None:
    """Options against ``cls.__init__``'s keyword parameters (skipped when it takes ``**kwargs``)."""
    try:
        params = inspect.signature(cls.__init__).parameters
    except (TypeError, ValueError):
        return
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    valid = sorted(n for n, p in params.items() if n != "self" and p.kind is not inspect.Parameter.VAR_POSITIONAL)
    for key, value in options.items():
        if key not in valid:
            raise ValueError(
                f"{section}.{key}: unknown option{_did_you_mean(key, valid)} (valid: {', '.join(sibling_keys + valid)})"
            )
        if params[key].annotation in (bool, "bool") and not isinstance(value, bool):
            raise ValueError(f"{section}.{key}: must be true or false, got {value!r}"[:200])
