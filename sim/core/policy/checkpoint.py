"""Mamba checkpoint placement: where, during a request's prefill, extra Mamba states are saved
(``cache.mamba_checkpoint_policy``).

In vLLM 0.33's align mode (``retention_interval: 0``) a request leaves Mamba
states at only two places: the prompt's last block boundary
(``floor((P - 1) / B) * B``) and the *junction* (the deepest cached
full-attention prefix, when it is deeper than every Mamba state; vLLM keeps
that state so that the next request on the same prefix hits it). A later
request whose prefix branches anywhere else finds the full-attention blocks
but no state: the hit is unusable. A placement policy names extra positions
where the request saves its state as well.

``vllm`` (the default) is vLLM's placement exactly and is not an object at
all: :func:`create_checkpoint_policy` returns ``None`` and nothing changes
(byte-identical runs). Every other policy is a **what-if, not vLLM**
(``mirrors_vllm = False``; ``hybridsim verify`` refuses such a scenario).

What a save costs, whatever the policy: the scheduler ends a prefill chunk at
each extra position (vLLM's block-aligned split, as at the junction), so a
prompt takes up to one more engine step per save; the state's block is kept
with a cache entry once prefill moves past it, so it holds a page of the
shared pool until it is evicted (the eviction policies drop such *extra*
states before other live entries: :mod:`sim.core.policy.eviction`).

The contract (:class:`BaseCheckpointPolicy`): ``on_arrival`` hears every
request once, when it is added; ``positions`` answers at each admission that
looks the prefix up, from :class:`PrefixFacts` and the request, with token
positions; :func:`extra_state_positions` keeps those that are multiples of the
scheduler block size strictly between the resume point and the prompt's own
state (everything else is vLLM's already, or useless), sorted. A policy never
touches the pool.

Third-party policies come from the entry point group
``hybridsim.checkpoint_policies`` (a :class:`BaseCheckpointPolicy` subclass;
its constructor takes ``cache.mamba_checkpoint_options`` as keyword
arguments), as eviction policies do. Built-ins: ``branch_points``,
``every_block``, ``frequency``.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import ClassVar, Iterable, Mapping, Sequence

from sim.core.kv.hashing import BlockHash
from sim.core.registry import OptionValue, Registry
from sim.core.request import Request
from sim.core.tokens import Segment, StreamBlocksSegment

ENTRY_POINT_GROUP = "hybridsim.checkpoint_policies"
VLLM = "vllm"


@dataclass(frozen=True, slots=True)
class PrefixFacts:
    """What a placement policy knows at a request's admission.

    ``block_size``: the scheduler block size (a state can only be saved, and
    hit, at its multiples). ``block_hashes``: the chained hashes of the
    prompt's blocks at ``block_size`` up to ``prompt_state`` (block ``i``
    ends at ``(i + 1) * block_size``). ``fa_hit``: the deepest cached
    full-attention prefix (tokens; the independent lookup, capped at
    ``num_tokens - 1``). ``resume``: where the request resumes (local plus
    external hit). ``prompt_state``: where vLLM saves the prompt's own state,
    ``floor((P - 1) / block_size) * block_size``. ``junction``: vLLM's
    shared-prefix junction, where it saves a state anyway (0: none).
    """

    block_size: int
    block_hashes: Sequence[BlockHash]
    fa_hit: int
    resume: int
    prompt_state: int
    junction: int = 0


class BaseCheckpointPolicy:
    """Base class of the what-if placements: subclasses set ``name`` and implement :meth:`positions`.

    Options are constructor keyword arguments; validate them and raise
    ``ValueError`` naming the option.
    """

    name: ClassVar[str] = ""
    #: Only ``vllm`` (which is no object) mirrors vLLM; every policy object is a what-if.
    mirrors_vllm: ClassVar[bool] = False

    def on_arrival(self, request: Request, block_hashes: Sequence[BlockHash]) -> None:
        """``request`` was added; ``block_hashes`` as in :attr:`PrefixFacts.block_hashes`. Called once per request."""

    def positions(self, request: Request, facts: PrefixFacts) -> Iterable[int]:
        """Token positions at which ``request`` should save its Mamba state (filtered by the caller)."""
        raise NotImplementedError


def extra_state_positions(policy: BaseCheckpointPolicy, request: Request, facts: PrefixFacts) -> tuple[int, ...]:
    """``policy``'s positions that are multiples of ``facts.block_size`` strictly between
    ``facts.resume`` and ``facts.prompt_state``, other than the junction, sorted and distinct.

    Below the resume point a state would not be computed by this request;
    ``prompt_state`` and the junction vLLM saves anyway.
    """
    bs = facts.block_size
    lo, hi, junction = facts.resume, facts.prompt_state, facts.junction
    return tuple(sorted({p for p in policy.positions(request, facts) if lo < p < hi and p % bs == 0 and p != junction}))


def content_boundaries(segments: Sequence[Segment]) -> list[int]:
    """Where the prompt's content changes hands: the end offset of each segment.

    A run of trace hash blocks (:class:`StreamBlocksSegment`) counts as one
    segment of full blocks, ending where its partial last block (if any)
    begins, then that partial block: a conversation's next turn re-sends the
    full blocks and replaces the partial tail, so its prefix ends there.
    """
    out: list[int] = []
    offset = 0
    for seg in segments:
        if type(seg) is StreamBlocksSegment:
            full = (seg.length // seg.block) * seg.block
            if 0 < full < seg.length:
                out.append(offset + full)
        offset += seg.length
        out.append(offset)
    return out


class BranchPointsPolicy(BaseCheckpointPolicy):
    """Save where a later request is likely to branch off this one (a what-if, not vLLM).

    Marconi's speculative insertion (Pan et al., MLSys 2025) adapted to
    vLLM's pages. Rule: save at (1) the deepest cached full-attention prefix
    when it is deeper than the resume point (Marconi's branch point; it is
    vLLM's junction, so this adds a save only where vLLM keeps none: an
    admission through #48425's connector lookup), and (2) every content boundary the workload makes visible
    (:func:`content_boundaries`: the end of a shared system prompt, of a RAG
    document, of a conversation's earlier turn or of a trace's full hash
    blocks), floored to the block size. Cost: one save (a page held until
    evicted, and one more prefill chunk) per distinct boundary block; a
    prompt of ``s`` segments makes at most ``s`` extra saves.
    """

    name = "branch_points"

    def positions(self, request: Request, facts: PrefixFacts) -> Iterable[int]:
        bs = facts.block_size
        out = [b // bs * bs for b in content_boundaries(request.prompt)]
        if facts.fa_hit > facts.resume:
            out.append(facts.fa_hit // bs * bs)
        return out


def _positive_int(value: object, option: str, policy: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{policy}: option {option} must be a positive integer, got {value!r}")
    return value


class EveryBlockPolicy(BaseCheckpointPolicy):
    """Save at every block boundary of the prompt (a what-if, not vLLM): the memory-hungry upper bound.

    Rule: every ``stride``-th multiple of the block size (default 1: every
    one; positions ``k * stride * B``) between the resume point and the
    prompt's own state. Cost: one page per ``stride`` prompt blocks kept until
    evicted, and one prefill chunk per save (with ``stride`` 1 the prompt is
    prefilled a block a step). With an infinite pool and ``stride`` 1 every
    full-attention hit becomes usable; a larger stride loses less than
    ``stride`` blocks per hit (vLLM's ``retention_interval``, but every save
    placed, where vLLM keeps only those that fall on a chunk end).
    """

    name = "every_block"

    def __init__(self, stride: int = 1) -> None:
        self.stride = _positive_int(stride, "stride", self.name)

    def positions(self, request: Request, facts: PrefixFacts) -> Iterable[int]:
        step = facts.block_size * self.stride
        return range(facts.resume // step * step + step, facts.prompt_state, step)


class FrequencyPolicy(BaseCheckpointPolicy):
    """Save at a block boundary once its prefix has been seen ``k`` times (a what-if, not vLLM).

    Rule: every arriving request counts each of its prompt blocks' chained
    hashes (a hash names the whole prefix up to that block); at admission the
    request saves at every boundary whose prefix count, this request
    included, is at least ``k`` (default 2: from the second request on a
    prefix). Cost: one page and one prefill chunk per popular boundary; the
    counts of at most ``max_prefixes`` prefixes (default 1,000,000; the least
    recently counted go first) bound the policy's memory.
    """

    name = "frequency"

    def __init__(self, k: int = 2, max_prefixes: int = 1_000_000) -> None:
        self.k = _positive_int(k, "k", self.name)
        self.max_prefixes = _positive_int(max_prefixes, "max_prefixes", self.name)
        self._counts: OrderedDict[BlockHash, int] = OrderedDict()

    def on_arrival(self, request: Request, block_hashes: Sequence[BlockHash]) -> None:
        counts = self._counts
        for h in block_hashes:
            counts[h] = counts.get(h, 0) + 1
            counts.move_to_end(h)
        while len(counts) > self.max_prefixes:
            counts.popitem(last=False)

    def count(self, block_hash: BlockHash) -> int:
        """How many arrivals had the prefix ending in ``block_hash`` (while it is tracked)."""
        return self._counts.get(block_hash, 0)

    def positions(self, request: Request, facts: PrefixFacts) -> Iterable[int]:
        bs = facts.block_size
        k = self.k
        counts = self._counts
        return [(i + 1) * bs for i, h in enumerate(facts.block_hashes) if counts.get(h, 0) >= k]


_REGISTRY: Registry[BaseCheckpointPolicy] = Registry(
    BaseCheckpointPolicy,
    ENTRY_POINT_GROUP,
    "cache.mamba_checkpoint_policy",
    "checkpoint policy",
    options_key="cache.mamba_checkpoint_options",
)


def register_checkpoint_policy(cls: type[BaseCheckpointPolicy]) -> type[BaseCheckpointPolicy]:
    """Register a placement class in-process (usable as a decorator)."""
    return _REGISTRY.register(cls)


def checkpoint_policy_names() -> list[str]:
    """``vllm`` plus every built-in and installed placement, sorted."""
    return sorted({VLLM, *_REGISTRY.names()})


def builtin_checkpoint_policy_names() -> list[str]:
    """``vllm`` plus the placements registered in code (no installed plug-ins), sorted."""
    return sorted({VLLM, *_REGISTRY.builtin_names()})


def create_checkpoint_policy(
    name: str, options: Mapping[str, OptionValue] | None = None
) -> BaseCheckpointPolicy | None:
    """The placement called ``name`` with ``options``; ``None`` for ``vllm`` (nothing extra is saved).

    Unknown names, unknown options and bad values raise a ``ValueError`` naming
    ``cache.mamba_checkpoint_policy`` / ``cache.mamba_checkpoint_options``.
    """
    opts = dict(options or {})
    if name == VLLM:
        if opts:
            raise ValueError(
                f"cache.mamba_checkpoint_options: vllm takes no options (given: {', '.join(sorted(opts))})"
            )
        return None
    try:
        _REGISTRY.get_class(name)
    except ValueError:
        raise ValueError(
            f"cache.mamba_checkpoint_policy: unknown checkpoint policy {name!r}; "
            f"valid: {', '.join(checkpoint_policy_names())}"
        ) from None
    try:
        return _REGISTRY.create(name, **opts)
    except ValueError as exc:
        message = str(exc)
        prefix = "" if message.startswith("cache.mamba_checkpoint_options") else "cache.mamba_checkpoint_options: "
        raise ValueError(prefix + message) from None


def checkpoint_not_verifiable_reason(name: str) -> str | None:
    """Why a scenario with placement ``name`` cannot be verified against vLLM, or ``None`` for ``vllm``."""
    if name == VLLM:
        return None
    if _REGISTRY.get_class(name).mirrors_vllm:
        return None
    return (
        f"cache.mamba_checkpoint_policy: {name!r} is a what-if checkpoint placement, not vLLM "
        "(vLLM 0.33's align mode saves Mamba states only at the prompt's last block boundary and the junction)"
    )


for _cls in (BranchPointsPolicy, EveryBlockPolicy, FrequencyPolicy):
    register_checkpoint_policy(_cls)
