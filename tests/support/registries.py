"""The plug-in registries as tests see them.

Tests never spell out the list of valid connector types or prefix, eviction or
checkpoint policies: an installed plug-in adds a name to every such list. They
read the lists from the registries (:class:`Valid`, rendered when a test
compares) and :func:`extra_plugins` installs one extra plug-in of each kind
through its entry point, named to sort first, so that a test can show that an
extra plug-in changes no outcome.
"""

from __future__ import annotations

from importlib.metadata import EntryPoint
from typing import Callable, Iterator

import sim.core.registry
from sim.connector import ENTRY_POINT_GROUP as CONNECTOR_GROUP
from sim.connector import KVConnector, builtin_connector_names, connector_names
from sim.core.policy import checkpoint, eviction, prefix

#: The name every extra plug-in is registered under (it sorts before every built-in).
EXTRA = "aaa_extra_plugin"


class ExtraConnector(KVConnector):
    """A connector that answers nothing (only its name matters here)."""

    name = EXTRA


class ExtraPrefixPolicy(prefix.PR48425Policy):
    name = EXTRA


class ExtraEvictionPolicy(eviction.GroupCoherentPolicy):
    name = EXTRA


class ExtraCheckpointPolicy(checkpoint.BaseCheckpointPolicy):
    name = EXTRA

    def positions(self, request: object, facts: object) -> list[int]:
        return []


#: (entry point group, class attribute of this module) of each registry.
PLUGINS: dict[str, str] = {
    CONNECTOR_GROUP: "ExtraConnector",
    prefix.ENTRY_POINT_GROUP: "ExtraPrefixPolicy",
    eviction.ENTRY_POINT_GROUP: "ExtraEvictionPolicy",
    checkpoint.ENTRY_POINT_GROUP: "ExtraCheckpointPolicy",
}

#: The valid names of each kind, installed plug-ins included, by the scenario key that selects one.
NAMES: dict[str, Callable[[], list[str]]] = {
    "connector.type": connector_names,
    "scheduler.prefix_policy": prefix.prefix_policy_names,
    "cache.eviction_policy": eviction.eviction_policy_names,
    "cache.mamba_checkpoint_policy": checkpoint.checkpoint_policy_names,
}

#: The built-in names of each kind (what the code registers; plug-ins left out).
BUILTIN_NAMES: dict[str, Callable[[], list[str]]] = {
    "connector.type": builtin_connector_names,
    "scheduler.prefix_policy": prefix.builtin_prefix_policy_names,
    "cache.eviction_policy": eviction.builtin_eviction_policy_names,
    "cache.mamba_checkpoint_policy": checkpoint.builtin_checkpoint_policy_names,
}


class Valid:
    """``valid: a, b, c`` for the kind selected by ``key``, read from its registry when rendered."""

    def __init__(self, key: str) -> None:
        self.key = key

    def __str__(self) -> str:
        return "valid: " + ", ".join(NAMES[self.key]())

    def __repr__(self) -> str:
        return f"Valid({self.key!r}) = {self}"


def extra_plugins(monkeypatch) -> Iterator[None]:
    """Install :data:`PLUGINS` through ``importlib.metadata`` entry points for the test's duration (a generator
    for a fixture: ``yield from extra_plugins(monkeypatch)``)."""
    eps = {group: EntryPoint(name=EXTRA, value=f"{__name__}:{attr}", group=group) for group, attr in PLUGINS.items()}

    def entry_points(group: str | None = None, **_: object) -> list[EntryPoint]:
        return [eps[group]] if group in eps else []

    monkeypatch.setattr(sim.core.registry, "entry_points", entry_points)
    yield
