"""Routers: which instance an arriving request goes to (``cluster.router``, docs/cluster.md).

A router sees each instance through :class:`InstanceState` only: its queue, its load and its published
KV-cache view (:class:`sim.cluster.view.KVCacheView`, possibly stale). It never reads an instance's pool
or scheduler internals, as a real router (llm-d's inference scheduler, Dynamo's KV router) sees only
what the engines publish.

Built-ins:

* ``round_robin``: instance ``i mod n`` for the ``i``-th routed request.
* ``least_loaded``: the fewest queued requests (running + waiting), then the lowest KV usage, then the
  lowest index.
* ``session_affinity``: every turn of a session (``workload.sessions``) goes where its first turn went;
  a request without a session, or a session's first turn, goes to the least loaded instance.
* ``prefix_aware``: the best ``cached fraction - load_weight * load``, where the cached fraction is the
  longest prompt prefix the instance's view holds, over the prompt, and ``load`` is queued requests over
  ``max_num_seqs`` (Dynamo's KV router and llm-d's prefix-cache scorer weigh the same two terms). Plain,
  it counts the full-attention prefix, as those routers do; with ``group_aware: true`` it counts only the
  prefix a hybrid model can resume from: every full-attention block, the sliding-window blocks inside the
  window, and a Mamba state exactly at the boundary. Ties go to the lower load, then the lower index.

Every router is deterministic: the same states give the same choice.
"""

from __future__ import annotations

from math import gcd
from typing import Any, Mapping, Protocol, Sequence

from sim.cluster.view import KVCacheView
from sim.core.kv.hash_view import block_hashes_at
from sim.core.kv.specs import KVCacheConfig, MambaSpec, SlidingWindowSpec
from sim.core.registry import Registry
from sim.core.request import Request

ENTRY_POINT_GROUP = "hybridsim.routers"


class InstanceState(Protocol):
    """What a router may see of one instance."""

    @property
    def index(self) -> int: ...

    @property
    def view(self) -> KVCacheView:
        """The instance's KV-cache view as published to the router."""
        ...

    def queued(self) -> int:
        """Requests running or waiting on the instance."""
        ...

    def load(self) -> float:
        """Queued requests over the instance's ``max_num_seqs``."""
        ...

    def kv_usage(self) -> float:
        """Fraction of the instance's KV-cache blocks in use."""
        ...


class Router:
    """Base class of routers; a plug-in subclasses it and registers under ``hybridsim.routers``."""

    name = ""

    def __init__(self, **options: Any) -> None:
        if options:
            raise ValueError(f"router {self.name!r} takes no options (given: {', '.join(sorted(options))})")

    def choose(self, request: Request, instances: Sequence[InstanceState], config: KVCacheConfig) -> int:
        """The index of the instance ``request`` goes to."""
        raise NotImplementedError


def _least_loaded(instances: Sequence[InstanceState]) -> int:
    return min(instances, key=lambda s: (s.queued(), s.kv_usage(), s.index)).index


class RoundRobinRouter(Router):
    """Instance ``i mod n`` for the ``i``-th routed request."""

    name = "round_robin"

    def __init__(self) -> None:
        self._next = 0

    def choose(self, request: Request, instances: Sequence[InstanceState], config: KVCacheConfig) -> int:
        chosen = self._next % len(instances)
        self._next += 1
        return chosen


class LeastLoadedRouter(Router):
    """The fewest queued requests, then the lowest KV usage, then the lowest index."""

    name = "least_loaded"

    def __init__(self) -> None:
        pass

    def choose(self, request: Request, instances: Sequence[InstanceState], config: KVCacheConfig) -> int:
        return _least_loaded(instances)


class SessionAffinityRouter(Router):
    """A session's turns stay on the instance of its first turn (which goes to the least loaded)."""

    name = "session_affinity"

    def __init__(self) -> None:
        self._home: dict[str, int] = {}

    def choose(self, request: Request, instances: Sequence[InstanceState], config: KVCacheConfig) -> int:
        session = request.metadata.get("session")
        if not isinstance(session, str):
            return _least_loaded(instances)
        home = self._home.get(session)
        if home is None:
            home = self._home[session] = _least_loaded(instances)
        return home


def usable_prefix_tokens(request: Request, view: KVCacheView, config: KVCacheConfig, group_aware: bool) -> int:
    """The longest prefix of ``request``'s prompt (tokens) that ``view`` holds.

    Not ``group_aware``: the shortest full-attention prefix over the full-attention groups (what an
    FA-only prefix router counts). ``group_aware``: the deepest boundary at or below that where every
    sliding-window group holds the blocks of its window before the boundary and every Mamba group holds
    the state block ending at the boundary. A layout without full-attention groups counts from the
    prompt's full length instead of an FA prefix. Without prefix caching nothing is ever cached: 0.
    """
    if not config.enable_prefix_caching:
        return 0
    hashes = request.block_hashes
    hash_block = config.hash_block_size
    limit = request.num_prompt_tokens - 1  # vLLM leaves at least the last prompt token to compute
    fa_tokens = limit
    step = 0
    for g, group in enumerate(config.groups):
        spec = group.spec
        size = spec.block_size
        step = size if step == 0 else step * size // gcd(step, size)
        if isinstance(spec, (MambaSpec, SlidingWindowSpec)):
            continue
        group_hashes = block_hashes_at(hashes, hash_block, size)
        fa_tokens = min(fa_tokens, view.prefix_blocks(g, group_hashes) * size)
    if not group_aware:
        return max(0, fa_tokens)
    boundary = fa_tokens - fa_tokens % step if step else 0
    while boundary > 0:
        if all(_usable_at(request, view, config, g, boundary) for g in range(len(config.groups))):
            return boundary
        boundary -= step
    return 0


def _usable_at(request: Request, view: KVCacheView, config: KVCacheConfig, g: int, boundary: int) -> bool:
    spec = config.groups[g].spec
    size = spec.block_size
    group_hashes = block_hashes_at(request.block_hashes, config.hash_block_size, size)
    last = boundary // size - 1
    if isinstance(spec, MambaSpec):
        return last < len(group_hashes) and view.holds(g, group_hashes[last])
    if isinstance(spec, SlidingWindowSpec):
        first = max(0, (boundary - spec.window) // size)
        return all(view.holds(g, group_hashes[i]) for i in range(first, last + 1))
    return True  # full attention: counted in the prefix already


class PrefixAwareRouter(Router):
    """The best ``cached fraction - load_weight * load``; see the module docstring."""

    name = "prefix_aware"

    def __init__(self, group_aware: bool = False, load_weight: float = 1.0) -> None:
        self.group_aware = group_aware
        self.load_weight = load_weight

    def choose(self, request: Request, instances: Sequence[InstanceState], config: KVCacheConfig) -> int:
        prompt = max(1, request.num_prompt_tokens)

        def score(state: InstanceState) -> tuple[float, float, int]:
            cached = usable_prefix_tokens(request, state.view, config, self.group_aware) / prompt
            return (-(cached - self.load_weight * state.load()), state.load(), state.index)

        return min(instances, key=score).index


_REGISTRY: Registry[Router] = Registry(
    Router, ENTRY_POINT_GROUP, "cluster.router.policy", "router", "cluster.router.options"
)
for _cls in (RoundRobinRouter, LeastLoadedRouter, SessionAffinityRouter, PrefixAwareRouter):
    _REGISTRY.register(_cls)
router_names = _REGISTRY.names
builtin_router_names = _REGISTRY.builtin_names


def create_router(name: str, group_aware: bool, load_weight: float, options: Mapping[str, Any]) -> Router:
    """The router called ``name``; ``group_aware`` and ``load_weight`` go to ``prefix_aware`` only (a plug-in
    takes its ``options``). Unknown names and options raise a ValueError naming the key and the valid values."""
    if name == PrefixAwareRouter.name:
        if options:
            raise ValueError(
                f"cluster.router.options: prefix_aware takes group_aware and load_weight beside policy, "
                f"not options (given: {', '.join(sorted(options))})"
            )
        return PrefixAwareRouter(group_aware=group_aware, load_weight=load_weight)
    if group_aware:
        raise ValueError(f"cluster.router.group_aware: only prefix_aware counts prefixes (policy is {name!r})")
    return _REGISTRY.create(name, **dict(options))
