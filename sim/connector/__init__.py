"""KV connectors: the scheduler-side protocol, built-ins and a plugin registry.

Built-ins are registered by name; third-party connectors come from the entry
point group ``hybridsim.connectors`` (each entry point loads a
:class:`~sim.connector.base.KVConnector` subclass). Built-ins win over plugins
of the same name.
"""

from __future__ import annotations

from sim.connector.base import KVConnector, NoConnector
from sim.connector.faulty import FaultyConnector
from sim.connector.multi import MultiConnector
from sim.connector.offload import OffloadConnector
from sim.connector.remote import RemoteConnector
from sim.connector.scripted import ScriptedConnector
from sim.core.registry import Registry

ENTRY_POINT_GROUP = "hybridsim.connectors"

_REGISTRY: Registry[KVConnector] = Registry(KVConnector, ENTRY_POINT_GROUP, "connector.type", "connector")
register_connector = _REGISTRY.register
connector_names = _REGISTRY.names
builtin_connector_names = _REGISTRY.builtin_names
get_connector_class = _REGISTRY.get_class
create_connector = _REGISTRY.create


register_connector(NoConnector)
register_connector(ScriptedConnector)
register_connector(OffloadConnector)
register_connector(RemoteConnector)
register_connector(FaultyConnector)
register_connector(MultiConnector)

__all__ = [
    "ENTRY_POINT_GROUP",
    "FaultyConnector",
    "KVConnector",
    "MultiConnector",
    "OffloadConnector",
    "RemoteConnector",
    "NoConnector",
    "ScriptedConnector",
    "builtin_connector_names",
    "connector_names",
    "create_connector",
    "get_connector_class",
    "register_connector",
]
