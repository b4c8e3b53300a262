"""Prefix-boundary policies: where a waiting request's local prefix hit ends.

When a request with ``num_computed_tokens == 0`` is admitted, the scheduler
asks the policy for a :class:`PrefixLookup`; the connector is then shown the
block-aligned ``local_tokens``. If the lookup set ``hit_diverged`` and the
connector adds no external tokens, the scheduler re-runs the plain
``get_computed_blocks`` (vLLM 0.33's fallback), not the policy; a policy
with ``requery_after_fallback`` (the what-if ``pr48425_requery``) then has
the connector asked again at that reconciled boundary. ``mirrors_vllm``
marks the policies whose decisions are vLLM 0.33's (``pr48425``, and
``max_per_group`` through the documented emulation of the pre-#48425
lookup): only those can be verified against vLLM.

A policy must not change cache state beyond what the kv manager's lookup
methods do (they only read). Built-ins are named after the vLLM behaviour
they reproduce; third-party policies come from the entry point group
``hybridsim.prefix_policies`` (each entry point loads a
:class:`PrefixPolicy` subclass), and :func:`register_prefix_policy` adds one
in-process.
"""

from __future__ import annotations

from typing import ClassVar, Final, Protocol, Sequence

from sim.core.kv.block_pool import KVCacheBlock
from sim.core.kv.hashing import BlockHash
from sim.core.kv.kv_cache_manager import KVCacheBlocks
from sim.core.kv.specs import KVCacheConfig
from sim.core.registry import OptionValue, Registry
from sim.core.request import Request

ENTRY_POINT_GROUP = "hybridsim.prefix_policies"


class PerGroupLookups(Protocol):
    """The coordinator's per-group lookup, as the pre-#48425 policies read it (vLLM called it on
    ``kv_cache_manager.coordinator``). ``full_attention_group_id`` is None unless the layout has a
    full-attention group and prefix caching is on."""

    @property
    def full_attention_group_id(self) -> int | None: ...

    def find_longest_cache_hit_per_group(
        self, block_hashes: Sequence[BlockHash], max_cache_hit_length: int
    ) -> tuple[tuple[Sequence[KVCacheBlock], ...], tuple[int, ...]]: ...


class PrefixCacheView(Protocol):
    """What a prefix policy may see of the KV-cache manager: its lookups, which only read the
    prefix cache (:class:`sim.core.kv.kv_cache_manager.KVCacheManager` has them all)."""

    @property
    def kv_cache_config(self) -> KVCacheConfig: ...

    @property
    def coordinator(self) -> PerGroupLookups: ...

    @property
    def empty_kv_cache_blocks(self) -> KVCacheBlocks: ...

    def prefix_cache_lookup_enabled(self, request: Request) -> bool: ...

    def get_computed_blocks(
        self, request: Request, max_cache_hit_length: int | None = None
    ) -> tuple[KVCacheBlocks, int, int]: ...

    def get_computed_blocks_for_connector(
        self, request: Request, max_cache_hit_length: int | None = None
    ) -> tuple[KVCacheBlocks, int, int, bool]: ...

    def create_kv_cache_blocks(self, blocks: tuple[Sequence[KVCacheBlock], ...]) -> KVCacheBlocks: ...


class PolicyConnector(Protocol):
    """What a prefix policy may see of the attached connector: its declared capability."""

    @property
    def supports_divergent_local_hybrid_hits(self) -> bool: ...


class PrefixLookup:
    """The local prefix hit a policy chose.

    ``blocks`` is a ``KVCacheBlocks`` (one block list per group) for the hit;
    ``shared_prefix_boundary`` is the junction the scheduler stores on the
    request (0 if none); ``hit_diverged`` says the groups disagree, so the hit
    is valid only if the connector's external tokens supply what a lagging
    group lacks. What that means is the truth checker's one rule
    (``sim.core.admission_truth``): to continue at ``b = local_tokens + external`` a
    group reads full attention ``[0, b)``, sliding window ``[b - W + 1, b)``,
    or the Mamba state at ``b``; a connector answering ``external > 0``
    writes every attention group's ``[local_tokens, b)`` and, if its
    ``supplies_mamba_state`` says so, the state at ``b``; the rest must be
    resident in the claimed blocks.

    Immutable (its attributes are ``Final``; mypy rejects a write) and compared by value; one is
    built per admission attempt.
    """

    __slots__ = ("blocks", "local_tokens", "shared_prefix_boundary", "hit_diverged")

    def __init__(
        self, blocks: KVCacheBlocks, local_tokens: int, shared_prefix_boundary: int, hit_diverged: bool = False
    ) -> None:
        self.blocks: Final = blocks
        self.local_tokens: Final = local_tokens
        self.shared_prefix_boundary: Final = shared_prefix_boundary
        self.hit_diverged: Final = hit_diverged

    def _fields(self) -> tuple[object, int, int, bool]:
        return (self.blocks, self.local_tokens, self.shared_prefix_boundary, self.hit_diverged)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PrefixLookup):
            return NotImplemented
        return self._fields() == other._fields()

    def __repr__(self) -> str:
        return (
            f"PrefixLookup(blocks={self.blocks!r}, local_tokens={self.local_tokens!r}, "
            f"shared_prefix_boundary={self.shared_prefix_boundary!r}, hit_diverged={self.hit_diverged!r})"
        )


class PrefixPolicy:
    """Base class: subclasses set ``name`` and implement :meth:`lookup`."""

    name: ClassVar[str] = ""
    #: True if runs under this policy are vLLM 0.33's decisions, so that ``hybridsim verify``
    #: can compare them with the real scheduler (vLLM as shipped, or the documented emulation
    #: of the pre-#48425 lookup on the scheduler instance). What-if policies keep False.
    mirrors_vllm: ClassVar[bool] = False
    #: True makes the scheduler ask the connector again at the reconciled boundary after the
    #: ``hit_diverged and external == 0`` fallback (a what-if: vLLM 0.33 does not).
    requery_after_fallback: ClassVar[bool] = False

    def lookup(self, kv_manager: PrefixCacheView, request: Request, connector: PolicyConnector | None) -> PrefixLookup:
        """Local hit for ``request``; ``connector`` is ``None`` when none is attached."""
        raise NotImplementedError

    def lookup_path(self, connector: PolicyConnector | None) -> str:
        """The lookup this policy takes with ``connector`` for the whole run (the run summary's
        ``lookup_path``); the policy's own name unless it switches on the connector."""
        return self.name


def reconciled_lookup(kv_manager: PrefixCacheView, request: Request) -> PrefixLookup:
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

    def lookup(self, kv_manager: PrefixCacheView, request: Request, connector: PolicyConnector | None) -> PrefixLookup:
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
    mirrors_vllm = True

    def lookup(self, kv_manager: PrefixCacheView, request: Request, connector: PolicyConnector | None) -> PrefixLookup:
        if connector is not None and connector.supports_divergent_local_hybrid_hits:
            blocks, num_local, boundary, diverged = kv_manager.get_computed_blocks_for_connector(request)
            return PrefixLookup(blocks, num_local, boundary, bool(diverged))
        return reconciled_lookup(kv_manager, request)

    def lookup_path(self, connector: PolicyConnector | None) -> str:
        """``divergent`` (``get_computed_blocks_for_connector``) with an opted-in connector, else
        ``reconciled`` (plain ``get_computed_blocks``: no connector, or one that does not opt in)."""
        if connector is not None and connector.supports_divergent_local_hybrid_hits:
            return "divergent"
        return "reconciled"


class PR48425RequeryPolicy(PR48425Policy):
    """A what-if, not vLLM: :class:`PR48425Policy`, but after the fallback the connector is asked again.

    vLLM 0.33's scheduler, when the #48425 lookup set ``hit_diverged`` and the
    connector (asked at the full-attention hit) adds 0 tokens, re-runs the
    reconciled ``get_computed_blocks`` and does not ask the connector again,
    so a prefix the connector holds beyond the reconciled boundary is
    recomputed (the truth checker scores that admission ``recompute``). Here
    the scheduler asks the connector again at the reconciled boundary
    (block-aligned) and loads what it answers, to show what that change to
    vLLM would buy. Not verifiable against vLLM (``mirrors_vllm`` is False).
    """

    name = "pr48425_requery"
    requery_after_fallback = True
    mirrors_vllm = False


def _per_group_applies(kv_manager: PrefixCacheView, connector: PolicyConnector | None) -> bool:
    """The gate #44243 and #45804 put on their per-group branch: a connector
    attached, Mamba layers, and the hybrid coordinator with a full-attention
    group (with Mamba layers a full-attention group means several groups, so the
    hybrid coordinator). No capability flag is consulted (that gate came with #48425)."""
    if connector is None or not kv_manager.kv_cache_config.has_mamba_layers:
        return False
    return kv_manager.coordinator.full_attention_group_id is not None


def _per_group_lookup(
    kv_manager: PrefixCacheView, request: Request
) -> tuple[tuple[list[KVCacheBlock], ...], tuple[int, ...]] | None:
    """Each group's own hit (``find_longest_cache_hit_per_group``), capped at
    ``num_tokens - 1`` and the request's hit limit; ``None`` when prefix-cache reads are off for the request."""
    if not kv_manager.prefix_cache_lookup_enabled(request):
        return None
    limit = request.get_max_cache_hit_length()
    blocks, hits = kv_manager.coordinator.find_longest_cache_hit_per_group(request.block_hashes, limit)
    return tuple(list(b) for b in blocks), tuple(hits)


class _PerGroupPolicy(PrefixPolicy):
    """The pre-#48425 per-group lookups (#44243, #45804): each group looked up alone, then combined.

    They apply only with a connector attached, Mamba layers and the hybrid
    coordinator (otherwise plain ``reconciled``); they pin no shared-prefix
    boundary and never set ``hit_diverged``. Subclasses say how the per-group
    hits become one local hit (and may cut the per-group block lists in place).
    """

    def choose(self, kv_manager: PrefixCacheView, blocks: tuple[list[KVCacheBlock], ...], hits: tuple[int, ...]) -> int:
        raise NotImplementedError

    def lookup(self, kv_manager: PrefixCacheView, request: Request, connector: PolicyConnector | None) -> PrefixLookup:
        if not _per_group_applies(kv_manager, connector):
            return reconciled_lookup(kv_manager, request)
        found = _per_group_lookup(kv_manager, request)
        if found is None:
            return PrefixLookup(kv_manager.empty_kv_cache_blocks, 0, 0, False)
        blocks, hits = found
        local = self.choose(kv_manager, blocks, hits)
        return PrefixLookup(kv_manager.create_kv_cache_blocks(blocks), local, 0, False)


class MaxPerGroupPolicy(_PerGroupPolicy):
    """vLLM after PR #44243 ("Fix Mamba prefix cache hit rate in PD disaggregation").

    With a connector attached, Mamba layers and the hybrid coordinator, the
    scheduler took ``find_longest_cache_hit_per_group`` as is: every group's
    claimed blocks are its *own* per-group lookup's blocks (full attention: its
    left-to-right run; Mamba: ``[null]*i + [state]``), and the local hit is
    ``max(per_group_hits)``. No shared-prefix boundary is pinned and
    ``hit_diverged`` is never set. Otherwise plain ``get_computed_blocks``.

    When the Mamba state outlives the full-attention tail (vLLM issue #46453,
    part 1) the hit claims full-attention positions the FA block list does not
    cover: ``allocate_slots`` hands those slots fresh, never-computed blocks
    (dirty KV, which then gets cached), or the local hit plus the connector's
    tokens reaches the end of the prompt (``assert num_new_tokens > 0``).
    """

    name = "max_per_group"
    mirrors_vllm = True

    def choose(self, kv_manager: PrefixCacheView, blocks: tuple[list[KVCacheBlock], ...], hits: tuple[int, ...]) -> int:
        return max(hits)


class TrimToMinPolicy(_PerGroupPolicy):
    """vLLM PR #45804 ("partial prefix caching for hybrid model in PD disaggregation").

    Same gate as :class:`MaxPerGroupPolicy`. The local hit is the minimum over
    the *dense* (full-attention) groups' per-group hits, and every group's
    per-group block list is then cut to ``local // block_size`` blocks. The
    Mamba list is sparse (``[null]*i + [state]``), so when Mamba hits deeper
    than full attention the cut drops its only real block: ``[null, null, null,
    s3]`` becomes ``[null, null]`` (vLLM issue #46453, part 2) and the request
    resumes at the FA hit with no Mamba state there; a fresh fixed-point lookup
    would have found the boundary every group agrees on. When full attention
    is the deeper one, the Mamba list is left as is and the resume boundary
    (the FA hit) again has no Mamba state. No junction, no ``hit_diverged``.
    """

    name = "trim_to_min"

    def choose(self, kv_manager: PrefixCacheView, blocks: tuple[list[KVCacheBlock], ...], hits: tuple[int, ...]) -> int:
        groups = kv_manager.kv_cache_config.groups
        local = min(hits[g] for g, group in enumerate(groups) if group.spec.kind == "full_attention")
        for lst, group in zip(blocks, groups):
            del lst[local // group.spec.block_size :]
        return local


_REGISTRY: Registry[PrefixPolicy] = Registry(PrefixPolicy, ENTRY_POINT_GROUP, "scheduler.prefix_policy", "policy")
register_prefix_policy = _REGISTRY.register
prefix_policy_names = _REGISTRY.names
builtin_prefix_policy_names = _REGISTRY.builtin_names


def get_prefix_policy(name: str, **options: OptionValue) -> PrefixPolicy:
    """Instantiate the policy called ``name``; unknown names raise a ValueError listing valid ones."""
    return _REGISTRY.create(name, **options)


register_prefix_policy(ReconciledPolicy)
register_prefix_policy(PR48425Policy)
register_prefix_policy(PR48425RequeryPolicy)
register_prefix_policy(MaxPerGroupPolicy)
register_prefix_policy(TrimToMinPolicy)
