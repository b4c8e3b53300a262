"""Named plug-in classes: built-ins registered in code, third-party ones through entry points.

One :class:`Registry` per extension point (prefix-boundary policies,
connectors). Invariants: a name maps to one class; built-ins win over an
entry point of the same name; an entry point is loaded only when its name is
asked for, and must load a subclass of the registry's base class.
"""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """Classes of one kind by name; ``key`` is the scenario key that selects them (for error messages)."""

    def __init__(self, base: type[T], entry_point_group: str, key: str, what: str) -> None:
        self.base = base
        self.entry_point_group = entry_point_group
        self.key = key
        self.what = what
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

    def _plugins(self) -> dict[str, Any]:
        return {ep.name: ep for ep in entry_points(group=self.entry_point_group)}

    def names(self) -> list[str]:
        """Every name: built-ins and installed plug-ins, sorted."""
        return sorted(set(self._classes) | set(self._plugins()))

    def get_class(self, name: str) -> type[T]:
        """The class called ``name``; an unknown name raises a ValueError listing the valid ones."""
        cls = self._classes.get(name)
        if cls is not None:
            return cls
        plugin = self._plugins().get(name)
        if plugin is None:
            raise ValueError(f"{self.key}: unknown {self.what} {name!r}; valid: {', '.join(self.names())}")
        loaded = plugin.load()
        if not (isinstance(loaded, type) and issubclass(loaded, self.base)):
            raise ValueError(f"{self.key}: entry point {name!r} does not load a {self.base.__name__} subclass")
        return loaded

    def create(self, name: str, **options: Any) -> T:
        """Instantiate ``name`` with ``options``; bad options raise a ValueError naming them."""
        cls = self.get_class(name)
        try:
            return cls(**options)
        except TypeError as exc:
            given = ", ".join(sorted(options)) or "none"
            raise ValueError(f"{self.what} {name!r} ({self.key}): {exc} (options given: {given})") from None
