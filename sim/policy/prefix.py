"""Prefix-boundary policies: where a waiting request's local prefix hit ends.

When a request with ``num_computed_tokens == 0`` is admitted, the scheduler
asks the policy for a :class:`PrefixLookup`; the connector is then shown the
block-aligned ``local_tokens``. If the lookup set ``hit_diverged`` and the
connector adds no external tokens, the scheduler re-runs the plain
``get_computed_blocks`` (vLLM 0.33's fallback), not the policy.

A policy must not change cache state beyond what the kv manager's lookup
methods do (they only read). Built-ins are named after the vLLM behaviour
they reproduce; third-party policies come from the entry point group
``hybridsim.prefix_policies`` (each entry point loads a
:class:`PrefixPolicy` subclass), and :func:`register_prefix_policy` adds one
in-process.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any, ClassVar

from sim.request import Request

ENTRY_POINT_GROUP = "hybridsim.prefix_policies"


@dataclass(frozen=True)
class PrefixLookup:
    """The local prefix hit a policy chose.

    ``blocks`` is a ``KVCacheBlocks`` (one block list per group) for the hit;
    ``shared_prefix_boundary`` is the junction the scheduler stores on the
    request (0 if none); ``hit_diverged`` says the groups disagree and the hit
    is only valid if the connector supplies the lagging state.
    """

    blocks: Any
    local_tokens: int
    shared_prefix_boundary: int
    hit_diverged: bool = False


class PrefixPolicy:
    """Base class: subclasses set ``name`` and implement :meth:`lookup`."""

    name: ClassVar[str] = ""

    def lookup(self, kv_manager: Any, request: Request, connector: Any | None) -> PrefixLookup:
        """Local hit for ``request``; ``connector`` is ``None`` when none is attached."""
        raise NotImplementedError


def reconciled_lookup(kv_manager: Any, request: Request) -> PrefixLookup:
    """vLLM's ``get_computed_blocks``: the fixed-point hit every group agrees on."""
    blocks, num_hit, boundary = kv_manager.get_computed_blocks(request)
    return PrefixLookup(blocks, num_hit, boundary, False)


class ReconciledPolicy(PrefixPolicy):
    """Plain ``get_computed_blocks``, connector-blind.

    Reproduces vLLM 0.33 with any connector that does not declare
    ``supports_divergent_local_hybrid_hits`` (and vLLM without a connector).
    Always consistent; under per-group divergence it may give up a deeper
    Mamba state (the situation of vLLM issue #46453).
    """

    name = "reconciled"

    def lookup(self, kv_manager: Any, request: Request, connector: Any | None) -> PrefixLookup:
        return reconciled_lookup(kv_manager, request)


class PR48425Policy(PrefixPolicy):
    """vLLM PR #48425 as gated in vLLM 0.33 (``Scheduler._get_local_prefix_cache_hit``).

    With a connector attached that declares
    ``supports_divergent_local_hybrid_hits``: ``get_computed_blocks_for_connector``
    (if some group hits deeper than full attention, the reconciled hit; else
    the full-attention hit with ``hit_diverged`` set when a group lags).
    Otherwise plain ``get_computed_blocks``. The ``hit_diverged and
    external == 0`` fallback is the scheduler's.
    """

    name = "pr48425"

    def lookup(self, kv_manager: Any, request: Request, connector: Any | None) -> PrefixLookup:
        if connector is not None and connector.supports_divergent_local_hybrid_hits:
            blocks, num_local, boundary, diverged = kv_manager.get_computed_blocks_for_connector(request)
            return PrefixLookup(blocks, num_local, boundary, bool(diverged))
        return reconciled_lookup(kv_manager, request)


_REGISTRY: dict[str, type[PrefixPolicy]] = {}


def register_prefix_policy(cls: type[PrefixPolicy], name: str | None = None) -> type[PrefixPolicy]:
    """Register a policy class under ``name`` (default ``cls.name``); usable as a decorator."""
    key = name or cls.name
    if not key:
        raise ValueError(f"prefix policy {cls.__qualname__} has no name")
    existing = _REGISTRY.get(key)
    if existing is not None and existing is not cls:
        raise ValueError(f"prefix policy {key!r} is already registered to {existing.__qualname__}")
    _REGISTRY[key] = cls
    return cls


def _plugins() -> dict[str, Any]:
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def prefix_policy_names() -> list[str]:
    """Every policy name: built-ins and installed plugins, sorted."""
    return sorted(set(_REGISTRY) | set(_plugins()))


def get_prefix_policy(name: str, **options: Any) -> PrefixPolicy:
    """Instantiate the policy called ``name``; unknown names raise a ValueError listing valid ones."""
    cls = _REGISTRY.get(name)
    if cls is None:
        plugin = _plugins().get(name)
        if plugin is None:
            raise ValueError(
                f"scheduler.prefix_policy: unknown policy {name!r}; valid: {', '.join(prefix_policy_names())}"
            )
        cls = plugin.load()
        if not (isinstance(cls, type) and issubclass(cls, PrefixPolicy)):
            raise ValueError(f"scheduler.prefix_policy: entry point {name!r} does not load a PrefixPolicy subclass")
    try:
        return cls(**options)
    except TypeError as exc:
        raise ValueError(f"scheduler.prefix_policy {name!r}: {exc}") from None


register_prefix_policy(ReconciledPolicy)
register_prefix_policy(PR48425Policy)
