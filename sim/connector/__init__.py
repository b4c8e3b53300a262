"""KV connectors: the scheduler-side protocol, built-ins and a plugin registry.

Built-ins are registered by name; third-party connectors come from the entry
point group ``hybridsim.connectors`` (each entry point loads a
:class:`~sim.connector.base.KVConnector` subclass). Built-ins win over plugins
of the same name.
"""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any

from sim.connector.base import KVConnector, NoConnector
from sim.connector.faulty import FaultyConnector
from sim.connector.offload import OffloadConnector
from sim.connector.remote import RemoteConnector
from sim.connector.scripted import ScriptedConnector

ENTRY_POINT_GROUP = "hybridsim.connectors"

_REGISTRY: dict[str, type[KVConnector]] = {}


def register_connector(cls: type[KVConnector], name: str | None = None) -> type[KVConnector]:
    """Register a connector class under ``name`` (default ``cls.name``); usable as a decorator."""
    key = name or cls.name
    existing = _REGISTRY.get(key)
    if existing is not None and existing is not cls:
        raise ValueError(f"connector type {key!r} is already registered to {existing.__qualname__}")
    _REGISTRY[key] = cls
    return cls


def _plugin_classes() -> dict[str, Any]:
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def connector_names() -> list[str]:
    """Every connector type name: built-ins and installed plugins, sorted."""
    return sorted(set(_REGISTRY) | set(_plugin_classes()))


def get_connector_class(name: str) -> type[KVConnector]:
    if name in _REGISTRY:
        return _REGISTRY[name]
    plugin = _plugin_classes().get(name)
    if plugin is None:
        raise ValueError(f"connector.type: unknown connector {name!r}; valid: {', '.join(connector_names())}")
    cls = plugin.load()
    if not (isinstance(cls, type) and issubclass(cls, KVConnector)):
        raise ValueError(f"connector.type: entry point {name!r} does not load a KVConnector subclass")
    return cls


def create_connector(name: str, **options: Any) -> KVConnector:
    """Build a connector by type name; bad options raise a ValueError naming them."""
    cls = get_connector_class(name)
    try:
        return cls(**options)
    except TypeError as exc:
        raise ValueError(f"connector {name!r}: {exc}") from None


register_connector(NoConnector)
register_connector(ScriptedConnector)
register_connector(OffloadConnector)
register_connector(RemoteConnector)
register_connector(FaultyConnector)

__all__ = [
    "ENTRY_POINT_GROUP",
    "FaultyConnector",
    "KVConnector",
    "OffloadConnector",
    "RemoteConnector",
    "NoConnector",
    "ScriptedConnector",
    "connector_names",
    "create_connector",
    "get_connector_class",
    "register_connector",
]
